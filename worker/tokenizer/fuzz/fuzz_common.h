#pragma once
// Shared checks for the tokenizer fuzz targets: encoding never crashes, the stream decoder
// only ever emits valid UTF-8, and decode/token_to_piece accept every id encode produced.
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/utf8.h"
#include "tokenizer/tokenizer.h"

namespace worker::fuzz {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

inline void exercise(const Tokenizer& tok, std::string_view text, bool add_special,
                     bool parse_special) {
  const auto ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();  // an id outside the vocabulary
  }
  (void)tok.decode(ids, parse_special);
  Utf8StreamDecoder dec(tok);
  for (int32_t id : ids) {
    if (!utf8::is_valid(dec.push(id))) std::abort();  // D7 broken
  }
  if (!utf8::is_valid(dec.flush())) std::abort();
}

}  // namespace worker::fuzz
