#pragma once
// JSON-lines narration log on stderr (D14, M0-W-1900): one object per line, fixed field
// names, written under a mutex so lines from different threads never interleave.
#include <nlohmann/json.hpp>
#include <string>

namespace worker::log {

// Fields added to every line (worker_id, model_ref, gpu_device), set once at startup.
void set_context(const nlohmann::json& fields);
// Writes {"ts":..., "level":..., "event":..., <context>, <fields>} + '\n' to stderr.
void event(std::string_view level, std::string_view event_name, const nlohmann::json& fields = {});
inline void info(std::string_view ev, const nlohmann::json& f = {}) {
  event("info", ev, f);
}
inline void warn(std::string_view ev, const nlohmann::json& f = {}) {
  event("warn", ev, f);
}
inline void error(std::string_view ev, const nlohmann::json& f = {}) {
  event("error", ev, f);
}

// RFC 3339 UTC timestamp with milliseconds, e.g. 2026-11-25T22:28:09.123Z
std::string rfc3339_now();

// One line {"ts", "level", "event", "message"} for a process that may be tearing down
// (static objects destroyed, the heap unusable): formatted on the stack and written with
// write(2) if stderr takes it within 100 ms; no allocation, no lock, no context fields,
// nothing that throws. level / event_name: plain identifiers; in message, quotes,
// backslashes and control characters become '.
void emergency(const char* level, const char* event_name, const char* message) noexcept;

// Terminal output beside the JSON lines, for a stderr that is a TTY only (callers check):
// status() draws one line redrawn in place (empty text removes it); JSON lines written while
// it shows clear it first and draw it again below themselves, so each stays whole.
void status(std::string_view text);
// A whole human-readable line (e.g. the ready banner), written under the same lock.
void terminal_line(std::string_view text);

}  // namespace worker::log
