// The job runner with the REAL CPU engine on stories260K (D9, D10, M0-W-1301, 1311, 1330).
// ControlledEngine only slows (or fails) the real forward pass so that jobs last long enough
// to be cancelled or timed out deterministically.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/generation.h"
#include "server/job_runner.h"
#include "server/metrics.h"
#include "test_support.h"

namespace worker::server {
namespace {
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::ControlledEngine;

std::shared_ptr<Job> make_job(const std::string& id, const std::string& prompt, int max_tokens,
                              float temperature = 0.0f) {
  auto j = std::make_shared<Job>();
  j->id = id;
  j->request.prompt = prompt;
  j->request.max_tokens = max_tokens;
  j->request.sampling.temperature = temperature;
  j->request.sampling.seed = 42;
  j->request.prompt_tokens = tokenize_prompt(*testing::stories().tok, prompt, false);
  j->model = "stories260K";
  return j;
}

std::vector<JobEvent> collect(Job& job, std::chrono::milliseconds limit = 20s) {
  std::vector<JobEvent> out;
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    auto ev = job.events.pop(50ms);
    if (!ev) continue;
    out.push_back(*ev);
    if (ev->terminal()) break;
  }
  return out;
}

// started, token*, exactly one terminal; token indices 0..n-1.
void expect_well_formed(const std::vector<JobEvent>& evs, const std::string& terminal_type) {
  ASSERT_FALSE(evs.empty());
  ASSERT_EQ(evs[0].kind, JobEvent::Kind::Started) << "D6: started comes first, always";
  size_t k = 1;
  int32_t i = 0;
  for (; k < evs.size() && evs[k].kind == JobEvent::Kind::Token; ++k, ++i)
    EXPECT_EQ(evs[k].data["i"], i);
  ASSERT_EQ(k + 1, evs.size()) << "exactly one terminal event, last";
  EXPECT_EQ(evs.back().data["type"], terminal_type);
}

class ServerJobRunner : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::stories().model);
    engine_ = testing::make_controlled_engine(512);
  }
  std::unique_ptr<JobRunner> runner(JobRunnerOptions o = {}) {
    return std::make_unique<JobRunner>(*engine_, *testing::stories().tok, o, &metrics_);
  }
  std::unique_ptr<ControlledEngine> engine_;
  Metrics metrics_;
};

// REQ: M0-W-1311 M0-W-1312 WRK-D6 WRK-D9 M0-W-1300
TEST_F(ServerJobRunner, StreamsStartedTokensEndLikeGenerateDirectly) {
  auto r = runner();
  auto job = make_job("a", "Once upon a time", 40);
  ASSERT_EQ(r->submit(job), JobRunner::Admission::Accepted);
  const auto evs = collect(*job);
  expect_well_formed(evs, "end");
  const auto& st = evs.front().data;
  EXPECT_EQ(st["type"], "started");
  EXPECT_EQ(st["job_id"], "a");
  EXPECT_EQ(st["model"], "stories260K");
  EXPECT_EQ(st["seed"], 42u);
  EXPECT_EQ(st["prompt_tokens"], job->request.prompt_tokens.size());
  EXPECT_EQ(st["started_at"].get<std::string>().size(), 24u);  // RFC 3339 with ms, Z
  const auto& end = evs.back().data;
  EXPECT_EQ(end["tokens_out"], 40);
  EXPECT_EQ(end["stop_reason"], "max_tokens");
  EXPECT_GE(end["decode_time_ms"].get<double>(), end["first_token_ms"].get<double>());

  // The runner adds nothing and loses nothing: the same text as generate() on a fresh engine.
  std::string streamed;
  for (const auto& e : evs)
    if (e.kind == JobEvent::Kind::Token) streamed += e.data["t"].get<std::string>();
  auto ref_engine = make_engine("cpu", testing::stories().model, 512);
  const auto ref = generate(*ref_engine, *testing::stories().tok, job->request, {});
  EXPECT_EQ(streamed, ref.text);
  EXPECT_FALSE(streamed.empty());
  // KV contents freed after the job (D10).
  r->stop(0ms);
  EXPECT_EQ(engine_->n_past(), 0);
  EXPECT_EQ(metrics_.requests("ok"), 1u);
}

