// libFuzzer target: hostile vocabularies. The input is split at NUL bytes into sections:
// tokens (newline-separated), merges (newline-separated), token types (one byte each) and a
// text. Building a BPE or SPM tokenizer from them must either work or throw
// std::runtime_error; encoding the text must never crash.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/vocab_tokenizers.h"

namespace {

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(sep, pos);
    if (end == std::string_view::npos) end = s.size();
    out.emplace_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const auto sections =
      split(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), '\0');
  worker::VocabSpec spec;
  spec.tokens = split(sections[0], '\n');
  if (sections.size() > 1) spec.merges = split(sections[1], '\n');
  if (sections.size() > 2) {
    for (char c : sections[2]) spec.token_types.push_back(static_cast<uint8_t>(c) % 8);
  }
  if (spec.token_types.size() < spec.tokens.size()) spec.token_types.clear();
  const std::string text = sections.size() > 3 ? sections[3] : "hello world";
  static const char* pres[] = {"qwen2", "llama-bpe", "gpt-2", "default"};
  spec.pre = pres[(mode >> 3) & 3];
  spec.name = (mode & 32) ? "phi3" : "fuzz";
  for (size_t i = 0; i < spec.tokens.size(); ++i) spec.scores.push_back(static_cast<float>(i % 7));
  try {
    std::unique_ptr<worker::Tokenizer> tok;
    if (mode & 1) {
      spec.model = "llama";
      tok = std::make_unique<worker::SpmTokenizer>(std::move(spec));
    } else {
      spec.model = "gpt2";
      tok = std::make_unique<worker::BpeTokenizer>(std::move(spec));
    }
    worker::fuzz::exercise(*tok, text, mode & 2, mode & 4);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
