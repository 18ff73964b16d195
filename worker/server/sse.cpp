#include "server/sse.h"

namespace worker::server {

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(std::string_view type, nlohmann::json data) {
  if (!data.is_object()) data = nlohmann::json::object();
  if (!data.contains("type")) data["type"] = type;
  std::string out;
  out.reserve(64);
  out.append("event: ").append(type).append("\ndata: ").append(dump_json(data)).append("\n\n");
  return out;
}

std::string sse_data(std::string_view payload) {
  std::string out("data: ");
  out.append(payload).append("\n\n");
  return out;
}

std::string sse_comment(std::string_view text) {
  std::string out(": ");
  for (char c : text) out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  out.append("\n\n");
  return out;
}

}  // namespace worker::server