// REQ: M0-W-1301 WRK-D9
TEST_F(ServerJobRunner, SecondJobWaitsInQueueUntilFirstEnds) {
  engine_->eval_delay_ms = 10;
  auto r = runner();
  auto a = make_job("a", "Once upon a time", 15);
  auto b = make_job("b", "Lily", 5);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  ASSERT_EQ(r->submit(b), JobRunner::Admission::Accepted);
  const auto until = Clock::now() + 2s;
  while (!r->busy() && Clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(r->busy());
  EXPECT_EQ(r->queue_position(*b), 1u);
  std::this_thread::sleep_for(40ms);
  ASSERT_FALSE(a->terminated());
  EXPECT_TRUE(b->events.drain().empty()) << "b produced events while a was running";
  expect_well_formed(collect(*a), "end");
  expect_well_formed(collect(*b), "end");
}

// REQ: WRK-D9 M0-W-1301
TEST_F(ServerJobRunner, QueueDepthBoundsWaitingJobs) {
  engine_->eval_delay_ms = 20;
  auto r = runner({.queue_depth = 1});
  auto a = make_job("a", "Once", 50), b = make_job("b", "Once", 5), c = make_job("c", "Once", 5);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  const auto until = Clock::now() + 2s;
  while (!r->busy() && Clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(r->submit(b), JobRunner::Admission::Accepted);
  EXPECT_EQ(r->submit(c), JobRunner::Admission::Busy);
  auto dup = make_job("b", "Once", 5);
  EXPECT_EQ(r->submit(dup), JobRunner::Admission::DuplicateId);
  r->cancel("a");
  expect_well_formed(collect(*a), "error");
  expect_well_formed(collect(*b), "end");
}

// REQ: M0-W-1330 M0-W-1610 M0-SYS-6.3.5 WRK-D10
TEST_F(ServerJobRunner, CancelRunningJobStopsWithinOneForwardPass) {
  engine_->eval_delay_ms = 20;
  auto r = runner();
  auto a = make_job("a", "Once upon a time", 400);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  int tokens = 0;
  while (tokens < 3) {
    auto ev = a->events.pop(5s);
    ASSERT_TRUE(ev);
    if (ev->kind == JobEvent::Kind::Token) ++tokens;
  }
  const auto t0 = Clock::now();
  EXPECT_EQ(r->cancel("a"), JobRunner::CancelResult::CancelledRunning);
  EXPECT_EQ(r->cancel("a"), JobRunner::CancelResult::CancelledRunning);  // idempotent
  auto rest = collect(*a);
  const auto stop_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().data["type"], "error");
  EXPECT_EQ(rest.back().data["code"], "CANCELLED");
  EXPECT_EQ(rest.back().data["retriable"], false);
  EXPECT_LT(stop_ms, 100.0 * testing::kTimeScale) << "cancel took " << stop_ms << " ms";
  // The next job runs normally, from an empty KV cache.
  auto b = make_job("b", "Lily", 5);
  ASSERT_EQ(r->submit(b), JobRunner::Admission::Accepted);
  expect_well_formed(collect(*b), "end");
  EXPECT_EQ(r->cancel("a"), JobRunner::CancelResult::AlreadyFinished);
  EXPECT_EQ(r->cancel("zzz"), JobRunner::CancelResult::Unknown);
  r->stop(0ms);
  EXPECT_EQ(engine_->n_past(), 0);
  EXPECT_EQ(metrics_.requests("cancelled"), 1u);
}

// Issue 15 row 9: a job cancelled while queued got `error` without `started` first.
// REQ: M0-W-1330 WRK-D10 WRK-D6 M0-W-1311
TEST_F(ServerJobRunner, CancelQueuedJobRemovesItWithOneTerminal) {
  engine_->eval_delay_ms = 10;
  auto r = runner();
  auto a = make_job("a", "Once", 20), b = make_job("b", "Once", 20);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  ASSERT_EQ(r->submit(b), JobRunner::Admission::Accepted);
  const auto until = Clock::now() + 2s;
  while (!r->busy() && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(r->cancel("b"), JobRunner::CancelResult::RemovedQueued);
  const auto evs = collect(*b);
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(evs[0].data["type"], "started");
  EXPECT_EQ(evs[0].data["job_id"], "b");
  EXPECT_EQ(evs[0].data["seed"], 42u);
  EXPECT_EQ(evs[1].data["code"], "CANCELLED");
  EXPECT_EQ(r->queue_size(), 0u);
  expect_well_formed(collect(*a), "end");
  EXPECT_TRUE(b->events.drain().empty());
}

// A queued job whose client went away (cancel_job, the HTTP layer's disconnect path) ends
// `started` then `error`, like every other stream (issue 15 row 9).
// REQ: M0-W-1611 WRK-D6 M0-W-1311
TEST_F(ServerJobRunner, DisconnectWhileQueuedSendsStartedThenError) {
  engine_->eval_delay_ms = 10;
  auto r = runner();
  auto a = make_job("a", "Once", 20), b = make_job("b", "Once", 20);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  ASSERT_EQ(r->submit(b), JobRunner::Admission::Accepted);
  r->cancel_job(b, CancelReason::Disconnect);
  const auto evs = collect(*b);
  expect_well_formed(evs, "error");
  EXPECT_EQ(evs.size(), 2u);
  EXPECT_EQ(evs.back().data["code"], "CANCELLED");
  expect_well_formed(collect(*a), "end");
}

// A job flagged cancelled before the inference thread takes it (the race between a cancel
// and the start) ends `started` then `error` and never runs the engine.
// REQ: M0-W-1330 WRK-D6 M0-W-1311
TEST_F(ServerJobRunner, JobCancelledBeforeStartSendsStartedThenError) {
  auto r = runner();
  auto a = make_job("a", "Once", 20);
  a->request_cancel(CancelReason::Request);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  const auto evs = collect(*a);
  expect_well_formed(evs, "error");
  EXPECT_EQ(evs.size(), 2u);
  EXPECT_EQ(evs.back().data["code"], "CANCELLED");
  EXPECT_EQ(engine_->evals.load(), 0);
  EXPECT_EQ(metrics_.requests("cancelled"), 1u);
}

// REQ: M0-W-1611 WRK-D10
TEST_F(ServerJobRunner, DisconnectCancelsRunningJob) {
  engine_->eval_delay_ms = 20;
  auto r = runner();
  auto a = make_job("a", "Once upon a time", 400);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  auto first = a->events.pop(5s);
  ASSERT_TRUE(first);
  r->cancel_job(a, CancelReason::Disconnect);
  auto rest = collect(*a);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().data["code"], "CANCELLED");
}

// REQ: WRK-D11 M0-W-1500 M0-W-1510 M0-W-1811
TEST_F(ServerJobRunner, InferenceTimeoutEndsWithRetriableError) {
  engine_->eval_delay_ms = 30;
  auto r = runner({.queue_depth = 16, .inference_timeout_sec = 1});
  auto a = make_job("a", "Once upon a time", 400);
  const auto t0 = Clock::now();
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  const auto evs = collect(*a);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  expect_well_formed(evs, "error");
  EXPECT_EQ(evs.back().data["code"], "INFERENCE_TIMEOUT");
  EXPECT_EQ(evs.back().data["retriable"], true);
  EXPECT_GE(secs, 1.0);
  EXPECT_LT(secs, 3.0);
  EXPECT_EQ(metrics_.requests("timeout"), 1u);
}

// REQ: M0-W-1021 WRK-D11 M0-W-1510
TEST_F(ServerJobRunner, VramOomMidJobIsAnErrorEventAndTheRunnerKeepsServing) {
  engine_->fail_oom_at_eval = 3;  // prefill + 2 decode steps succeed, then OOM
  auto r = runner();
  auto a = make_job("a", "Once upon a time", 50);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  const auto evs = collect(*a);
  expect_well_formed(evs, "error");
  EXPECT_EQ(evs.back().data["code"], "VRAM_OOM");
  EXPECT_EQ(evs.back().data["retriable"], true);
  EXPECT_TRUE(r->degraded());
  auto b = make_job("b", "Lily", 5);
  ASSERT_EQ(r->submit(b), JobRunner::Admission::Accepted);
  expect_well_formed(collect(*b), "end");
  EXPECT_FALSE(r->degraded());
}

// The start's log line and `started` event go out while the prompt runs (on a GPU after its
// work is queued): still first, before every token; a job failing before its prompt gets
// them before its error.
// REQ: WRK-D6 M0-W-1311
TEST_F(ServerJobRunner, StartedSentWhileThePromptRunsOrBeforeAnEarlyError) {
  engine_->meanwhile_last = true;
  auto r = runner();
  auto a = make_job("a", "Once upon a time", 12);
  ASSERT_EQ(r->submit(a), JobRunner::Admission::Accepted);
  const auto evs = collect(*a);
  expect_well_formed(evs, "end");
  EXPECT_EQ(evs.size(), 14u);                         // started, 12 tokens, end
  engine_->fail_oom_at_eval = engine_->evals.load();  // the next job's prompt
  auto b = make_job("b", "Lily", 5);
  ASSERT_EQ(r->submit(b), JobRunner::Admission::Accepted);
  const auto evb = collect(*b);
  expect_well_formed(evb, "error");
  EXPECT_EQ(evb.size(), 2u);
  EXPECT_EQ(evb.back().data["code"], "VRAM_OOM");
}

// Queued jobs ended by the shutdown get `started` first too (issue 15 row 9).
// REQ: M0-W-1340 M0-W-1630 WRK-D13 WRK-D6
TEST_F(ServerJobRunner, StopEndsEveryJobWithExactlyOneTerminal) {
  engine_->eval_delay_ms = 20;
  auto r = runner();
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(make_job("j" + std::to_string(i), "Once", 300));
    ASSERT_EQ(r->submit(jobs.back()), JobRunner::Admission::Accepted);
  }
  const auto until = Clock::now() + 2s;
  while (!r->busy() && Clock::now() < until) std::this_thread::sleep_for(1ms);
  const auto t0 = Clock::now();
  r->stop(50ms);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  for (auto& j : jobs) {
    const auto evs = collect(*j, 1s);
    expect_well_formed(evs, "error");
    EXPECT_EQ(evs.back().data["code"], "CANCELLED") << j->id;
    EXPECT_TRUE(j->events.drain().empty());
  }
  auto late = make_job("late", "Once", 5);
  EXPECT_EQ(r->submit(late), JobRunner::Admission::ShuttingDown);
}

