#pragma once
// Code point classification and conversions for the tokenizers. The flag grouping follows
// llama.cpp's (general categories folded into \p{L}, \p{N}, ... flags) because token ids must
// equal llama.cpp's.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace worker::unicode {

enum Flag : uint16_t {
  kUndefined = 0x01,    // Cn
  kNumber = 0x02,       // \p{N}
  kLetter = 0x04,       // \p{L}
  kSeparator = 0x08,    // \p{Z}
  kMark = 0x10,         // \p{M}
  kPunct = 0x20,        // \p{P}
  kSymbol = 0x40,       // \p{S}
  kControl = 0x80,      // \p{C}
  kWhitespace = 0x100,  // White_Space property (\s)
};

// Flags of a code point. Every code point has at least one flag (unassigned ones and values
// beyond U+10FFFF get kUndefined, as in llama.cpp), which the splitters rely on.
uint16_t flags(uint32_t cp);
inline bool is_letter(uint32_t cp) {
  return flags(cp) & kLetter;
}
inline bool is_number(uint32_t cp) {
  return flags(cp) & kNumber;
}
inline bool is_whitespace(uint32_t cp) {
  return flags(cp) & kWhitespace;
}

// Byte length of the UTF-8 sequence a lead byte announces (1 for continuation/invalid bytes),
// as llama.cpp's unicode_len_utf8.
size_t utf8_len(uint8_t lead);

// Decodes like llama.cpp's unicode_cpts_from_utf8: a malformed sequence gives U+FFFD and
// skips one byte; no overlong/surrogate checks (so the bytes re-encode the same way).
std::vector<uint32_t> decode_lenient(std::string_view s);
// UTF-8 encoding; values beyond U+10FFFF are written as U+FFFD.
void append_utf8(std::string& out, uint32_t cp);
std::string to_utf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);

// GPT-2 byte-level mapping: every byte to a printable code point (as UTF-8) and back.
const std::string& byte_to_unicode(uint8_t b);
// Returns -1 when `cp` is not the image of a byte.
int unicode_to_byte(uint32_t cp);

// Canonical combining class (0 for starters).
uint8_t combining_class(uint32_t cp);
// Unicode Normalization Form C. Invalid UTF-8 bytes become U+FFFD.
std::string nfc(std::string_view s);

}  // namespace worker::unicode
