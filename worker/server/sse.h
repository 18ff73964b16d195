#pragma once
// SSE framing (D6): `event: <type>\ndata: <one-line JSON>\n\n`, plus comment lines for
// keep-alive/queue position. JSON is dumped on one line; strings escape every newline, so a
// frame can never be split by its payload.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace worker::server {

// One named event; `data` must be an object carrying "type" (added when missing).
std::string sse_event(std::string_view type, nlohmann::json data);
// A data-only frame (OpenAI streams): `data: <payload>\n\n`.
std::string sse_data(std::string_view payload);
// A comment frame `: <text>\n\n`; SSE clients ignore it. `text` must not hold newlines.
std::string sse_comment(std::string_view text);
// One-line JSON dump that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace worker::server
