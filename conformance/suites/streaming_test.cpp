// Streaming is real (events leave as tokens are made), cancellation by /cancel and by
// disconnect, the FIFO admission queue and WORKER_BUSY, the inference timeout, and 200
// mixed requests from 16 concurrent clients. Long jobs use the slow conformance model
// (random weights, greedy never hits EOS); the concurrency run uses stories260K.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "harness/suite.h"

namespace conformance {
namespace {

using namespace std::chrono_literals;

// Polls /health until the worker is idle; returns the time it took (ms), or -1.
double wait_idle(int port, std::chrono::milliseconds timeout) {
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < timeout) {
    auto h = http_get(port, "/health").json();
    if (h["busy"] == false && h["queue_depth"] == 0) return ms_between(t0, Clock::now());
    std::this_thread::sleep_for(2ms);
  }
  return -1;
}

nlohmann::json long_job(const std::string& id) {
  return {{"job_id", id}, {"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"temperature", 0}};
}

// Reads events until `n` token events have arrived.
void read_tokens(SseStream& s, int n) {
  int seen = 0;
  while (seen < n) {
    auto e = s.next_event(60s);
    ASSERT_TRUE(e.has_value()) << "stream ended after " << seen << " tokens";
    if (e->event == "token") ++seen;
    ASSERT_NE(e->event, "end");
    ASSERT_NE(e->event, "error") << e->data;
  }
}

class StreamingTest : public SharedWorkerTest<StreamingTest> {
 public:
  static WorkerOptions worker_options() {
    WorkerOptions o;
    o.model = slow_model();
    return o;
  }

 protected:
  void TearDown() override {
    // Leave the worker idle for the next test.
    if (proc_ && proc_->running()) {
      EXPECT_GE(wait_idle(port(), 30s), 0) << "worker stayed busy";
    }
  }
  void expect_next_job_runs_normally() {
    JobStream js = run_job(port(), job_request("The cat", 5, 0.0));
    EXPECT_TRUE(js.violations.empty()) << js.describe();
    ASSERT_NE(js.terminal(), nullptr);
    EXPECT_EQ(js.events.back().event, "end");
    EXPECT_EQ((*js.terminal())["tokens_out"], 5);
  }
};

// The first token event is read long before the last: nothing is buffered to the end.
// REQ: M0-W-1311 WRK-D6 M0-W-1600 M0-W-1602
TEST_F(StreamingTest, FirstTokenArrivesBeforeGenerationEnds) {
  auto req = job_request("Once upon a time", 200, 0.0);
  SseStream s(port(), "/execute", req);
  ASSERT_EQ(s.status(), 200);
  JobStream js = collect(s);
  ASSERT_TRUE(js.violations.empty()) << js.describe();
  ASSERT_EQ((*js.terminal())["tokens_out"], 200);
  const auto toks = js.tokens();
  ASSERT_GE(toks.size(), 100u);
  Clock::time_point first{}, last{};
  std::set<Clock::time_point::rep> distinct;
  for (const auto& e : js.events)
    if (e.event == "token") {
      if (first == Clock::time_point{}) first = e.arrival;
      last = e.arrival;
      distinct.insert(e.arrival.time_since_epoch().count());
    }
  const double gen_ms = (*js.terminal())["decode_time_ms"].get<double>();
  const double spread_ms = ms_between(first, js.events.back().arrival);
  const double first_ms = ms_between(js.sent_at, first);
  RecordProperty("first_token_ms_client", std::to_string(first_ms));
  RecordProperty("first_to_end_ms", std::to_string(spread_ms));
  // Streamed: the end event arrives at least half the decode time after the first token,
  // and tokens came in many separate reads.
  EXPECT_GT(spread_ms, 0.5 * gen_ms)
      << "first token " << first_ms << " ms, end "
      << ms_between(js.sent_at, js.events.back().arrival) << " ms, decode " << gen_ms << " ms";
  EXPECT_GT(distinct.size(), 50u);
  std::ofstream(results_dir() + "/streaming_timing.json") << nlohmann::json{
      {"first_token_ms", first_ms},
      {"first_to_end_ms", spread_ms},
      {"decode_time_ms", gen_ms},
      {"tokens", toks.size()},
      {"distinct_arrivals", distinct.size()}}.dump(2);
}

// REQ: M0-W-1330 M0-SYS-6.3.5 M0-W-1610 WRK-D10 M0-W-1510
TEST_F(StreamingTest, CancelEndpointStopsARunningJobQuickly) {
  const std::string id = unique_job_id("cancel");
  SseStream s(port(), "/execute", long_job(id));
  ASSERT_EQ(s.status(), 200);
  read_tokens(s, 3);
  const auto t0 = Clock::now();
  auto r = http_post_json(port(), "/cancel", {{"job_id", id}});
  EXPECT_EQ(r.status, 202) << r.body;
  JobStream js = collect(s);
  const double ms = ms_between(t0, js.events.back().arrival);
  EXPECT_TRUE(js.violations.empty()) << js.describe();
  ASSERT_EQ(js.events.back().event, "error") << js.describe();
  EXPECT_EQ((*js.terminal())["code"], "CANCELLED");
  EXPECT_EQ((*js.terminal())["retriable"], false);
  EXPECT_LT(ms, 1000.0) << "cancel to terminal event";
  RecordProperty("cancel_to_terminal_ms", std::to_string(ms));
  auto log = worker().wait_for_log(
      "execute_end", 5s, [&](const nlohmann::json& j) { return j.value("job_id", "") == id; });
  ASSERT_TRUE(log.has_value()) << "no execute_end log line for " << id;
  EXPECT_LT(ms_between(t0, log->arrival), 1000.0);
  expect_next_job_runs_normally();
}

// REQ: M0-W-1330 WRK-D10 WRK-D5
TEST_F(StreamingTest, CancelByPathAndIdempotence) {
  const std::string id = unique_job_id("cancelpath");
  SseStream s(port(), "/execute", long_job(id));
  read_tokens(s, 2);
  auto r = http_request(port(), "POST", "/cancel/" + id, "");
  EXPECT_EQ(r.status, 202) << r.body;
  JobStream js = collect(s);
  ASSERT_NE(js.terminal(), nullptr) << js.describe();
  EXPECT_EQ((*js.terminal())["code"], "CANCELLED");
  // Again (finished job) and an unknown job: 202 with a status that says so.
  auto again = http_post_json(port(), "/cancel", {{"job_id", id}});
  EXPECT_EQ(again.status, 202);
  auto unknown = http_post_json(port(), "/cancel", {{"job_id", "never-existed-42"}});
  EXPECT_EQ(unknown.status, 202);
  EXPECT_TRUE(again.json().contains("status"));
  EXPECT_TRUE(unknown.json().contains("status"));
  EXPECT_NE(again.json()["status"], unknown.json()["status"]);
  // A malformed cancel body is a 400, not a crash.
  EXPECT_EQ(http_request(port(), "POST", "/cancel", "{\"nope\":1}").status, 400);
}

// Closing the socket cancels the job: the inference thread stops and the worker is idle.
// REQ: M0-W-1611 WRK-D10 M0-W-1610
TEST_F(StreamingTest, ClientDisconnectCancelsTheJob) {
  const std::string id = unique_job_id("disc");
  auto s = std::make_unique<SseStream>(port(), "/execute", long_job(id));
  read_tokens(*s, 3);
  const auto t0 = Clock::now();
  s->close();
  auto log = worker().wait_for_log(
      "execute_end", 10s, [&](const nlohmann::json& j) { return j.value("job_id", "") == id; });
  ASSERT_TRUE(log.has_value()) << "job kept running after the client closed the socket";
  const double ms = ms_between(t0, log->arrival);
  EXPECT_EQ(log->json.value("outcome", ""), "cancelled") << log->raw;
  EXPECT_LT(ms, 1000.0) << "close to execute_end";
  RecordProperty("disconnect_to_stop_ms", std::to_string(ms));
  EXPECT_GE(wait_idle(port(), 2s), 0);
  expect_next_job_runs_normally();
}

// Two requests at once: the second waits (receiving SSE comments) and runs after the first.
// REQ: M0-W-1301 WRK-D9
TEST_F(StreamingTest, SecondRequestWaitsInTheQueueThenRuns) {
  SseStream a(port(), "/execute", job_request("Once upon a time", 150, 0.0));
  read_tokens(a, 1);
  SseStream b(port(), "/execute", job_request("The cat", 5, 0.0));
  ASSERT_EQ(b.status(), 200);
  JobStream ja = collect(a);
  JobStream jb = collect(b);
  EXPECT_TRUE(ja.violations.empty()) << ja.describe();
  EXPECT_TRUE(jb.violations.empty()) << jb.describe();
  ASSERT_EQ(jb.events.front().event, "started");
  // b's started arrives after a's end: one job at a time.
  EXPECT_GE(jb.events.front().arrival, ja.events.back().arrival);
  EXPECT_FALSE(jb.comments.empty()) << "queued stream received no SSE comment line";
  EXPECT_EQ((*jb.terminal())["tokens_out"], 5);
}

// A queued job cancelled by /cancel leaves the queue; the running one goes on. Its stream is
// still `started` then `error` (D6; issue 15 row 9: it used to get `error` alone).
// REQ: M0-W-1330 WRK-D10 WRK-D9 WRK-D6 M0-W-1311
TEST_F(StreamingTest, CancellingAQueuedJobRemovesIt) {
  const std::string ida = unique_job_id("qa"), idb = unique_job_id("qb");
  SseStream a(port(), "/execute", long_job(ida));
  read_tokens(a, 1);
  SseStream b(port(), "/execute", long_job(idb));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(http_post_json(port(), "/cancel", {{"job_id", idb}}).status, 202);
  JobStream jb = collect(b, 5s);
  ASSERT_FALSE(jb.events.empty());
  EXPECT_EQ(jb.events.front().event, "started") << jb.describe();
  EXPECT_TRUE(jb.violations.empty()) << jb.describe();
  EXPECT_EQ(jb.events.back().event, "error");
  EXPECT_EQ((*jb.terminal())["code"], "CANCELLED");
  auto next = a.next_event(10s);  // a still streams
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->event, "token");
  EXPECT_EQ(http_post_json(port(), "/cancel", {{"job_id", ida}}).status, 202);
  JobStream ja = collect(a);
  EXPECT_EQ((*ja.terminal())["code"], "CANCELLED");
}

// With --queue-depth 1: one running, one queued, the third is refused with 503.
// REQ: M0-W-1301 WRK-D9 WRK-D11
TEST(ConformanceQueue, QueueDepthOneRefusesTheThirdWithWorkerBusy) {
  WorkerOptions o;
  o.model = slow_model();
  o.extra_args = {"--queue-depth", "1"};
  WorkerProcess w(o);
  const std::string ida = unique_job_id("busy-a"), idb = unique_job_id("busy-b");
  SseStream a(w.port(), "/execute", long_job(ida));
  read_tokens(a, 1);
  SseStream b(w.port(), "/execute", long_job(idb));
  ASSERT_EQ(b.status(), 200);
  std::this_thread::sleep_for(50ms);
  auto c = http_post_json(w.port(), "/execute", job_request("x", 3, 0.0));
  EXPECT_EQ(c.status, 503) << c.body;
  EXPECT_TRUE(c.header("retry-after").has_value());
  EXPECT_EQ(c.json()["error"]["code"], "WORKER_BUSY") << c.body;
  EXPECT_EQ(c.json()["error"]["retriable"], true) << c.body;
  http_post_json(w.port(), "/cancel", {{"job_id", idb}});
  http_post_json(w.port(), "/cancel", {{"job_id", ida}});
  collect(a);
  collect(b);
  EXPECT_EQ(w.stop(), 0);
}

// REQ: WRK-D11 M0-W-1101
TEST(ConformanceQueue, InferenceTimeoutEndsTheJob) {
  WorkerOptions o;
  o.model = slow_model();
  // The limit must be shorter than 2000 tokens of the slow model and longer than the short
  // follow-up job: 1 s on the CPU; the cuda backend finishes all 2000 tokens inside 1 s
  // (~0.2 s on an H200), so there the limit is 50 ms.
  // Sanitizer builds (ci/test.sh) run the worker 5-20x slower: 4 s keeps both sides true.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr double cpu_limit_s = 4;
#else
  constexpr double cpu_limit_s = 1;
#endif
  const bool gpu = test_backend() == "cuda";
  o.extra_args = {"--inference-timeout-sec", gpu ? "0.05" : std::to_string(cpu_limit_s)};
  WorkerProcess w(o);
  const auto t0 = Clock::now();
  JobStream js = run_job(w.port(), long_job(unique_job_id("timeout")));
  EXPECT_TRUE(js.violations.empty()) << js.describe();
  ASSERT_NE(js.terminal(), nullptr);
  EXPECT_EQ(js.events.back().event, "error");
  EXPECT_EQ((*js.terminal())["code"], "INFERENCE_TIMEOUT");
  EXPECT_LT(ms_between(t0, Clock::now()), 4000.0 + 1000.0 * cpu_limit_s);
  JobStream next = run_job(w.port(), job_request("The cat", 3, 0.0));
  EXPECT_EQ(next.events.back().event, "end") << next.describe();
  EXPECT_EQ(w.stop(), 0);
}

long rss_kb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// 200 mixed requests from 16 concurrent clients: every stream well-formed and terminated,
// no lost or duplicated events, the worker healthy and its memory back near baseline.
// REQ: M0-W-1301 M0-W-1311 WRK-D9 WRK-D6 M0-W-1820
TEST(ConformanceConcurrency, TwoHundredMixedRequestsFromSixteenClients) {
  WorkerOptions o;
  o.model = stories_model();
  o.extra_args = {"--queue-depth", "16"};
  WorkerProcess w(o);
  // Warm up, then measure the baseline.
  run_job(w.port(), job_request("Once", 20, 0.0));
  const long rss0 = rss_kb(w.pid());
  std::atomic<int> ok{0}, invalid{0}, cancelled{0}, bad{0}, next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  auto client = [&](int cid) {
    for (int k; (k = next.fetch_add(1)) < 200;) {
      try {
        nlohmann::json req = job_request(k % 3 ? "Once upon a time" : "The dog and the cat",
                                         1 + (k * 7) % 60, (k % 4) * 0.4, 1000 + k);
        if (k % 5 == 0) req["stop"] = {"."};
        if (k % 17 == 0) req["max_tokens"] = 0;  // invalid: must be a 400
        const std::string path = k % 2 ? "/execute" : "/v2/execute";
        if (k % 23 == 5) {
          // A client that goes away early.
          SseStream s(w.port(), path, req);
          s.next_event(30s);
          s.close();
          ++cancelled;
          continue;
        }
        JobStream js = run_job(w.port(), req, {}, path);
        if (k % 17 == 0) {
          if (js.status == 400)
            ++invalid;
          else
            throw std::runtime_error("max_tokens 0 accepted");
          continue;
        }
        if (!js.violations.empty()) throw std::runtime_error(js.describe());
        if (js.events.back().event != "end") throw std::runtime_error(js.describe());
        if ((*js.started())["job_id"] != req["job_id"]) throw std::runtime_error("job_id mixup");
        const int n = (*js.terminal())["tokens_out"];
        if (n > req["max_tokens"].get<int>()) throw std::runtime_error("too many tokens");
        ++ok;
      } catch (const std::exception& e) {
        ++bad;
        std::lock_guard lk(mu);
        failures.push_back("client " + std::to_string(cid) + " request " + std::to_string(k) +
                           ": " + e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int c = 0; c < 16; ++c) threads.emplace_back(client, c);
  for (auto& t : threads) t.join();
  const double secs = ms_between(t0, Clock::now()) / 1000;
  EXPECT_EQ(bad.load(), 0) << (failures.empty() ? "" : failures.front());
  EXPECT_EQ(ok + invalid + cancelled + bad, 200);
  EXPECT_GE(wait_idle(w.port(), 30s), 0);
  auto h = http_get(w.port(), "/health").json();
  EXPECT_EQ(h["status"], "healthy");
  // Memory back to baseline: allow allocator slack, not per-request growth. Not in sanitizer
  // builds (ci/test.sh's ASan/TSan steps): ASan's quarantine and TSan's shadow memory grow RSS
  // by design; LeakSanitizer checks leaks there instead. The plain build checks the bound.
  const long rss1 = rss_kb(w.pid());
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(rss1 - rss0, 64 * 1024) << "RSS grew from " << rss0 << " kB to " << rss1 << " kB";
#endif
  RecordProperty("seconds", std::to_string(secs));
  RecordProperty("rss_growth_kb", std::to_string(rss1 - rss0));
  EXPECT_EQ(w.stop(), 0);
}

}  // namespace
}  // namespace conformance
