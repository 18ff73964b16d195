#include "tokenizer/vocab.h"

#include <algorithm>
#include <stdexcept>

#include "gguf/gguf_file.h"

namespace worker {
namespace {

bool one_of(const std::string& s, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

// Token texts llama.cpp treats as end-of-generation (and forces to control type).
const std::initializer_list<std::string_view> kEogTexts = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "[e~["};
// FIM pad / repo / file-separator texts: llama.cpp adds them to the EOG set.
const std::initializer_list<std::string_view> kFimEogTexts = {
    "<|fim_pad|>",   "<fim-pad>",  "<fim_pad>", "<PAD>",      "[PAD]",       "<|fim_repo|>",
    "<|repo_name|>", "<fim-repo>", "<REPO>",    "<reponame>", "<|file_sep|>"};
// Other FIM texts: forced to control type.
const std::initializer_list<std::string_view> kFimTexts = {"<|fim_prefix|>",
                                                           "<fim-prefix>",
                                                           "<fim_prefix>",
                                                           "<PRE>",
                                                           "\xe2\x96\x81<PRE>",
                                                           "<|code_prefix|>",
                                                           "<|prefix|>",
                                                           "<|fim_suffix|>",
                                                           "<fim-suffix>",
                                                           "<fim_suffix>",
                                                           "<SUF>",
                                                           "\xe2\x96\x81<SUF>",
                                                           "<|code_suffix|>",
                                                           "<|suffix|>",
                                                           "<|fim_middle|>",
                                                           "<fim-middle>",
                                                           "<fim_middle>",
                                                           "<MID>",
                                                           "\xe2\x96\x81<MID>",
                                                           "<|code_middle|>",
                                                           "<|middle|>"};

bool in_list(const std::string& s, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), std::string_view(s)) != list.end();
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

std::optional<int64_t> opt_id(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  return static_cast<int64_t>(v->as_u64() & 0xFFFFFFFFu);
}

std::optional<bool> opt_bool(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  return v->as_bool();
}

}  // namespace

VocabSpec vocab_spec_from_gguf(const GgufFile& f) {
  VocabSpec s;
  if (!f.find("tokenizer.ggml.model")) {
    throw std::runtime_error("model file has no tokenizer (missing key tokenizer.ggml.model)");
  }
  s.model = f.get_string("tokenizer.ggml.model");
  s.pre = f.get_string("tokenizer.ggml.pre", "");
  if (!f.find("tokenizer.ggml.tokens")) {
    throw std::runtime_error("model file has no vocabulary (missing key tokenizer.ggml.tokens)");
  }
  s.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.find("tokenizer.ggml.scores")) {
    for (double d : f.get_float_array("tokenizer.ggml.scores"))
      s.scores.push_back(static_cast<float>(d));
    if (s.scores.size() < s.tokens.size()) {
      throw std::runtime_error(
          "tokenizer.ggml.scores has fewer entries than tokenizer.ggml.tokens");
    }
  }
  if (f.find("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) {
      s.token_types.push_back(static_cast<int32_t>(t));
    }
    if (s.token_types.size() < s.tokens.size()) {
      throw std::runtime_error(
          "tokenizer.ggml.token_type has fewer entries than tokenizer.ggml.tokens");
    }
  }
  if (f.find("tokenizer.ggml.merges")) s.merges = f.get_string_array("tokenizer.ggml.merges");
  s.bos_id = opt_id(f, "tokenizer.ggml.bos_token_id");
  s.eos_id = opt_id(f, "tokenizer.ggml.eos_token_id");
  s.eot_id = opt_id(f, "tokenizer.ggml.eot_token_id");
  s.eom_id = opt_id(f, "tokenizer.ggml.eom_token_id");
  s.unk_id = opt_id(f, "tokenizer.ggml.unknown_token_id");
  s.sep_id = opt_id(f, "tokenizer.ggml.seperator_token_id");
  s.pad_id = opt_id(f, "tokenizer.ggml.padding_token_id");
  s.add_bos = opt_bool(f, "tokenizer.ggml.add_bos_token");
  s.add_eos = opt_bool(f, "tokenizer.ggml.add_eos_token");
  s.add_space_prefix = opt_bool(f, "tokenizer.ggml.add_space_prefix");
  s.name = f.get_string("general.name", "");
  s.chat_template = f.get_string("tokenizer.chat_template", "");
  return s;
}

