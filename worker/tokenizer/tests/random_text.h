#pragma once
// Random test strings for tokenizer comparisons: ASCII words, CJK, emoji (with ZWJ and skin
// tones), combining marks, whitespace runs, digits, code, contractions and odd sequences.
// Code points come only from blocks assigned long before Unicode 15.0, so that our tables
// (UCD 15.0) and llama.cpp's (newer) classify them the same way.
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace worker::test {

class RandomText {
 public:
  explicit RandomText(uint64_t seed) : rng_(seed) {}

  std::string next(size_t max_pieces = 12) {
    std::string s;
    const size_t pieces = 1 + pick(max_pieces);
    for (size_t i = 0; i < pieces; ++i) piece(s);
    return s;
  }

  // Same, with special-token texts spliced in.
  std::string next_with_specials(const std::vector<std::string>& specials) {
    std::string s;
    const size_t pieces = 1 + pick(8);
    for (size_t i = 0; i < pieces; ++i) {
      if (pick(3) == 0) {
        s += specials[pick(specials.size())];
      } else {
        piece(s);
      }
    }
    return s;
  }

 private:
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  uint32_t in(uint32_t a, uint32_t b) {
    return std::uniform_int_distribution<uint32_t>(a, b)(rng_);
  }
  void cp(std::string& s, uint32_t c) { unicode::append_utf8(s, c); }

  void piece(std::string& s) {
    static const char* kWords[] = {"the",   "Hello", "world", "GPU",  "token",  "isn", "don",
                                   "LLaMA", "über",  "naïve", "café", "Straße", "a",   "I"};
    static const char* kCode[] = {"int main() {\n  return 0;\n}",
                                  "for (i = 0; i < n; ++i)",
                                  "x->y",
                                  "a == b && c != d",
                                  "#include <stdio.h>",
                                  "def f(x):\n\treturn x**2",
                                  "if(a){b;}else{c;}",
                                  "<|",
                                  "|>",
                                  "```",
                                  "$ ls -la ~/",
                                  "{\"k\": [1, 2.5e-3]}"};
    static const char* kContractions[] = {"'s", "'t",  "'re", "'ve", "'m", "'ll", "'d",
                                          "'S", "'LL", "'Re", "'x",  "''", "n't"};
    static const uint32_t kSpaces[] = {' ',    ' ',    ' ',    '\t', '\n', '\r', 0xA0,
                                       0x3000, 0x2009, 0x200B, 0x0B, 0x0C, 0x85, 0x2028};
    switch (pick(14)) {
      case 0:
      case 1:
        if (pick(2)) s += ' ';
        s += kWords[pick(std::size(kWords))];
        break;
      case 2:  // CJK ideographs, kana, hangul
        for (size_t n = 1 + pick(6); n > 0; --n) {
          switch (pick(3)) {
            case 0: cp(s, in(0x4E00, 0x9FA5)); break;
            case 1: cp(s, in(0x3041, 0x3096)); break;
            default: cp(s, in(0xAC00, 0xD7A3)); break;
          }
        }
        break;
      case 3:  // emoji, ZWJ sequences, skin tones, flags
        switch (pick(4)) {
          case 0: cp(s, in(0x1F600, 0x1F64F)); break;
          case 1:
            cp(s, 0x1F468);
            cp(s, 0x200D);
            cp(s, 0x1F469);
            cp(s, 0x200D);
            cp(s, 0x1F467);
            break;
          case 2:
            cp(s, 0x1F44D);
            cp(s, in(0x1F3FB, 0x1F3FF));
            break;
          default:
            cp(s, 0x1F1FA);
            cp(s, 0x1F1F8);
            break;
        }
        break;
      case 4:  // letters with combining marks (NFD forms, stacked marks)
        for (size_t n = 1 + pick(4); n > 0; --n) {
          cp(s, in('a', 'z'));
          for (size_t m = pick(3); m > 0; --m) cp(s, in(0x300, 0x36F));
        }
        break;
      case 5:  // whitespace runs
        for (size_t n = 1 + pick(6); n > 0; --n) cp(s, kSpaces[pick(std::size(kSpaces))]);
        break;
      case 6:  // digits, ASCII and others
        for (size_t n = 1 + pick(9); n > 0; --n) {
          cp(s, pick(5) ? in('0', '9') : (pick(2) ? in(0x660, 0x669) : in(0xFF10, 0xFF19)));
        }
        break;
      case 7: s += kCode[pick(std::size(kCode))]; break;
      case 8: s += kContractions[pick(std::size(kContractions))]; break;
      case 9:  // other scripts: Greek, Cyrillic, Arabic, Devanagari, Thai
        for (size_t n = 1 + pick(6); n > 0; --n) {
          switch (pick(5)) {
            case 0: cp(s, in(0x3B1, 0x3C9)); break;
            case 1: cp(s, in(0x410, 0x44F)); break;
            case 2: cp(s, in(0x627, 0x64A)); break;
            case 3:
              cp(s, in(0x915, 0x939));
              if (pick(2)) cp(s, 0x94D);
              break;
            default: cp(s, in(0xE01, 0xE2E)); break;
          }
        }
        break;
      case 10:  // ASCII punctuation and symbols, Latin-1 and general punctuation
        for (size_t n = 1 + pick(5); n > 0; --n) {
          switch (pick(3)) {
            case 0: cp(s, in(0x21, 0x2F)); break;
            case 1: cp(s, in(0xA1, 0xBF)); break;
            default: cp(s, in(0x2010, 0x2027)); break;
          }
        }
        break;
      case 11:  // odd sequences: controls, U+FFFD, BOM, private use, noncharacter-ish
        switch (pick(6)) {
          case 0: cp(s, in(1, 8)); break;
          case 1: cp(s, 0xFFFD); break;
          case 2: cp(s, 0xFEFF); break;
          case 3: cp(s, in(0xE000, 0xE0FF)); break;
          case 4: cp(s, 0x7F); break;
          default: cp(s, 0x2581); break;  // SentencePiece's space mark itself
        }
        break;
      case 12:  // random printable ASCII
        for (size_t n = 1 + pick(10); n > 0; --n) cp(s, in(0x20, 0x7E));
        break;
      default:  // Latin-1 and Latin Extended letters
        for (size_t n = 1 + pick(6); n > 0; --n) cp(s, pick(2) ? in(0xC0, 0xFF) : in(0x100, 0x17F));
        break;
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace worker::test
