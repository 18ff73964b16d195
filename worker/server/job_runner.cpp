#include "server/job_runner.h"

#include <algorithm>

#include "common/log.h"
#include "server/logits_log.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace worker::server {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
constexpr size_t kRecentIds = 1024;
}  // namespace

const char* JobEvent::type() const {
  switch (kind) {
    case Kind::Started: return "started";
    case Kind::Token: return "token";
    case Kind::End: return "end";
    case Kind::Error: return "error";
  }
  return "error";
}

JobEvent make_error_event(ErrorCode code, const std::string& message) {
  return {JobEvent::Kind::Error,
          {{"type", "error"},
           {"code", std::string(error_code_name(code))},
           {"message", message},
           {"retriable", error_retriable(code)}}};
}

namespace {
std::atomic<int64_t> g_event_spin_us{0};
}

void EventChannel::set_spin(std::chrono::microseconds spin) {
  g_event_spin_us.store(std::max<int64_t>(0, spin.count()));
}
std::chrono::microseconds EventChannel::spin() {
  return std::chrono::microseconds(g_event_spin_us.load());
}

void EventChannel::push(JobEvent ev) {
  {
    std::lock_guard lock(mu_);
    q_.push_back(std::move(ev));
    pushed_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
}

std::optional<JobEvent> EventChannel::pop(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  const auto deadline = now + timeout;
  const auto sp = spin();
  if (sp.count() > 0 && now - last_taken_ < kSpinWindow) {
    const auto until = std::min(deadline, now + sp);
    while (pushed_.load(std::memory_order_acquire) == taken_ && Clock::now() < until) {
      std::this_thread::yield();
    }
  }
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return !q_.empty(); })) return std::nullopt;
  JobEvent ev = std::move(q_.front());
  q_.pop_front();
  ++taken_;
  last_taken_ = Clock::now();
  return ev;
}

std::vector<JobEvent> EventChannel::drain() {
  std::lock_guard lock(mu_);
  std::vector<JobEvent> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
  q_.clear();
  if (!out.empty()) {
    taken_ += out.size();
    last_taken_ = Clock::now();
  }
  return out;
}

bool Job::send_terminal(JobEvent ev) {
  std::lock_guard lock(terminal_mu_);
  if (terminal_sent_.load()) return false;
  terminal_sent_.store(true);
  events.push(std::move(ev));
  return true;
}

JobEvent Job::started_event() const {
  return {JobEvent::Kind::Started,
          {{"type", "started"},
           {"job_id", id},
           {"model", model},
           {"worker_id", worker_id},
           {"started_at", log::rfc3339_now()},
           {"seed", request.sampling.seed},
           {"prompt_tokens", request.prompt_tokens.size()}}};
}

bool Job::end_unstarted(JobEvent terminal) {
  std::lock_guard lock(terminal_mu_);
  if (terminal_sent_.load()) return false;
  terminal_sent_.store(true);
  events.push(started_event());
  events.push(std::move(terminal));
  return true;
}

JobRunner::JobRunner(Engine& engine, const Tokenizer& tok, JobRunnerOptions opts, Metrics* metrics,
                     LogitsLog* logits_log, std::shared_ptr<const ReceiptContext> receipt)
    : engine_(engine),
      tok_(tok),
      opts_(opts),
      metrics_(metrics),
      logits_log_(logits_log),
      receipt_(std::move(receipt)) {
  thread_ = std::thread([this] { loop(); });
}

JobRunner::~JobRunner() {
  stop(std::chrono::milliseconds(0));
}

JobRunner::Admission JobRunner::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Admission::ShuttingDown;
    if ((running_ && running_->id == job->id) ||
        std::any_of(queue_.begin(), queue_.end(), [&](const auto& j) { return j->id == job->id; }))
      return Admission::DuplicateId;
    // --queue-depth bounds the jobs WAITING behind the running one; while nothing runs,
    // the queue's front is about to start and does not count as waiting.
    const size_t capacity = opts_.queue_depth + (running_ ? 0 : 1);
    if (queue_.size() >= capacity) return Admission::Busy;
    queue_.push_back(job);
    queued_count_.store(queue_.size());
  }
  if (metrics_) metrics_->set_queue_depth(static_cast<int64_t>(queued_count_.load()));
  cv_.notify_all();
  return Admission::Accepted;
}

