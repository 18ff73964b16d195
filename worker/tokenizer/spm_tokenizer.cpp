// SentencePiece-style tokenizer (gguf-spm) as llama.cpp's llm_tokenizer_spm_session: spaces
// escaped to U+2581, a space prefix at the start and after special tokens, greedy merging of
// the highest-scoring adjacent pair, byte fallback through <0xXX> tokens.
#include <queue>

#include "tokenizer/unicode.h"
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
  struct Symbol {
    int prev, next;
    size_t offset, n;
  };
  std::vector<Symbol> sym;
  for (size_t off = 0; off < text.size();) {
    const size_t n =
        std::min(text.size() - off, unicode::utf8_len(static_cast<uint8_t>(text[off])));
    const int idx = static_cast<int>(sym.size());
    sym.push_back(Symbol{idx - 1, off + n == text.size() ? -1 : idx + 1, off, n});
    off += n;
  }
  // Highest score first; among equal scores the leftmost pair.
  struct Bigram {
    float score;
    int left, right;
    size_t size;
  };
  auto cmp = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> queue(cmp);
  auto add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    const size_t size = a.n + b.n;
    const int32_t id = vocab_.find(std::string_view(text).substr(a.offset, size));
    if (id < 0) return;
    queue.push(Bigram{vocab_.score(id), l, r, size});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) add(i - 1, i);
  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(bg.left)];
    Symbol& r = sym[static_cast<size_t>(bg.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
    add(l.prev, bg.left);
    add(bg.left, l.next);
  }
  // Every merged symbol is a token (a pair is only queued when its text is one); single
  // characters without a token fall back to bytes.
  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece = std::string_view(text).substr(s.offset, s.n);
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
