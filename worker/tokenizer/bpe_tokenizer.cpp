// Byte-level BPE (gguf-bpe) as llama.cpp's llm_tokenizer_bpe_session, and the detokenizer
// shared by all vocabulary tokenizers.
#include <cstddef>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>

#include "tokenizer/bigram_merge.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizers.h"

namespace worker {
namespace {

// llama.cpp's clean_up_tokenization_spaces passes, done in place on the buffer with the
// same index arithmetic so that overlapping patterns resolve the same way.
void clean_spaces(std::string& text) {
  const auto n1 = static_cast<int64_t>(text.size());
  int64_t total = n1 ? 1 : 0;
  for (int64_t i = 1; i < n1; ++i) {  // " ?", " !", " .", " ," lose the space
    const char x = text[static_cast<size_t>(i)];
    if (text[static_cast<size_t>(i - 1)] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) {
      --total;
    }
    text[static_cast<size_t>(total++)] = x;
  }
  const int64_t n2 = total;
  total = n2 ? 1 : 0;
  for (int64_t i = 1; i < n2; ++i) {  // " ' " loses both spaces
    const char x = text[static_cast<size_t>(i)];
    if (x == '\'' && i + 1 < n2 && text[static_cast<size_t>(i - 1)] == ' ' &&
        text[static_cast<size_t>(i + 1)] == ' ') {
      --total;
      text[static_cast<size_t>(++i)] = '\0';
    }
    text[static_cast<size_t>(total++)] = x;
  }
  const int64_t n3 = total;
  total = n3 ? 1 : 0;
  for (int64_t i = 1; i < n3; ++i) {  // " 's", " 'm", " 're", " 've" lose the space
    const char x = text[static_cast<size_t>(i)];
    if (text[static_cast<size_t>(i - 1)] == ' ' && x == '\'' && i + 1 < n3) {
      const char x1 = text[static_cast<size_t>(i + 1)];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < n3) {
        const char x2 = text[static_cast<size_t>(i + 2)];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    text[static_cast<size_t>(total++)] = x;
  }
  text.resize(static_cast<size_t>(total));
}

}  // namespace

std::string VocabTokenizer::token_to_piece(int32_t id, bool special) const {
  if (!vocab_.valid(id)) {
    throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                            std::to_string(vocab_.size()) + ")");
  }
  const uint32_t a = vocab_.attr(id);
  if (!special && (a & (kAttrUnknown | kAttrControl))) return {};
  if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return vocab_.text(id);
  if (a & kAttrNormal) return normal_piece(id);
  if (a & kAttrByte) {
    const std::string& t = vocab_.text(id);
    if (t.size() >= 5) {
      const std::string hex = t.substr(3, 2);
      return std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
    }
    return {};
  }
  return {};
}

std::string VocabTokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  bool remove_space = vocab_.add_space_prefix();
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    out += piece;
  }
  if (vocab_.clean_spaces()) clean_spaces(out);
  return out;
}

BpeTokenizer::BpeTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec), false) {
  const auto pre = pre_tokenizer_from_name(vocab_.spec().pre);
  if (!pre) {
    throw std::runtime_error("unsupported BPE pre-tokenizer tokenizer.ggml.pre = '" +
                             vocab_.spec().pre + "' (supported: qwen2, llama-bpe, gpt-2, default)");
  }
  pre_ = *pre;
  ignore_merges_ = pre_ == PreTokenizer::kLlama3;
  init_ranks();
}

BpeTokenizer::BpeTokenizer(VocabSpec spec, std::string kind, PreTokenizer pre,
                           std::function<std::string(std::string_view)> normalizer)
    : VocabTokenizer(std::move(spec), false),
      kind_(std::move(kind)),
      pre_(pre),
      normalizer_(std::move(normalizer)) {
  init_ranks();
}

void BpeTokenizer::init_ranks() {
  const auto& merges = vocab_.spec().merges;
  if (merges.empty())
    throw std::runtime_error("BPE vocabulary has no merges (tokenizer.ggml.merges)");
  ranks_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    // Split at the first space after the first character, as llama.cpp does; a line
    // without one maps to ("", "").
    const size_t pos = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    std::pair<std::string, size_t> key{"", 0};
    if (pos != std::string::npos) key = {m.substr(0, pos) + m.substr(pos + 1), pos};
    ranks_.emplace(std::move(key), static_cast<int>(i));
  }
}

int BpeTokenizer::rank(std::string_view pair, size_t split) const {
  auto it = ranks_.find(MergeKey{pair, split});
  return it == ranks_.end() ? -1 : it->second;
}

std::string BpeTokenizer::normal_piece(int32_t id) const {
  const std::string& t = vocab_.text(id);
  std::string out;
  for (uint32_t cp : unicode::decode_lenient(t)) {
    const int b = unicode::unicode_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {  // not a byte image: llama.cpp writes a marker with the bytes and the token text
      std::string utf8;
      unicode::append_utf8(utf8, cp);
      out += "[UNK_BYTE_0x";
      for (char c : utf8) {
        char buf[3];
        std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
        out += buf;
      }
      out += t + "]";
    }
  }
  return out;
}

void BpeTokenizer::tokenize_word(const std::string& raw_word, std::vector<int32_t>& out) const {
  if (raw_word.size() > kCacheWordBytes) return merge_word(raw_word, out);
  {
    std::lock_guard lock(cache_mu_);
    if (auto it = cache_.find(raw_word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(raw_word, out);
  std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  std::lock_guard lock(cache_mu_);
  if (cache_.size() >= kCacheWords) cache_.clear();
  cache_.emplace(raw_word, std::move(ids));
}

void BpeTokenizer::merge_word(const std::string& raw_word, std::vector<int32_t>& out) const {
  std::string word;
  word.reserve(raw_word.size() * 2);
  for (char c : raw_word) word += unicode::byte_to_unicode(static_cast<uint8_t>(c));

  if (ignore_merges_) {
    if (int32_t id = vocab_.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  // Lowest merge rank first.
  const auto merge_rank = [this](std::string_view pair, size_t split) -> std::optional<int> {
    const int rk = rank(pair, split);
    return rk >= 0 ? std::optional<int>(rk) : std::nullopt;
  };
  for (std::string_view piece : merge_bigrams(word, merge_rank, std::less<int>())) {
    if (int32_t id = vocab_.find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // No token for the merged text: llama.cpp looks up each raw byte as a one-byte token.
    for (char c : piece) {
      if (int32_t id = vocab_.find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && vocab_.add_bos() && vocab_.bos()) out.push_back(*vocab_.bos());
  for (const Fragment& f : vocab_.partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    std::string_view raw = text.substr(f.offset, f.length);
    std::string normalized;
    if (normalizer_) {
      normalized = normalizer_(raw);
      raw = normalized;
    }
    for (const std::string& word : pre_tokenize(raw, pre_)) tokenize_word(word, out);
  }
  if (add_special && vocab_.add_eos() && vocab_.eos()) out.push_back(*vocab_.eos());
  return out;
}

}  // namespace worker
