#pragma once
// A pre-parse check of request bodies (issue 15 rows 3, 4): one linear scan, no allocation,
// before nlohmann::json sees the text. It bounds nesting depth (the parser's memory grows
// with depth) and rejects numbers a double cannot hold (the parser throws out_of_range for
// them, which is not a parse_error), so every such body gets a clean 400.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace worker::server {

inline constexpr size_t kMaxJsonDepth = 64;

struct JsonGuardError {
  std::string field;    // "body"
  std::string rule;     // "depth" | "number_range"
  std::string message;  // for the client
};

// nullopt when the text is within limits (it may still be invalid JSON: the parser decides).
std::optional<JsonGuardError> check_json_limits(std::string_view text,
                                                size_t max_depth = kMaxJsonDepth);

}  // namespace worker::server