Vocab::Vocab(VocabSpec spec, bool spm) : spec_(std::move(spec)) {
  const size_t n = spec_.tokens.size();
  if (n == 0) throw std::runtime_error("tokenizer vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX))
    throw std::runtime_error("tokenizer vocabulary too large");
  text_.resize(n);
  attr_.assign(n, kAttrNormal);
  score_.assign(n, 0.0f);
  index_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    text_[i] = spec_.tokens[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : spec_.tokens[i];
    index_[text_[i]] = static_cast<int32_t>(i);
    if (i < spec_.scores.size()) score_[i] = spec_.scores[i];
    if (i < spec_.token_types.size()) {
      switch (static_cast<TokenType>(spec_.token_types[i])) {
        case TokenType::kNormal: attr_[i] = kAttrNormal; break;
        case TokenType::kUnknown: attr_[i] = kAttrUnknown; break;
        case TokenType::kControl: attr_[i] = kAttrControl; break;
        case TokenType::kUserDefined: attr_[i] = kAttrUserDefined; break;
        case TokenType::kUnused: attr_[i] = kAttrUnused; break;
        case TokenType::kByte: attr_[i] = kAttrByte; break;
        default: attr_[i] = 0; break;
      }
    }
    if (i < spec_.extra_attrs.size()) attr_[i] |= spec_.extra_attrs[i];
  }

  // Defaults as llama.cpp's loader; a default outside the vocabulary is dropped, a key
  // outside it is ignored.
  std::optional<int32_t> bos, eos, unk, eot, eom;
  if (spm) {
    bos = 1, eos = 2, unk = 0;
    add_bos_ = true;
    add_space_prefix_ = true;
    clean_spaces_ = false;
  } else {
    bos = 11, eos = 11;
    add_bos_ = spec_.pre == "llama3" || spec_.pre == "llama-v3" || spec_.pre == "llama-bpe";
    add_space_prefix_ = false;
    clean_spaces_ = !one_of(spec_.pre, {"qwen2", "deepseek-r1-qwen", "stablelm2", "deepseek-llm",
                                        "deepseek-coder", "deepseek-v3", "command-r"});
  }
  auto apply = [&](std::optional<int32_t>& id, const std::optional<int64_t>& key) {
    if (id && !valid(*id)) id.reset();
    if (key && *key < 0) id.reset();  // explicit "none" (in-memory specs)
    if (key && *key >= 0 && *key < static_cast<int64_t>(n)) id = static_cast<int32_t>(*key);
  };
  apply(bos, spec_.bos_id);
  apply(eos, spec_.eos_id);
  apply(unk, spec_.unk_id);
  apply(eot, spec_.eot_id);
  apply(eom, spec_.eom_id);
  if (spec_.add_bos) add_bos_ = *spec_.add_bos;
  if (spec_.add_eos) add_eos_ = *spec_.add_eos;
  if (spec_.add_space_prefix) add_space_prefix_ = *spec_.add_space_prefix;
  bos_ = bos, eos_ = eos, unk_ = unk;

  // Text-based detection of EOT/FIM/EOG tokens, as llama.cpp does for vocabularies whose
  // converter did not mark them.
  std::vector<int32_t> eog;
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = text_[i];
    const auto id = static_cast<int32_t>(i);
    if (in_list(t, kEogTexts)) {
      eog.push_back(id);
      attr_[i] |= kAttrControl;
    } else if (in_list(t, kFimEogTexts)) {
      eog.push_back(id);
      attr_[i] |= kAttrControl;
    } else if (in_list(t, kFimTexts)) {
      attr_[i] |= kAttrControl;
    }
    if ((attr_[i] & kAttrControl) && t.find("unused") != std::string::npos) attr_[i] |= kAttrUnused;
    if (t == "<|channel|>" || t == "<|message|>" || t == "<|start|>" || t == "<|constrain|>") {
      attr_[i] = kAttrUserDefined;
    }
  }
  for (const auto& id : {eos, eot, eom}) {
    if (id) eog.push_back(*id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  eog_ = std::move(eog);

  for (size_t i = 0; i < n; ++i) {
    if (attr_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      specials_.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int32_t a, int32_t b) { return text(a).size() > text(b).size(); });
  for (int32_t id : specials_) {
    const std::string& t = text(id);
    if (t.empty())
      special_first_byte_.fill(true);
    else
      special_first_byte_[static_cast<uint8_t>(t[0])] = true;
  }

  // llama.cpp strips whitespace to the right of phi-3's special tokens.
  std::string lname = spec_.name;
  std::transform(lname.begin(), lname.end(), lname.begin(),
                 [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; });
  if (lname.find("phi-3") != std::string::npos || lname.find("phi3") != std::string::npos) {
    for (int32_t id : specials_) attr_[static_cast<size_t>(id)] |= kAttrRstrip;
    if (int32_t id = find("</s>"); id >= 0) attr_[static_cast<size_t>(id)] |= kAttrRstrip;
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (int32_t id = find(t); id >= 0) attr_[static_cast<size_t>(id)] &= ~kAttrRstrip;
    }
  }
}

int32_t Vocab::find(std::string_view t) const {
  auto it = index_.find(t);
  return it == index_.end() ? -1 : it->second;
}

bool Vocab::is_eog(int32_t id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

std::vector<Fragment> Vocab::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back(Fragment{-1, 0, text.size()});
  if (std::none_of(text.begin(), text.end(),
                   [&](char c) { return special_first_byte_[static_cast<uint8_t>(c)]; })) {
    return frags;
  }
  for (int32_t special : specials_) {
    const uint32_t a = attr(special);
    if (!parse_special && (a & (kAttrControl | kAttrUnknown))) continue;
    const std::string& st = this->text(special);
    // Fragments are pieces of `text`: a special absent from it is in none of them.
    if (!st.empty() && text.find(st) == std::string_view::npos) continue;
    std::vector<Fragment> next;
    next.reserve(frags.size());
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t base = fr.offset;
      size_t len = fr.length;
      while (true) {
        const size_t match = text.substr(0, base + len).find(st, base);
        if (match == std::string_view::npos) {
          if (len > 0) next.push_back(Fragment{-1, base, len});
          break;
        }
        if (match > base) {
          size_t left_len = match - base;
          if (a & kAttrLstrip) {
            while (left_len > 0 && is_space(text[base + left_len - 1])) --left_len;
          }
          if (left_len > 0) next.push_back(Fragment{-1, base, left_len});
        }
        next.push_back(Fragment{special, match, st.size()});
        size_t right = match + st.size();
        size_t right_len = base + len - right;
        if (a & kAttrRstrip) {
          while (right_len > 0 && is_space(text[right])) ++right, --right_len;
        }
        base = right;
        len = right_len;
        if (len == 0) break;
      }
    }
    frags = std::move(next);
  }
  return frags;
}

}  // namespace worker