void JobRunner::cancel_job(const std::shared_ptr<Job>& job, CancelReason why) {
  bool removed = false;
  {
    std::lock_guard lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      queue_.erase(it);
      queued_count_.store(queue_.size());
      removed = true;
    } else if (running_ == job) {
      job->request_cancel(why);
    }
  }
  if (removed) {
    job->request_cancel(why);
    if (job->end_unstarted(make_error_event(ErrorCode::Cancelled, "job cancelled while queued")) &&
        metrics_)
      metrics_->count_request("cancelled");
    if (metrics_) metrics_->set_queue_depth(static_cast<int64_t>(queued_count_.load()));
    log::info("execute_end", {{"job_id", job->id}, {"outcome", "cancelled"}, {"queued", true}});
  }
}

JobRunner::CancelResult JobRunner::cancel(const std::string& job_id, CancelReason why) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard lock(mu_);
    if (running_ && running_->id == job_id) {
      running_->request_cancel(why);
      return CancelResult::CancelledRunning;
    }
    for (const auto& j : queue_)
      if (j->id == job_id) job = j;
    if (!job) {
      for (const auto& r : recent_)
        if (r.first == job_id) return CancelResult::AlreadyFinished;
      return CancelResult::Unknown;
    }
  }
  cancel_job(job, why);
  return CancelResult::RemovedQueued;
}

size_t JobRunner::queue_position(const Job& job) const {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < queue_.size(); ++i)
    if (queue_[i].get() == &job) return i + 1;
  return 0;
}

void JobRunner::stop(std::chrono::milliseconds grace) {
  std::call_once(stop_once_, [&] {
    std::deque<std::shared_ptr<Job>> queued;
    {
      std::unique_lock lock(mu_);
      stopping_ = true;
      queued.swap(queue_);
      queued_count_.store(0);
    }
    cv_.notify_all();
    for (const auto& j : queued) {
      j->request_cancel(CancelReason::Shutdown);
      if (j->end_unstarted(make_error_event(ErrorCode::Cancelled, "worker is shutting down")) &&
          metrics_)
        metrics_->count_request("cancelled");
    }
    {
      // Give the running job `grace` to finish, then cancel it (checked before every
      // forward pass, so it stops within one token).
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, grace, [&] { return !running_; }) && running_)
        running_->request_cancel(CancelReason::Shutdown);
    }
    if (thread_.joinable()) thread_.join();
  });
}

void JobRunner::check_residency() {
  bool ok = false;
  std::string why;
  try {
    ok = engine_.verify_residency();
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!ok) {
    residency_failed_.store(true);
    log::event(
        "critical", "error",
        {{"code", "VRAM_RESIDENCY_FAILED"},
         {"message", why.empty() ? "weights are no longer resident in device memory" : why}});
  }
}

void JobRunner::loop() {
  auto next_residency_check = Clock::now() + opts_.residency_check_every;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      if (!cv_.wait_until(lock, next_residency_check,
                          [&] { return stopping_ || !queue_.empty(); })) {
        lock.unlock();
        check_residency();
        next_residency_check = Clock::now() + opts_.residency_check_every;
        continue;
      }
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
      queued_count_.store(queue_.size());
      running_ = job;
      busy_.store(true);
    }
    if (metrics_) metrics_->set_queue_depth(static_cast<int64_t>(queued_count_.load()));
    JobEvent terminal = run_job(job);
    // Bookkeeping first, terminal event last: a client that saw the terminal event sees the
    // runner idle, the metrics counted and the job id finished.
    {
      std::lock_guard lock(mu_);
      running_.reset();
      busy_.store(false);
      recent_.emplace_back(job->id, Clock::now());
      if (recent_.size() > kRecentIds) recent_.erase(recent_.begin());
    }
    completed_.fetch_add(1);
    job->send_terminal(std::move(terminal));
    cv_.notify_all();
  }
}

