#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

namespace worker {
namespace {

using unicode::flags;
using unicode::kLetter;
using unicode::kNumber;
using unicode::kPunct;
using unicode::kWhitespace;

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

// Walks one fragment [ini, end) of the code points, emitting word lengths. Positions outside
// the fragment read as "out of range" (flags 0), which is how the lookaheads of the regexes
// stop at fragment ends.
class FragmentCursor {
 public:
  FragmentCursor(const std::vector<uint32_t>& cps, size_t ini, size_t end, std::vector<size_t>& out)
      : cps_(cps), ini_(ini), end_(end), prev_(ini), out_(out) {}

  uint32_t cp(size_t pos) const { return pos >= ini_ && pos < end_ ? cps_[pos] : kOutOfRange; }
  uint16_t fl(size_t pos) const { return pos >= ini_ && pos < end_ ? flags(cps_[pos]) : 0; }
  // Ends the current word at `end`; returns its length.
  size_t emit(size_t end) {
    const size_t len = end - prev_;
    if (len > 0) out_.push_back(len);
    prev_ = end;
    return len;
  }
  size_t end() const { return end_; }

 private:
  const std::vector<uint32_t>& cps_;
  size_t ini_, end_, prev_;
  std::vector<size_t>& out_;
};

uint32_t ascii_lower(uint32_t c) {
  return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

// 's 't 'm 'd 're 've 'll at `pos` (optionally case-insensitive); returns the match length.
size_t contraction_len(const FragmentCursor& f, size_t pos, bool ignore_case) {
  if (f.cp(pos) != '\'' || pos + 1 >= f.end()) return 0;
  auto low = [&](uint32_t c) { return ignore_case ? ascii_lower(c) : c; };
  const uint32_t n1 = low(f.cp(pos + 1));
  if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
  if (pos + 2 < f.end()) {
    const uint32_t n2 = low(f.cp(pos + 2));
    if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return 3;
  }
  return 0;
}

template <typename Fn>
std::vector<size_t> for_each_fragment(const std::vector<uint32_t>& cps,
                                      const std::vector<size_t>& frags, Fn fn) {
  std::vector<size_t> out;
  out.reserve(frags.size());
  size_t start = 0;
  for (size_t len : frags) {
    FragmentCursor f(cps, start, start + len, out);
    fn(f, start, start + len);
    start += len;
  }
  return out;
}

// [class]+ as a regex split: runs of matching code points and the gaps between them.
template <typename Pred>
std::vector<size_t> split_runs(const std::vector<uint32_t>& cps, const std::vector<size_t>& frags,
                               Pred match) {
  return for_each_fragment(cps, frags, [&](FragmentCursor& f, size_t ini, size_t end) {
    size_t pos = ini;
    while (pos < end) {
      const bool m = match(cps[pos]);
      while (pos < end && match(cps[pos]) == m) ++pos;
      f.emit(pos);
    }
  });
}

// [0-9][0-9][0-9]: leftmost non-overlapping triples of ASCII digits.
std::vector<size_t> split_digit_triples(const std::vector<uint32_t>& cps,
                                        const std::vector<size_t>& frags) {
  auto digit = [&](size_t p) { return cps[p] >= '0' && cps[p] <= '9'; };
  return for_each_fragment(cps, frags, [&](FragmentCursor& f, size_t ini, size_t end) {
    size_t pos = ini;
    while (pos + 3 <= end) {
      if (digit(pos) && digit(pos + 1) && digit(pos + 2)) {
        f.emit(pos);
        f.emit(pos + 3);
        pos += 3;
      } else {
        ++pos;
      }
    }
    f.emit(end);
  });
}

// The ASCII part of llama.cpp's collapsed \p{P} class plus the literal $+<=>^~| of the
// default pre-tokenizer's first regex.
bool default_punct(uint32_t c) {
  if (c < 128) {
    switch (c) {
      case '!':
      case '"':
      case '#':
      case '%':
      case '&':
      case '\'':
      case '(':
      case ')':
      case '*':
      case ',':
      case '-':
      case '.':
      case '/':
      case ':':
      case ';':
      case '?':
      case '@':
      case '[':
      case '\\':
      case ']':
      case '_':
      case '{':
      case '}':
      case '$':
      case '+':
      case '<':
      case '=':
      case '>':
      case '^':
      case '~':
      case '|': return true;
      default: return false;
    }
  }
  const uint16_t fl = flags(c);
  return !(fl & kWhitespace) && (fl & kPunct);
}

bool default_number(uint32_t c) {
  if (c < 128) return c >= '0' && c <= '9';
  const uint16_t fl = flags(c);
  return !(fl & kWhitespace) && (fl & kNumber);
}

}  // namespace

std::vector<size_t> split_gpt2(const std::vector<uint32_t>& cps, const std::vector<size_t>& frags) {
  return for_each_fragment(cps, frags, [](FragmentCursor& f, size_t ini, size_t end) {
    for (size_t pos = ini; pos < end;) {
      const uint32_t c = f.cp(pos);
      const uint16_t fl = f.fl(pos);
      if (const size_t n = contraction_len(f, pos, false); n > 0) {
        pos += f.emit(pos + n);
        continue;
      }
      // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space joins the class run
      // that follows it.
      const uint16_t fl2 = c == ' ' ? f.fl(pos + 1) : fl;
      if (fl2 & kLetter) {
        pos += (c == ' ');
        while (f.fl(pos) & kLetter) ++pos;
        f.emit(pos);
        continue;
      }
      if (fl2 & kNumber) {
        pos += (c == ' ');
        while (f.fl(pos) & kNumber) ++pos;
        f.emit(pos);
        continue;
      }
      auto other = [](uint16_t x) { return x != 0 && !(x & (kWhitespace | kLetter | kNumber)); };
      if (other(fl2)) {
        pos += (c == ' ');
        while (other(f.fl(pos))) ++pos;
        f.emit(pos);
        continue;
      }
      size_t n_ws = 0;
      while (f.fl(pos + n_ws) & kWhitespace) ++n_ws;
      if (n_ws > 1 && f.cp(pos + n_ws) != kOutOfRange) {  // \s+(?!\S): leave one for the next
        pos += n_ws - 1;
        f.emit(pos);
        continue;
      }
      if (n_ws > 0) {
        pos += n_ws;
        f.emit(pos);
        continue;
      }
      f.emit(++pos);
    }
  });
}

std::vector<size_t> split_llama3(const std::vector<uint32_t>& cps, const std::vector<size_t>& frags,
                                 bool digits_by_three) {
  return for_each_fragment(cps, frags, [&](FragmentCursor& f, size_t ini, size_t end) {
    for (size_t pos = ini; pos < end;) {
      const uint32_t c = f.cp(pos);
      const uint16_t fl = f.fl(pos);
      if (const size_t n = contraction_len(f, pos, true); n > 0) {
        pos += f.emit(pos + n);
        continue;
      }
      // [^\r\n\p{L}\p{N}]?\p{L}+
      if (!(c == '\r' || c == '\n' || (fl & kNumber))) {
        if ((fl & kLetter) || (f.fl(pos + 1) & kLetter)) {
          ++pos;
          while (f.fl(pos) & kLetter) ++pos;
          f.emit(pos);
          continue;
        }
      }
      if (fl & kNumber) {
        if (digits_by_three) {  // \p{N}{1,3}
          size_t ini_run = pos;
          while (f.fl(pos) & kNumber) {
            if (++pos - ini_run >= 3) {
              f.emit(pos);
              ini_run = pos;
            }
          }
          f.emit(pos);
        } else {  // \p{N}
          f.emit(++pos);
        }
        continue;
      }
      // " ?[^\s\p{L}\p{N}]+[\r\n]*". The first test looks at the current code point's flags
      // (always non-zero in range), as llama.cpp does.
      const uint16_t fl2 = c == ' ' ? f.fl(pos + 1) : fl;
      if (!(fl2 & (kWhitespace | kLetter | kNumber)) && fl != 0) {
        pos += (c == ' ');
        auto other = [](uint16_t x) { return x != 0 && !(x & (kWhitespace | kLetter | kNumber)); };
        while (other(f.fl(pos))) ++pos;
        while (f.cp(pos) == '\r' || f.cp(pos) == '\n') ++pos;
        f.emit(pos);
        continue;
      }
      size_t n_ws = 0;
      size_t last_rn_end = 0;
      while (f.fl(pos + n_ws) & kWhitespace) {
        const uint32_t c2 = f.cp(pos + n_ws);
        if (c2 == '\r' || c2 == '\n') last_rn_end = pos + n_ws + 1;
        ++n_ws;
      }
      if (last_rn_end > 0) {  // \s*[\r\n]+
        pos = last_rn_end;
        f.emit(pos);
        continue;
      }
      if (n_ws > 1 && f.cp(pos + n_ws) != kOutOfRange) {  // \s+(?!\S)
        pos += n_ws - 1;
        f.emit(pos);
        continue;
      }
      if (n_ws > 0) {  // \s+
        pos += n_ws;
        f.emit(pos);
        continue;
      }
      f.emit(++pos);
    }
  });
}

std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name) {
  if (name.empty() || name == "default") return PreTokenizer::kDefault;
  if (name == "gpt-2" || name == "gpt2" || name == "phi-2" || name == "mpt" || name == "olmo") {
    return PreTokenizer::kGpt2;
  }
  if (name == "llama3" || name == "llama-v3" || name == "llama-bpe" || name == "smaug-bpe" ||
      name == "dbrx") {
    return PreTokenizer::kLlama3;
  }
  if (name == "qwen2" || name == "deepseek-r1-qwen" || name == "stablelm2") {
    return PreTokenizer::kQwen2;
  }
  return std::nullopt;
}

std::optional<PreTokenizer> pre_tokenizer_from_regex(std::string_view pattern) {
  if (pattern ==
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+") {
    return PreTokenizer::kQwen2;
  }
  if (pattern ==
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+") {
    return PreTokenizer::kLlama3;
  }
  if (pattern ==
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+") {
    return PreTokenizer::kGpt2;
  }
  return std::nullopt;
}

const char* pre_tokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kDefault: return "default";
    case PreTokenizer::kGpt2: return "gpt2";
    case PreTokenizer::kLlama3: return "llama3";
    case PreTokenizer::kQwen2: return "qwen2";
  }
  return "?";
}

std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer p) {
  const std::vector<uint32_t> cps = unicode::decode_lenient(text);
  std::vector<size_t> frags{cps.size()};
  switch (p) {
    case PreTokenizer::kDefault:
      frags = split_runs(cps, frags, default_punct);
      frags = split_gpt2(cps, frags);
      frags = split_runs(cps, frags, default_number);
      frags = split_digit_triples(cps, frags);
      break;
    case PreTokenizer::kGpt2: frags = split_gpt2(cps, frags); break;
    case PreTokenizer::kLlama3: frags = split_llama3(cps, frags, true); break;
    case PreTokenizer::kQwen2: frags = split_llama3(cps, frags, false); break;
  }
  std::vector<std::string> words;
  words.reserve(frags.size());
  size_t start = 0;
  for (size_t len : frags) {
    words.push_back(unicode::to_utf8(cps, start, start + len));
    start += len;
  }
  return words;
}

}  // namespace worker
