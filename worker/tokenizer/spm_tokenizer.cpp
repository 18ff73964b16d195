// SentencePiece-style tokenizer (gguf-spm) as llama.cpp's llm_tokenizer_spm_session: spaces
// escaped to U+2581, a space prefix at the start and after special tokens, greedy merging of
// the highest-scoring adjacent pair, byte fallback through <0xXX> tokens.
#include <functional>
#include <optional>

#include "tokenizer/bigram_merge.h"
#include "tokenizer/vocab_tokenizers.h"

namespace worker {
namespace {

constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace

SpmTokenizer::SpmTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec), true) {}

std::string SpmTokenizer::normal_piece(int32_t id) const {
  return replace_all(vocab_.text(id), kSpaceMark, " ");
}

void SpmTokenizer::push_bytes(std::string_view s, std::vector<int32_t>& out) const {
  static const char* hex = "0123456789ABCDEF";
  for (char c : s) {
    const auto b = static_cast<uint8_t>(c);
    const char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
    int32_t id = vocab_.find(name);
    if (id < 0) id = vocab_.find(std::string(1, c));
    // llama.cpp aborts here; a vocabulary without byte tokens gets UNK (or nothing).
    if (id < 0 && vocab_.unk()) id = *vocab_.unk();
    if (id >= 0) out.push_back(id);
  }
}

void SpmTokenizer::tokenize_text(const std::string& text, std::vector<int32_t>& out) const {
  // Highest score first; a pair qualifies only when its joined text is a token.
  const auto merge_score = [this](std::string_view pair, size_t) -> std::optional<float> {
    const int32_t id = vocab_.find(pair);
    return id >= 0 ? std::optional<float>(vocab_.score(id)) : std::nullopt;
  };
  // Every merged symbol is a token; single characters without a token fall back to bytes.
  for (std::string_view piece : merge_bigrams(text, merge_score, std::greater<float>())) {
    if (int32_t id = vocab_.find(piece); id >= 0) {
      out.push_back(id);
    } else {
      push_bytes(piece, out);
    }
  }
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && vocab_.add_bos() && vocab_.bos()) out.push_back(*vocab_.bos());
  bool prev_special = true;  // the text start counts as "after a special token"
  for (const Fragment& f : vocab_.partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string piece;
    if (vocab_.add_space_prefix() && prev_special) piece = " ";
    piece.append(text.substr(f.offset, f.length));
    tokenize_text(replace_all(piece, " ", kSpaceMark), out);
    prev_special = false;
  }
  if (add_special && vocab_.add_eos() && vocab_.eos()) out.push_back(*vocab_.eos());
  return out;
}

}  // namespace worker
