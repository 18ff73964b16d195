#pragma once
// --log-logits FILE (D16): one JSONL record per evaluated position (the schema of
// engine/parity/logits_record.h, shared with the CLI and tools/compare_logits.py), written by
// its own thread from a bounded queue so that a slow disk never blocks or breaks the stream.
// The inference thread only copies the logits row (tens of microseconds); the writer
// summarizes and writes. When the queue's byte budget is spent (a long prompt's prefill),
// the row is summarized in place instead, so nothing is lost; past the record cap, records
// are dropped and counted, with a warning. A write that fails (disk full) is a warning too:
// the jobs go on.
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace worker::server {

inline constexpr size_t kLogitsValues = 16;  // "values": the first N logits

class LogitsLog {
 public:
  // Opens (truncates) `path`; throws WorkerError when it cannot be opened.
  explicit LogitsLog(const std::string& path, size_t max_records = 65536,
                     size_t max_bytes = size_t(256) << 20);
  ~LogitsLog();  // drains the queue, flushes and closes
  LogitsLog(const LogitsLog&) = delete;
  LogitsLog& operator=(const LogitsLog&) = delete;

  // Never waits for the disk.
  void push(std::span<const float> logits, const std::string& job_id, int64_t token_idx);
  // Waits until everything pushed so far is written and flushed, at most `timeout_ms`.
  bool flush(int timeout_ms);
  uint64_t dropped() const;
  uint64_t written() const;
  // Failed writes or flushes (each logged as a warning at power-of-two counts).
  uint64_t write_errors() const;

 private:
  struct Item {
    std::string job_id;
    int64_t token_idx = 0;
    std::vector<float> logits;  // raw row, or empty when `record` is ready
    nlohmann::json record;
  };
  void run();
  void write_failed(int err);

  std::string path_;
  std::FILE* f_ = nullptr;
  size_t max_records_, max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::deque<Item> q_;
  size_t queued_bytes_ = 0;
  uint64_t pushed_ = 0, written_ = 0, dropped_ = 0, flushed_upto_ = 0, write_errors_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace worker::server
