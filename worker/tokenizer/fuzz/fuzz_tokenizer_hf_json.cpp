// libFuzzer target: arbitrary bytes as a tokenizer.json. Loading must either work or throw
// std::runtime_error with a message; a loaded tokenizer must encode a fixed text safely.
#include <cstdint>
#include <stdexcept>

#include "fuzz_common.h"
#include "tokenizer/vocab_tokenizers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view content(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = worker::load_hf_json_tokenizer_from_string(content, {}, "<fuzz>");
    worker::fuzz::exercise(*tok, "Hello wörld <|im_start|> 123 \xF0\x9F\x98\x80", false, true);
    worker::fuzz::exercise(*tok, content, true, false);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
