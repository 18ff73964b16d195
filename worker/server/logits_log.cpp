#include "server/logits_log.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/errors.h"
#include "common/log.h"
#include "engine/parity/logits_record.h"

namespace worker::server {

LogitsLog::LogitsLog(const std::string& path, size_t max_records, size_t max_bytes)
    : path_(path), max_records_(max_records), max_bytes_(max_bytes) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_)
    throw WorkerError(ErrorCode::Internal, "--log-logits: cannot open '" + path + "' for writing");
  thread_ = std::thread([this] { run(); });
}

LogitsLog::~LogitsLog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (f_) std::fclose(f_);
}

void LogitsLog::push(std::span<const float> logits, const std::string& job_id, int64_t token_idx) {
  if (logits.empty()) return;
  const size_t bytes = logits.size_bytes();
  Item item{job_id, token_idx, {}, {}};
  bool copy = false;
  uint64_t dropped_now = 0;
  {
    std::lock_guard lock(mu_);
    if (q_.size() >= max_records_) {
      dropped_now = ++dropped_;
    } else {
      copy = queued_bytes_ + bytes <= max_bytes_;
      if (copy) queued_bytes_ += bytes;  // reserve before copying outside the lock
    }
  }
  if (dropped_now) {
    // Power-of-two counts keep the warning rate bounded.
    if ((dropped_now & (dropped_now - 1)) == 0)
      log::warn("log_logits_dropped", {{"dropped_total", dropped_now}, {"job_id", job_id}});
    return;
  }
  if (copy)
    item.logits.assign(logits.begin(), logits.end());
  else
    item.record = parity::logits_record(logits, "logits", job_id, token_idx, kLogitsValues);
  {
    std::lock_guard lock(mu_);
    q_.push_back(std::move(item));
    ++pushed_;
  }
  cv_.notify_one();
}

bool LogitsLog::flush(int timeout_ms) {
  std::unique_lock lock(mu_);
  const uint64_t target = pushed_;
  cv_.notify_one();
  return done_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                           [&] { return flushed_upto_ >= target; });
}

uint64_t LogitsLog::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

uint64_t LogitsLog::write_errors() const {
  std::lock_guard lock(mu_);
  return write_errors_;
}

// A full or failing disk costs the records, never the stream (WRK-D28): warn, clear the
// stream's error flag so later writes are tried again, go on.
void LogitsLog::write_failed(int err) {
  uint64_t n = 0;
  {
    std::lock_guard lock(mu_);
    n = ++write_errors_;
  }
  std::clearerr(f_);
  if ((n & (n - 1)) == 0)  // power-of-two counts keep the warning rate bounded
    log::warn("log_logits_write_failed",
              {{"path", path_}, {"error", std::strerror(err)}, {"failures_total", n}});
}

uint64_t LogitsLog::written() const {
  std::lock_guard lock(mu_);
  return written_;
}

void LogitsLog::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
    while (!q_.empty()) {
      Item item = std::move(q_.front());
      q_.pop_front();
      lock.unlock();
      const size_t bytes = item.logits.size() * sizeof(float);
      const nlohmann::json rec = item.logits.empty()
                                     ? std::move(item.record)
                                     : parity::logits_record(item.logits, "logits", item.job_id,
                                                             item.token_idx, kLogitsValues);
      const std::string line =
          rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      const bool wrote = std::fwrite(line.data(), 1, line.size(), f_) == line.size();
      if (!wrote) write_failed(errno);
      lock.lock();
      queued_bytes_ -= bytes;
      ++written_;
    }
    lock.unlock();
    if (std::fflush(f_) != 0) write_failed(errno);
    lock.lock();
    flushed_upto_ = written_;
    done_cv_.notify_all();
    if (stop_ && q_.empty()) return;
  }
}

}  // namespace worker::server
