#pragma once
// Starts the real worker-orcd binary as a child process, waits until GET /health says
// 200, captures its stderr narration log (each line must be a JSON object, D14) and stops
// it with SIGTERM, checking the exit code.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/sse_parser.h"

namespace conformance {

struct LogLine {
  std::string raw;
  nlohmann::json json;  // null when the line was not JSON
  Clock::time_point arrival;
};

struct WorkerOptions {
  std::string model;                    // passed as --model unless empty
  std::string backend;                  // empty: test_backend() (env WORKER_BACKEND, cpu)
  std::vector<std::string> extra_args;  // appended last
  std::vector<std::string> env;         // "NAME=value" added to the inherited environment
  int port = 0;                         // 0: a free port is found
  bool pass_port = true;                // false: no --port argument
  bool pass_bind = true;                // false: no --bind 127.0.0.1 (default-bind tests)
  bool wait_ready = true;               // constructor waits for /health 200
  std::chrono::milliseconds ready_timeout{60000};
  // A non-JSON stderr line fails the current test (ADD_FAILURE). Off only for tests that
  // look at a line on purpose.
  bool require_json_logs = true;
};

class WorkerProcess {
 public:
  explicit WorkerProcess(WorkerOptions opts);
  ~WorkerProcess();  // SIGKILL if still running
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::vector<std::string>& argv() const { return argv_; }
  Clock::time_point started_at() const { return started_at_; }

  // Polls GET /health until it answers 200; throws (with the log) when the process exits
  // first or the timeout passes.
  void wait_ready(std::chrono::milliseconds timeout);
  // Exit code (or 128 + signal) once the process has exited within `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  bool running();
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit code (128+sig if killed).
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  void send_signal(int sig);

  std::vector<LogLine> logs() const;
  std::string stdout_text() const;
  // All log lines as text (for failure messages).
  std::string log_text() const;
  // Waits for a JSON log line whose "event" equals `event` and for which `pred` is true.
  std::optional<LogLine> wait_for_log(const std::string& event, std::chrono::milliseconds timeout,
                                      const std::function<bool(const nlohmann::json&)>& pred = {});
  std::vector<nlohmann::json> log_events(const std::string& event) const;

 private:
  void spawn();
  void reader(int fd, bool is_stderr);
  void reap(int status);

  WorkerOptions opts_;
  std::vector<std::string> argv_;
  int port_ = 0;
  pid_t pid_ = -1;
  Clock::time_point started_at_;
  std::optional<int> exit_code_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<LogLine> logs_;
  std::string stdout_;
  std::thread err_thread_, out_thread_;
};

}  // namespace conformance
