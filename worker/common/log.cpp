#include "common/log.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace worker::log {
namespace {
std::mutex g_mutex;
nlohmann::json g_context = nlohmann::json::object();
std::string g_status;  // the terminal status line now drawn, "" when none

constexpr std::string_view kClearLine = "\r\033[K";

void write_locked(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stderr);
}

// The current UTC time as RFC 3339 with milliseconds into buf, without allocating (the
// emergency line uses it during teardown).
void rfc3339_now_into(char (&buf)[96]) noexcept {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  const std::time_t t = system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
}
}  // namespace

void set_context(const nlohmann::json& fields) {
  std::lock_guard lock(g_mutex);
  g_context = fields.is_object() ? fields : nlohmann::json::object();
}

std::string rfc3339_now() {
  char buf[96];
  rfc3339_now_into(buf);
  return buf;
}

void emergency(const char* level, const char* event_name, const char* message) noexcept {
  char ts[96];
  rfc3339_now_into(ts);
  char msg[256];
  size_t k = 0;
  for (const char* p = message; *p != '\0' && k + 1 < sizeof msg; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    msg[k++] = (c == '"' || c == '\\' || c < 0x20) ? '\'' : *p;
  }
  msg[k] = '\0';
  char buf[512];
  const int n = std::snprintf(
      buf, sizeof buf, "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":\"%s\",\"message\":\"%s\"}\n", ts,
      level, event_name, msg);
  if (n <= 0) return;
  // A full pipe must not keep the caller (the shutdown watchdog) from exiting.
  pollfd p{2, POLLOUT, 0};
  if (poll(&p, 1, 100) <= 0 || (p.revents & POLLOUT) == 0) return;
  size_t left = std::min(static_cast<size_t>(n), sizeof buf - 1);
  const char* at = buf;
  while (left > 0) {
    const ssize_t w = ::write(2, at, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    at += w;
    left -= static_cast<size_t>(w);
  }
}

void event(std::string_view level, std::string_view event_name, const nlohmann::json& fields) {
  nlohmann::json line = {{"ts", rfc3339_now()}, {"level", level}, {"event", event_name}};
  std::lock_guard lock(g_mutex);
  for (const auto& [k, v] : g_context.items()) line[k] = v;
  if (fields.is_object())
    for (const auto& [k, v] : fields.items()) line[k] = v;
  const std::string text =
      line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!g_status.empty()) write_locked(kClearLine);
  write_locked(text);
  write_locked(g_status);
  std::fflush(stderr);
}

void status(std::string_view text) {
  std::lock_guard lock(g_mutex);
  if (text.empty() && g_status.empty()) return;
  g_status = text;
  write_locked(kClearLine);
  write_locked(g_status);
  std::fflush(stderr);
}

void terminal_line(std::string_view text) {
  std::lock_guard lock(g_mutex);
  if (!g_status.empty()) write_locked(kClearLine);
  write_locked(text);
  write_locked("\n");
  write_locked(g_status);
  std::fflush(stderr);
}

}  // namespace worker::log
