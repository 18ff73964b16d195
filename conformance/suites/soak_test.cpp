// Soak (issue 15): 16 clients mix valid requests with every kind of misbehaviour for a
// bounded number of rounds (fixed seeds) while a poller times /health. Afterwards every
// admitted job started and ended exactly once, /metrics adds up to the clients' tally, and
// RSS, descriptors and /health latency are back where they were.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "harness/raw_socket.h"
#include "harness/suite.h"

namespace conformance {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int kClients = 16;
constexpr int kWarmupRounds = 100;  // same mix, other seeds: arenas and stacks settle
constexpr int kRoundsPerClient = 250;
constexpr auto kWallLimit = 120s;  // the rounds end earlier; this only bounds a slow machine

enum Action {
  kStream,
  kOpenAi,
  kBadJson,
  kHugeNumber,
  kOversized,
  kChunkedOversized,
  kCancel,
  kDisconnect,
  kHalfClose,
  kSlowReader,
  kSlowHeaders,
  kActionCount
};
const char* const kNames[] = {"stream",     "openai",      "bad_json",    "huge_number",
                              "oversized",  "chunked",     "cancel",      "disconnect",
                              "half_close", "slow_reader", "slow_headers"};

struct Tally {
  std::mutex mu;
  std::map<std::string, int> count;  // per action and per outcome
  std::vector<std::string> problems;
  int admitted = 0;  // answered 200 (a job was queued)
  int invalid = 0;   // answered 400 by validation
  void add(const std::string& k, int n = 1) {
    std::lock_guard l(mu);
    count[k] += n;
  }
  void problem(const std::string& p) {
    std::lock_guard l(mu);
    if (problems.size() < 50) problems.push_back(p);
  }
};

std::string mib_str(size_t bytes) {
  return std::to_string(static_cast<double>(bytes) / (1024.0 * 1024.0)).substr(0, 6);
}

std::map<std::string, double> requests_total(int port) {
  std::map<std::string, double> m;
  const std::string body = http_get(port, "/metrics").body;
  static const std::regex re(R"re(worker_requests_total\{outcome="([a-z_]+)"\} ([0-9.e+]+))re");
  for (std::sregex_iterator it(body.begin(), body.end(), re), end; it != end; ++it)
    m[(*it)[1]] = std::stod((*it)[2]);
  return m;
}

// One SSE stream read to its end: exactly one started (first) and one terminal (last).
void check_stream(Tally& t, const std::string& what, const std::vector<SseEvent>& evs) {
  int started = 0, terminal = 0;
  for (const auto& e : evs) {
    started += e.event == "started";
    terminal += e.event == "end" || e.event == "error";
  }
  if (started != 1 || terminal != 1 || evs.front().event != "started" ||
      (evs.back().event != "end" && evs.back().event != "error"))
    t.problem(what + ": started " + std::to_string(started) + " terminal " +
              std::to_string(terminal));
  if (!evs.empty()) t.add("terminal_" + evs.back().event);
}

void run_client(int port, int id, int rounds, Tally& t, Clock::time_point until) {
  std::mt19937 rng(20261126u + static_cast<unsigned>(id));
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < rounds && Clock::now() < until; ++round) {
    const auto a = static_cast<Action>(pick(0, kActionCount - 1));
    t.add(kNames[a]);
    const json job = {{"prompt", "Once upon a time"},
                      {"max_tokens", pick(4, 40)},
                      {"temperature", 0.8},
                      {"seed", pick(1, 1000)}};
    try {
      switch (a) {
        case kStream:
        case kSlowReader: {
          SseStream s(port, "/execute", job);
          if (s.status() != 200) {
            t.add("busy_or_error");
            s.read_body();
            break;
          }
          {
            std::lock_guard l(t.mu);
            ++t.admitted;
          }
          if (a == kSlowReader) {
            std::vector<SseEvent> evs;
            while (auto e = s.next_event(30s)) {
              evs.push_back(*e);
              std::this_thread::sleep_for(15ms);
            }
            check_stream(t, "slow_reader", evs);
          } else {
            check_stream(t, "stream", s.read_all(60s));
          }
          break;
        }
        case kOpenAi: {
          auto r = http_post_json(port, "/v1/completions", job);
          if (r.status == 200) {
            std::lock_guard l(t.mu);
            ++t.admitted;
          } else if (r.status != 503) {
            t.problem("openai " + std::to_string(r.status) + " " + r.body.substr(0, 200));
          }
          break;
        }
        case kBadJson:
        case kHugeNumber: {
          auto r =
              http_request(port, "POST", pick(0, 1) ? "/execute" : "/v1/completions",
                           a == kBadJson ? R"({"prompt":"x",)" : R"({"prompt":"x","seed":1e400})");
          if (r.status != 400 || !r.json()["error"].is_object())
            t.problem(std::string(kNames[a]) + " got " + std::to_string(r.status));
          std::lock_guard l(t.mu);
          ++t.invalid;
          break;
        }
        case kOversized:
        case kChunkedOversized: {
          const int fd = connect_loopback(port);
          const std::string big(2u << 20, 'a');
          std::string head =
              "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
          head += a == kOversized ? "Content-Length: " + std::to_string(big.size()) + "\r\n\r\n"
                                  : std::string("Transfer-Encoding: chunked\r\n\r\n");
          send_all(fd, head);
          if (a == kOversized) {
            send_all(fd, big.substr(0, 4096));
          } else {
            for (int c = 0; c < 40; ++c)
              if (!send_all(fd, "10000\r\n" + big.substr(0, 65536) + "\r\n")) break;
          }
          std::string out;
          read_until_closed(fd, out, 10s);
          ::close(fd);
          if (out.rfind("HTTP/1.1 413", 0) != 0)
            t.problem(std::string(kNames[a]) + ": " + out.substr(0, 100));
          break;
        }
        case kCancel:
        case kDisconnect: {
          json j = job;
          j["max_tokens"] = 400;
          j["job_id"] = "soak-" + std::to_string(id) + "-" + std::to_string(round);
          SseStream s(port, "/execute", j);
          if (s.status() != 200) {
            s.read_body();
            break;
          }
          {
            std::lock_guard l(t.mu);
            ++t.admitted;
          }
          std::vector<SseEvent> evs;
          const int want = pick(1, 4);
          for (int tok = 0; tok < want;) {
            auto e = s.next_event(30s);
            if (!e) break;
            evs.push_back(*e);
            tok += e->event == "token";
            if (e->event == "end" || e->event == "error") break;
          }
          if (a == kDisconnect) {
            s.close();
            break;
          }
          http_post_json(port, "/cancel", {{"job_id", j["job_id"]}});
          check_stream(t, "cancel", s.read_all(30s));  // every event, those taken included
          break;
        }
        case kHalfClose: {
          HttpConnection c("127.0.0.1", port);
          c.send_request("POST", "/execute", job.dump(), {{"Content-Type", "application/json"}});
          c.shutdown_write();
          c.read_head(30s);
          if (c.response().status != 200) break;
          {
            std::lock_guard l(t.mu);
            ++t.admitted;
          }
          std::string body;
          while (auto p = c.read_body_piece(30s)) body += *p;
          SseParser parser;
          parser.feed(body);
          check_stream(t, "half_close", parser.events());
          break;
        }
        case kSlowHeaders: {
          const int fd = connect_loopback(port);
          send_all(fd, "GET /health HTTP/1.1\r\nHost");
          // Stalls: the head deadline (1 s here) closes it.
          if (!peer_closes_within(fd, 3s)) t.problem("slow headers not closed in 3 s");
          ::close(fd);
          break;
        }
        case kActionCount: break;
      }
    } catch (const std::exception& e) {
      t.problem(std::string(kNames[a]) + " threw: " + e.what());
    }
  }
}

