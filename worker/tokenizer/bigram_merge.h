#pragma once
// The merge loop shared by the BPE and SPM tokenizers (llama.cpp's llm_tokenizer_bpe_session
// and llm_tokenizer_spm_session): split a text into UTF-8 characters, then keep joining the
// best adjacent pair until no pair qualifies. The two differ only in what makes a pair
// qualify and which pair is best (BPE: the lowest merge rank; SPM: the highest token score).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <queue>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tokenizer/unicode.h"

namespace worker {

// `priority(pair, split)` is called for two adjacent symbols whose joined text is `pair`,
// the left one being pair.substr(0, split); it returns std::nullopt when they may not be
// joined. `better(a, b)` is true when priority a is merged before b; among equal priorities
// the leftmost pair goes first. Returns the final symbols, in order. A truncated UTF-8
// sequence at the end of `text` becomes a shorter symbol, never reading past the end.
template <typename PriorityFn, typename Better>
std::vector<std::string_view> merge_bigrams(std::string_view text, PriorityFn priority,
                                            Better better) {
  using Priority = typename std::invoke_result_t<PriorityFn&, std::string_view, size_t>::value_type;
  struct Symbol {
    int prev, next;
    size_t offset, n;  // n == 0: merged into its left neighbour
  };
  std::vector<Symbol> sym;
  for (size_t off = 0; off < text.size();) {
    const size_t n =
        std::min(text.size() - off, unicode::utf8_len(static_cast<uint8_t>(text[off])));
    const int idx = static_cast<int>(sym.size());
    sym.push_back(Symbol{idx - 1, off + n == text.size() ? -1 : idx + 1, off, n});
    off += n;
  }

  struct Bigram {
    Priority priority;
    int left, right;
    size_t left_n, right_n;  // the sides' lengths when queued, to spot stale entries
  };
  // priority_queue puts the "largest" on top: a ranks below b when b is better, or equal
  // and further left. (== rather than "neither better", so a NaN score orders as before.)
  auto after = [&better](const Bigram& a, const Bigram& b) {
    return better(b.priority, a.priority) || (a.priority == b.priority && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(after)> queue(after);
  auto add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    if (auto p = priority(text.substr(a.offset, a.n + b.n), a.n)) {
      queue.push(Bigram{*p, l, r, a.n, b.n});
    }
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) add(i - 1, i);
  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(bg.left)];
    Symbol& r = sym[static_cast<size_t>(bg.right)];
    // Stale: a side was merged away or grew since the pair was queued. A symbol only grows
    // by absorbing its right neighbour, so equal lengths mean the same two texts.
    if (l.n == 0 || r.n == 0 || l.n != bg.left_n || r.n != bg.right_n || l.next != bg.right) {
      continue;
    }
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
    add(l.prev, bg.left);
    add(bg.left, l.next);
  }

  std::vector<std::string_view> pieces;
  for (const Symbol& s : sym) {
    if (s.n != 0) pieces.push_back(text.substr(s.offset, s.n));
  }
  return pieces;
}

}  // namespace worker
