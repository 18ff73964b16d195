#include "server/json_guard.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace worker::server {
namespace {

bool number_char(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

}  // namespace

std::optional<JsonGuardError> check_json_limits(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  std::string number;  // reused: only the longest number token is ever held
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      // Skip the string; an escape hides the next byte. An unterminated string ends the
      // scan: the parser reports it.
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
      continue;
    }
    if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return JsonGuardError{"body", "depth",
                              "JSON nesting deeper than " + std::to_string(max_depth)};
      continue;
    }
    if (c == ']' || c == '}') {
      if (depth > 0) --depth;
      continue;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i;
      while (j < text.size() && number_char(text[j])) ++j;
      number.assign(text.substr(i, j - i));
      i = j - 1;
      // Integers of any length are fine for the parser (too big ones become doubles); only
      // a value no double can hold is refused. Underflow to 0 is a valid parse.
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(number.c_str(), &end);
      if (end == number.c_str()) continue;  // not a number: the parser reports it
      if (std::isinf(v) || (errno == ERANGE && std::fabs(v) > 1.0))
        return JsonGuardError{"body", "number_range",
                              "number out of range: " + number.substr(0, 40)};
    }
  }
  return std::nullopt;
}

}  // namespace worker::server