JobEvent JobRunner::run_job(const std::shared_ptr<Job>& job) {
  const auto t0 = Clock::now();
  if (job->cancel_reason() != CancelReason::None) {
    if (metrics_) metrics_->count_request("cancelled");
    job->send(job->started_event());  // D6: `started` precedes every terminal event
    return make_error_event(ErrorCode::Cancelled, "job cancelled before start");
  }
  // The start's log line and `started` event go out while the prompt runs on the device
  // (generate's on_prompt_running), or before the terminal event when the job never reaches
  // its prompt.
  bool started = false;
  const auto start = [&] {
    if (started) return;
    log::info("execute_start", {{"job_id", job->id},
                                {"prompt_tokens", job->request.prompt_tokens.size()},
                                {"max_tokens", job->request.max_tokens}});
    job->send(job->started_event());
    started = true;
  };

  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(opts_.inference_timeout_sec));
  std::optional<Clock::time_point> last_token;
  GenerationCallbacks cb;
  cb.on_text = [&](const std::string& text, int32_t index, int32_t) {
    job->send({JobEvent::Kind::Token, {{"type", "token"}, {"t", text}, {"i", index}}});
    if (metrics_) {
      if (!last_token)
        metrics_->ttft_ms.observe(ms_since(job->admitted));
      else
        metrics_->inter_token_ms.observe(ms_since(*last_token));
    }
    last_token = Clock::now();
  };
  cb.should_stop = [&] {
    if (job->cancel_reason() != CancelReason::None) return true;
    if (Clock::now() >= deadline) {
      job->request_cancel(CancelReason::Timeout);
      return true;
    }
    return false;
  };
  if (logits_log_) {
    cb.on_logits = [&](const Engine& e, size_t n, int32_t first_idx) {
      for (size_t i = 0; i < n; ++i) {
        logits_log_->push(e.logits_at(i), job->id, int64_t(first_idx) + int64_t(i));
      }
    };
  }

  cb.on_prompt_running = start;

  std::optional<GenerationResult> result;
  std::optional<JobEvent> failure;
  std::string outcome = "ok";
  try {
    result = generate(engine_, tok_, job->request, cb);
  } catch (const WorkerError& e) {
    failure = make_error_event(e.code(), e.what());
    if (e.code() == ErrorCode::VramOom) degraded_.store(true);
    outcome = "error";
  } catch (const std::exception& e) {
    failure = make_error_event(ErrorCode::Internal, std::string("internal error: ") + e.what());
    outcome = "error";
  }
  start();  // D6: `started` precedes every terminal event
  // Free the job's KV contents whatever happened (D10).
  try {
    engine_.reset();
  } catch (const std::exception& e) {
    log::error("error", {{"job_id", job->id},
                         {"code", "INTERNAL"},
                         {"message", std::string("engine reset failed: ") + e.what()}});
  }
  // The JSONL holds the whole job before its terminal event goes out (bounded wait).
  if (logits_log_ && !logits_log_->flush(1000)) log::warn("log_logits_slow", {{"job_id", job->id}});

  if (!failure && result && result->stop_reason == StopReason::Cancelled) {
    const bool timeout = job->cancel_reason() == CancelReason::Timeout;
    failure = timeout ? make_error_event(ErrorCode::InferenceTimeout,
                                         "inference exceeded --inference-timeout-sec (" +
                                             std::to_string(opts_.inference_timeout_sec) + " s)")
                      : make_error_event(ErrorCode::Cancelled, "job cancelled");
    outcome = timeout ? "timeout" : "cancelled";
  }
  const size_t tokens_out = result ? result->tokens.size() : 0;
  JobEvent terminal = failure ? std::move(*failure) : JobEvent{JobEvent::Kind::End, {}};
  if (!failure) {
    terminal.data = {{"type", "end"},
                     {"tokens_out", tokens_out},
                     {"decode_time_ms", result->decode_time_ms},
                     {"first_token_ms", result->first_token_ms},
                     {"stop_reason", stop_reason_name(result->stop_reason)}};
    if (result->stop_reason == StopReason::StopSequence)
      terminal.data["stop_sequence_matched"] = result->stop_sequence_matched;
    if (receipt_)
      terminal.data["receipt"] =
          make_receipt(*receipt_, job->request, job->prompt_is_template, *result);
    degraded_.store(false);
  }
  if (metrics_) {
    metrics_->count_request(outcome);
    metrics_->add_tokens(tokens_out);
    metrics_->inference_ms.observe(ms_since(t0));
    metrics_->set_vram_bytes(engine_.vram().total());
  }
  log::info("execute_end", {{"job_id", job->id},
                            {"outcome", outcome},
                            {"tokens_out", tokens_out},
                            {"duration_ms", ms_since(t0)}});
  return terminal;
}

}  // namespace worker::server
