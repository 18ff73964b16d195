#pragma once
// The job runner (D9, D10): a bounded FIFO admission queue, ONE inference thread that owns
// the engine, and a per-job event channel that the HTTP thread drains. The HTTP threads
// never run model code; they only push jobs, pop events and flip cancel flags.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "engine/generation.h"
#include "engine/receipt.h"

namespace worker::server {

class Metrics;
class LogitsLog;

struct JobEvent {
  enum class Kind { Started, Token, End, Error };
  Kind kind;
  nlohmann::json data;  // the SSE payload, "type" included
  bool terminal() const { return kind == Kind::End || kind == Kind::Error; }
  const char* type() const;
};

// Unbounded per-job queue (a job's events are bounded by max_tokens + 2); push never blocks
// the inference thread. One consumer at a time (the stream's connection thread).
class EventChannel {
 public:
  void push(JobEvent ev);
  // Waits up to `timeout` for the next event. While a stream is flowing (an event taken within
  // the last kSpinWindow), the consumer first polls for up to spin() before it sleeps on the
  // condition variable: a sleeping thread's wake-up now and then took ~0.5 ms on the GPU host,
  // which showed as a late token event followed by an early one in the inter-token times.
  std::optional<JobEvent> pop(std::chrono::milliseconds timeout);
  // Everything available now (possibly nothing), without waiting.
  std::vector<JobEvent> drain();

  // The poll before sleeping, for every channel of the process (0 at start: never poll; the
  // worker sets it for the CUDA backend, whose tokens come every millisecond or so while the
  // inference thread mostly waits for the GPU; on the CPU backend the cores compute tokens).
  static void set_spin(std::chrono::microseconds spin);
  static std::chrono::microseconds spin();
  static constexpr std::chrono::milliseconds kSpinWindow{5};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> q_;
  std::atomic<uint64_t> pushed_{0};
  uint64_t taken_ = 0;  // written by the consumer under mu_, read by it while polling
  std::chrono::steady_clock::time_point last_taken_{};  // the consumer's
};

enum class CancelReason : int { None = 0, Request, Disconnect, Timeout, Shutdown };

struct Job {
  std::string id;
  GenerationRequest request;        // prompt ids included: tokenized once, at validation
  bool prompt_is_template = false;  // prompt holds chat markup (recorded in the receipt)
  std::string model;                // reported in `started`
  std::string worker_id;            // reported in `started` (which worker behind a proxy)
  std::chrono::steady_clock::time_point admitted = std::chrono::steady_clock::now();

  EventChannel events;
  std::atomic<int> cancel{0};  // CancelReason; first reason wins

  void request_cancel(CancelReason r) {
    int expected = 0;
    cancel.compare_exchange_strong(expected, static_cast<int>(r));
  }
  CancelReason cancel_reason() const { return static_cast<CancelReason>(cancel.load()); }
  // Pushes `ev` only if no terminal event was sent yet: exactly one per stream.
  bool send_terminal(JobEvent ev);
  // Ends a job that never ran (cancelled while queued, shutdown, cancelled before start):
  // `started` then `terminal`, so the stream keeps D6's order. False if already ended.
  bool end_unstarted(JobEvent terminal);
  JobEvent started_event() const;
  void send(JobEvent ev) { events.push(std::move(ev)); }
  bool terminated() const { return terminal_sent_.load(); }

 private:
  std::mutex terminal_mu_;
  std::atomic<bool> terminal_sent_{false};
};

struct JobRunnerOptions {
  size_t queue_depth = 16;
  double inference_timeout_sec = 300;
  // M0-W-1012: the engine's residency self-check, run on the inference thread between jobs.
  std::chrono::milliseconds residency_check_every{60000};
};

class JobRunner {
 public:
  // The runner borrows the engine and tokenizer; they must outlive it.
  // receipt: when given, every `end` event carries the job's receipt (WRK-D18).
  JobRunner(Engine& engine, const Tokenizer& tok, JobRunnerOptions opts, Metrics* metrics = nullptr,
            LogitsLog* logits_log = nullptr,
            std::shared_ptr<const ReceiptContext> receipt = nullptr);
  ~JobRunner();  // stop(0)
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  enum class Admission { Accepted, Busy, DuplicateId, ShuttingDown };
  Admission submit(const std::shared_ptr<Job>& job);

  enum class CancelResult { CancelledRunning, RemovedQueued, AlreadyFinished, Unknown };
  CancelResult cancel(const std::string& job_id, CancelReason why = CancelReason::Request);
  // Cancels a job the caller holds (client disconnect): queued -> removed, running -> flagged.
  void cancel_job(const std::shared_ptr<Job>& job, CancelReason why);

  // 1-based position in the admission queue; 0 when running or finished.
  size_t queue_position(const Job& job) const;
  size_t queue_size() const { return queued_count_.load(); }
  bool busy() const { return busy_.load(); }
  uint64_t jobs_completed() const { return completed_.load(); }
  // Set after a VRAM_OOM until a job succeeds (M0-W-1021: unhealthy but still serving),
  // or for good once a residency check fails (M0-W-1012).
  bool degraded() const { return degraded_.load() || residency_failed_.load(); }

  // Stops admitting; queued jobs end with CANCELLED; the running job gets `grace` to
  // finish, then is cancelled. Joins the inference thread. Idempotent.
  void stop(std::chrono::milliseconds grace);

 private:
  void loop();
  JobEvent run_job(const std::shared_ptr<Job>& job);  // returns the terminal event
  void check_residency();

  Engine& engine_;
  const Tokenizer& tok_;
  JobRunnerOptions opts_;
  Metrics* metrics_;
  LogitsLog* logits_log_;
  std::shared_ptr<const ReceiptContext> receipt_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> running_;
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>>
      recent_;  // finished ids
  bool stopping_ = false;
  std::atomic<size_t> queued_count_{0};
  std::atomic<bool> busy_{false};
  std::atomic<bool> degraded_{false};
  std::atomic<bool> residency_failed_{false};
  std::atomic<uint64_t> completed_{0};
  std::thread thread_;
  std::once_flag stop_once_;
};

JobEvent make_error_event(ErrorCode code, const std::string& message);

}  // namespace worker::server
