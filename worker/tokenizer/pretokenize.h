#pragma once
// Pre-tokenizers of byte-level BPE vocabularies: hand-written equivalents of the split
// regexes llama.cpp uses for `tokenizer.ggml.pre` (no std::regex). They reproduce llama.cpp's
// own hand-written splitters, quirks included, since ids must equal llama.cpp's.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace worker {

enum class PreTokenizer {
  kDefault,  // llama.cpp's fallback sequence of four regexes
  kGpt2,     // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
  kLlama3,   // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
  kQwen2,    // as llama3 but \p{N} (single digits)
};

// Maps a `tokenizer.ggml.pre` value to a pre-tokenizer; nullopt when unsupported.
std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name);
// Maps a tokenizer.json Split regex to a pre-tokenizer; nullopt when not one we implement.
std::optional<PreTokenizer> pre_tokenizer_from_regex(std::string_view pattern);
const char* pre_tokenizer_name(PreTokenizer p);

// Splits `text` into words (UTF-8; invalid bytes become U+FFFD as in llama.cpp).
std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer p);

// Lower-level form: splits the code points [0, cps.size()) given as consecutive fragment
// lengths into finer fragment lengths.
std::vector<size_t> split_gpt2(const std::vector<uint32_t>& cps, const std::vector<size_t>& frags);
std::vector<size_t> split_llama3(const std::vector<uint32_t>& cps, const std::vector<size_t>& frags,
                                 bool digits_by_three);

}  // namespace worker