// REQ: M0-W-1311 WRK-D9
TEST_F(ServerJobRunner, ConcurrentSubmittersGetCompleteStreams) {
  auto r = runner({.queue_depth = 64});
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 5; ++k) {
        auto j = make_job("t" + std::to_string(t) + "-" + std::to_string(k), "Once upon", 8,
                          k % 2 ? 0.8f : 0.0f);
        if (r->submit(j) != JobRunner::Admission::Accepted) continue;
        const auto evs = collect(*j);
        bool ok = evs.size() >= 2 && evs.front().kind == JobEvent::Kind::Started &&
                  evs.back().kind == JobEvent::Kind::End;
        for (size_t i = 1; ok && i + 1 < evs.size(); ++i)
          ok = evs[i].kind == JobEvent::Kind::Token && evs[i].data["i"] == int(i - 1);
        if (ok) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 30);
  EXPECT_EQ(r->jobs_completed(), 30u);
}

// REQ: M0-W-1012
TEST_F(ServerJobRunner, FailedResidencyCheckMarksTheWorkerDegraded) {
  engine_->resident = false;
  auto r = runner({.queue_depth = 16,
                   .inference_timeout_sec = 300,
                   .residency_check_every = std::chrono::milliseconds(20)});
  const auto until = Clock::now() + 2s;
  while (!r->degraded() && Clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(r->degraded());
}

// The event channel with the consumer's poll before sleeping (the CUDA backend's setting): a
// producer pushing in bursts and pauses loses nothing and reorders nothing, whether the
// consumer takes an event by pop() or drain(); a pop() with nothing coming still waits out its
// timeout and returns (the poll is bounded), with the poll on and off.
// REQ: WRK-D9 M0-W-1311
TEST(EventChannelTest, PollBeforeSleepKeepsEveryEventInOrderAndTheTimeout) {
  for (const auto spin : {std::chrono::microseconds(2000), std::chrono::microseconds(0)}) {
    EventChannel::set_spin(spin);
    EXPECT_EQ(EventChannel::spin(), spin);
    EventChannel ch;
    constexpr int kN = 300;
    std::thread producer([&] {
      for (int i = 0; i < kN; ++i) {
        ch.push({JobEvent::Kind::Token, {{"i", i}}});
        if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        if (i % 50 == 49) std::this_thread::sleep_for(std::chrono::milliseconds(8));  // > window
      }
    });
    int next = 0;
    bool ok = true;
    while (ok && next < kN) {
      auto ev = ch.pop(std::chrono::milliseconds(2000));
      if (!ev) {
        ADD_FAILURE() << "pop timed out at event " << next;
        break;
      }
      ok = ev->data["i"] == next;
      EXPECT_TRUE(ok) << "popped " << ev->data["i"] << ", expected " << next;
      ++next;
      if (next % 2 == 0) {
        for (auto& e : ch.drain()) {
          ok = ok && e.data["i"] == next;
          EXPECT_TRUE(ok) << "drained " << e.data["i"] << ", expected " << next;
          ++next;
        }
      }
    }
    producer.join();
    EXPECT_EQ(next, kN);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(ch.pop(std::chrono::milliseconds(30)).has_value());  // an event was just taken
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(waited, std::chrono::milliseconds(30));
    EXPECT_LT(waited, std::chrono::seconds(2));
    EXPECT_TRUE(ch.drain().empty());
  }
  EventChannel::set_spin(std::chrono::microseconds(0));
}

}  // namespace
}  // namespace worker::server
