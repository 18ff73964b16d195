#include "harness/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <gtest/gtest.h>

#include "harness/http_client.h"
#include "harness/test_env.h"

namespace conformance {

WorkerProcess::WorkerProcess(WorkerOptions opts) : opts_(std::move(opts)) {
  spawn();
  if (opts_.wait_ready) wait_ready(opts_.ready_timeout);
}

WorkerProcess::~WorkerProcess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reap(status);
  }
  if (err_thread_.joinable()) err_thread_.join();
  if (out_thread_.joinable()) out_thread_.join();
}

void WorkerProcess::spawn() {
  port_ = opts_.port != 0 ? opts_.port : find_free_port();
  argv_ = {worker_bin()};
  if (!opts_.model.empty()) argv_.insert(argv_.end(), {"--model", opts_.model});
  const std::string backend = opts_.backend.empty() ? test_backend() : opts_.backend;
  if (backend != "none") argv_.insert(argv_.end(), {"--backend", backend});
  if (opts_.pass_port) argv_.insert(argv_.end(), {"--port", std::to_string(port_)});
  // Tests talk over loopback; binding 127.0.0.1 keeps parallel CI jobs off the network.
  if (opts_.pass_bind) argv_.insert(argv_.end(), {"--bind", "127.0.0.1"});
  argv_.insert(argv_.end(), opts_.extra_args.begin(), opts_.extra_args.end());

  int err_pipe[2], out_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  std::vector<char*> cargv;
  for (auto& a : argv_) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // The child's environment is built before fork: nothing is allocated between fork and exec.
  // opts_.env first: getenv() takes the first of duplicate names.
  std::vector<std::string> env_store = opts_.env;
  for (char** e = environ; *e != nullptr; ++e) env_store.emplace_back(*e);
  std::vector<char*> cenv;
  for (auto& e : env_store) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  started_at_ = Clock::now();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(err_pipe[1], 2);
    ::dup2(out_pipe[1], 1);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execve(cargv[0], cargv.data(), cenv.data());
    const char msg[] = "conformance harness: execv failed\n";
    [[maybe_unused]] auto w = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  ::close(out_pipe[1]);
  err_thread_ = std::thread([this, fd = err_pipe[0]] { reader(fd, true); });
  out_thread_ = std::thread([this, fd = out_pipe[0]] { reader(fd, false); });
}

void WorkerProcess::reader(int fd, bool is_stderr) {
  std::string partial;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const auto now = Clock::now();
    if (!is_stderr) {
      std::lock_guard lk(mu_);
      stdout_.append(buf, static_cast<size_t>(n));
      continue;
    }
    partial.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      LogLine line{partial.substr(0, nl), nullptr, now};
      partial.erase(0, nl + 1);
      try {
        line.json = nlohmann::json::parse(line.raw);
        if (!line.json.is_object()) throw std::runtime_error("not an object");
      } catch (const std::exception&) {
        line.json = nullptr;
        if (opts_.require_json_logs)
          ADD_FAILURE() << "worker stderr line is not a JSON object (D14): '" << line.raw << "'";
      }
      {
        std::lock_guard lk(mu_);
        logs_.push_back(std::move(line));
      }
      cv_.notify_all();
    }
  }
  if (is_stderr && !partial.empty()) {
    if (opts_.require_json_logs)
      ADD_FAILURE() << "worker stderr ended with an unterminated line: '" << partial << "'";
    std::lock_guard lk(mu_);
    logs_.push_back({partial, nullptr, Clock::now()});
  }
  ::close(fd);
  cv_.notify_all();
}

void WorkerProcess::reap(int status) {
  if (WIFEXITED(status))
    exit_code_ = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    exit_code_ = 128 + WTERMSIG(status);
  else
    exit_code_ = -1;
}

bool WorkerProcess::running() {
  if (exit_code_) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reap(status);
    return false;
  }
  return true;
}

std::optional<int> WorkerProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (running()) {
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Let the readers drain what the process wrote before it exited.
  if (err_thread_.joinable()) err_thread_.join();
  if (out_thread_.joinable()) out_thread_.join();
  return exit_code_;
}

void WorkerProcess::send_signal(int sig) {
  if (running()) ::kill(pid_, sig);
}

int WorkerProcess::stop(std::chrono::milliseconds grace) {
  if (running()) ::kill(pid_, SIGTERM);
  if (auto code = wait_exit(grace)) return *code;
  ::kill(pid_, SIGKILL);
  return wait_exit(std::chrono::seconds(10)).value_or(-1);
}

void WorkerProcess::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (!running())
      throw std::runtime_error("worker exited with code " + std::to_string(*exit_code_) +
                               " before /health answered 200; log:\n" + log_text());
    try {
      RequestOptions o;
      o.timeout = std::chrono::milliseconds(2000);
      if (http_get(port_, "/health", o).status == 200) return;
    } catch (const std::exception&) {
      // not listening yet
    }
    if (Clock::now() >= deadline)
      throw std::runtime_error("worker not ready within timeout; log:\n" + log_text());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<LogLine> WorkerProcess::logs() const {
  std::lock_guard lk(mu_);
  return logs_;
}

std::string WorkerProcess::stdout_text() const {
  std::lock_guard lk(mu_);
  return stdout_;
}

std::string WorkerProcess::log_text() const {
  std::lock_guard lk(mu_);
  std::string out;
  for (const auto& l : logs_) out += l.raw + "\n";
  return out;
}

std::optional<LogLine> WorkerProcess::wait_for_log(
    const std::string& event, std::chrono::milliseconds timeout,
    const std::function<bool(const nlohmann::json&)>& pred) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lk(mu_);
  size_t scanned = 0;
  for (;;) {
    for (; scanned < logs_.size(); ++scanned) {
      const auto& l = logs_[scanned];
      if (l.json.is_object() && l.json.value("event", "") == event && (!pred || pred(l.json)))
        return l;
    }
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      for (; scanned < logs_.size(); ++scanned) {
        const auto& l = logs_[scanned];
        if (l.json.is_object() && l.json.value("event", "") == event && (!pred || pred(l.json)))
          return l;
      }
      return std::nullopt;
    }
  }
}

std::vector<nlohmann::json> WorkerProcess::log_events(const std::string& event) const {
  std::lock_guard lk(mu_);
  std::vector<nlohmann::json> out;
  for (const auto& l : logs_)
    if (l.json.is_object() && l.json.value("event", "") == event) out.push_back(l.json);
  return out;
}

}  // namespace conformance
