// log::emergency: the allocation-free line of the shutdown watchdog (worker_main.cpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/log.h"

namespace worker {
namespace {

// Runs f with fd 2 redirected to a pipe; returns what was written there.
template <typename F>
std::string capture_stderr(F&& f) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const int saved = dup(2);
  EXPECT_GE(saved, 0);
  EXPECT_EQ(dup2(fds[1], 2), 2);
  f();
  EXPECT_EQ(dup2(saved, 2), 2);
  close(saved);
  close(fds[1]);
  std::string out;
  char buf[1024];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  return out;
}

// REQ: M0-W-1630 M0-W-1900
TEST(Log, EmergencyWritesOneJsonLineWithTheFixedFields) {
  const std::string out = capture_stderr(
      [] { log::emergency("warn", "shutdown_forced", "orderly shutdown exceeded 4.8 s"); });
  ASSERT_FALSE(out.empty());
  ASSERT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line";
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["level"], "warn");
  EXPECT_EQ(j["event"], "shutdown_forced");
  EXPECT_EQ(j["message"], "orderly shutdown exceeded 4.8 s");
  const std::string ts = j["ts"];
  ASSERT_EQ(ts.size(), log::rfc3339_now().size()) << ts;  // 2026-11-25T22:28:09.123Z
  EXPECT_EQ(ts[10], 'T');
  EXPECT_EQ(ts.back(), 'Z');
}

// Quotes, backslashes and control characters in the message cannot break the line.
// REQ: M0-W-1900
TEST(Log, EmergencyMessageStaysValidJson) {
  const std::string out =
      capture_stderr([] { log::emergency("error", "x", "a \"quoted\" \\path\nnext"); });
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["message"], "a 'quoted' 'path'next");
}

// A stderr that takes nothing (a full pipe nobody reads) does not block the caller.
// REQ: M0-W-1630
TEST(Log, EmergencyDoesNotBlockOnAFullPipe) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(fcntl(fds[1], F_SETFL, O_NONBLOCK), 0);
  const std::string fill(4096, 'x');
  while (write(fds[1], fill.data(), fill.size()) > 0) {
  }
  ASSERT_EQ(fcntl(fds[1], F_SETFL, 0), 0);  // blocking again, as stderr would be
  const int saved = dup(2);
  ASSERT_EQ(dup2(fds[1], 2), 2);
  const auto t0 = std::chrono::steady_clock::now();
  log::emergency("warn", "shutdown_forced", "orderly shutdown exceeded 4.8 s");
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  dup2(saved, 2);
  close(saved);
  close(fds[0]);
  close(fds[1]);
  EXPECT_LT(ms, 1000);
}

}  // namespace
}  // namespace worker
