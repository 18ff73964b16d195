#pragma once
// UTF-8 helpers shared by the tokenizers, the streaming decoder and request validation.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace worker::utf8 {

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool is_valid(std::string_view s);
// Number of Unicode scalar values; nullopt when `s` is not valid UTF-8.
std::optional<size_t> count_scalars(std::string_view s);
// Decode into code points; invalid bytes become U+FFFD (one per bad byte).
std::vector<uint32_t> decode_lossy(std::string_view s);
void append(std::string& out, uint32_t cp);
// Length of the longest prefix of `s` that ends on a complete UTF-8 sequence boundary
// (an incomplete trailing sequence is excluded; invalid bytes count as complete).
size_t complete_prefix_len(std::string_view s);

}  // namespace worker::utf8