// REQ: WRK-D19 WRK-D20
TEST(Soak, SixteenHostileClientsLeaveNoTrace) {
  WorkerOptions o;
  o.model = stories_model();
  o.extra_args = {"--http-timeout-sec", "1", "--queue-depth", "32"};
  WorkerProcess w(o);
  const int port = w.port();
  // Warm-up with the same mix (other seeds) so allocator arenas, pool threads and their
  // stacks are in the baseline; what the soak adds after that would be a leak.
  {
    Tally warm;
    std::vector<std::thread> ts;
    for (int i = 0; i < kClients; ++i)
      ts.emplace_back(run_client, port, 1000 + i, kWarmupRounds, std::ref(warm),
                      Clock::now() + 60s);
    for (auto& c : ts) c.join();
    for (const auto& p : warm.problems) ADD_FAILURE() << "warm-up: " << p;
  }
  std::this_thread::sleep_for(1500ms);  // slow-header sockets of the warm-up time out
  const auto metrics0 = requests_total(port);
  const size_t rss0 = process_rss(w.pid()), fds0 = process_fds(w.pid());

  std::atomic<bool> done{false};
  std::vector<double> health_ms;
  int health_fail = 0;
  std::thread poller([&] {
    while (!done.load()) {
      try {
        RequestOptions ro;
        ro.timeout = 2s;
        auto r = http_get(port, "/health", ro);
        health_ms.push_back(ms_between(r.sent_at, r.done_at));
        if (r.status != 200) ++health_fail;
      } catch (const std::exception&) {
        ++health_fail;
      }
      std::this_thread::sleep_for(20ms);
    }
  });
  Tally t;
  const auto t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back(run_client, port, i, kRoundsPerClient, std::ref(t), t0 + kWallLimit);
  for (auto& c : clients) c.join();
  const double soak_s = ms_between(t0, Clock::now()) / 1000.0;
  done.store(true);
  poller.join();

  // Let the worker notice the last closes, then compare.
  for (auto until = Clock::now() + 5s; Clock::now() < until;) {
    auto h = http_get(port, "/health").json();
    if (h["busy"] == false && h["queue_depth"] == 0 && process_fds(w.pid()) <= fds0) break;
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(1500ms);  // as before the baseline
  const size_t rss1 = process_rss(w.pid()), fds1 = process_fds(w.pid());
  const auto metrics1 = requests_total(port);
  auto delta = [&](const std::string& k) {
    const double a = metrics0.count(k) ? metrics0.at(k) : 0,
                 b = metrics1.count(k) ? metrics1.at(k) : 0;
    return static_cast<int>(b - a);
  };
  const int jobs_done = delta("ok") + delta("cancelled") + delta("timeout") + delta("error");

  // Every job the worker started ended exactly once; no job ended twice.
  std::map<std::string, int> starts, ends;
  for (const auto& j : w.log_events("execute_start")) ++starts[j.value("job_id", "")];
  for (const auto& j : w.log_events("execute_end")) ++ends[j.value("job_id", "")];
  int start_dups = 0, end_dups = 0, unended = 0;
  for (const auto& [id, n] : starts) {
    start_dups += n > 1;
    unended += !ends.count(id);
  }
  for (const auto& [id, n] : ends) end_dups += n > 1;

  std::cout << "SOAK " << soak_s << " s, " << kClients << " clients x " << kRoundsPerClient
            << " rounds (seed 20261126+i)\n  actions:";
  for (int a = 0; a < kActionCount; ++a) std::cout << " " << kNames[a] << "=" << t.count[kNames[a]];
  std::cout << "\n  streams: end=" << t.count["terminal_end"]
            << " error=" << t.count["terminal_error"] << "; admitted=" << t.admitted
            << " invalid=" << t.invalid << "\n  metrics delta: ok=" << delta("ok")
            << " cancelled=" << delta("cancelled") << " timeout=" << delta("timeout")
            << " error=" << delta("error") << " invalid=" << delta("invalid")
            << " busy=" << delta("busy") << "\n  log: started " << starts.size() << " ended "
            << ends.size() << " (dup starts " << start_dups << ", dup ends " << end_dups
            << ", unended " << unended << ")\n  RSS " << mib_str(rss0) << " -> " << mib_str(rss1)
            << " MiB; fds " << fds0 << " -> " << fds1 << "; /health n=" << health_ms.size()
            << " p50 " << percentile(health_ms, 50) << " ms p99 " << percentile(health_ms, 99)
            << " ms max " << percentile(health_ms, 100) << " ms, failed " << health_fail << "\n";
  for (const auto& p : t.problems) ADD_FAILURE() << p;
  EXPECT_EQ(jobs_done, t.admitted) << "metrics outcomes vs. requests answered 200";
  EXPECT_EQ(delta("invalid"), t.invalid);
  EXPECT_EQ(start_dups, 0);
  EXPECT_EQ(end_dups, 0);
  EXPECT_EQ(unended, 0);
  EXPECT_LE(static_cast<double>(rss1), 1.10 * static_cast<double>(rss0));
  EXPECT_LE(fds1, fds0);
  EXPECT_EQ(health_fail, 0);
  EXPECT_LT(percentile(health_ms, 99), 50.0);
  EXPECT_EQ(w.stop(), 0);
}

}  // namespace
}  // namespace conformance
