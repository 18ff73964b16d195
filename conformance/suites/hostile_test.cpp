// Hostile clients and bad input (issue 15): slow and idle sockets, oversized chunked bodies,
// deep nesting, out-of-range numbers, disconnects on every route, half-close, pipelining,
// and the safe defaults. Each test here failed on f433621 (reports/reliability.md).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "harness/raw_socket.h"
#include "harness/suite.h"

namespace conformance {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int kHeadTimeoutSec = 2;  // --http-timeout-sec for the shared worker

class HostileTest : public SharedWorkerTest<HostileTest> {
 public:
  static WorkerOptions worker_options() {
    WorkerOptions o;
    o.model = slow_model();
    o.extra_args = {"--http-timeout-sec", std::to_string(kHeadTimeoutSec)};
    return o;
  }

 protected:
  void TearDown() override {
    if (!proc_ || !proc_->running()) return;
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < 30s) {
      auto h = http_get(port(), "/health").json();
      if (h["busy"] == false && h["queue_depth"] == 0) return;
      std::this_thread::sleep_for(5ms);
    }
    ADD_FAILURE() << "worker stayed busy";
  }
};

std::string post_head(const std::string& path, const std::string& extra) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
         "\r\n";
}

std::string post_raw(const std::string& path, const std::string& body, bool close = true) {
  return post_head(path, "Content-Length: " + std::to_string(body.size()) + "\r\n" +
                             (close ? "Connection: close\r\n" : "")) +
         body;
}

// Samples the worker's RSS until stopped; max() is the peak seen.
class RssSampler {
 public:
  explicit RssSampler(pid_t pid)
      : pid_(pid), t_([this] {
          while (!stop_.load()) {
            const size_t r = process_rss(pid_);
            size_t m = max_.load();
            while (r > m && !max_.compare_exchange_weak(m, r)) {
            }
            std::this_thread::sleep_for(2ms);
          }
        }) {}
  ~RssSampler() { finish(); }
  size_t finish() {
    stop_.store(true);
    if (t_.joinable()) t_.join();
    return max_.load();
  }

 private:
  pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> max_{0};
  std::thread t_;
};

double mib(size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// The execute_start line of a job not in `seen` (its job_id added to `seen`).
std::string next_started_job(WorkerProcess& w, std::set<std::string>& seen) {
  auto l = w.wait_for_log("execute_start", 20s,
                          [&](const json& j) { return !seen.count(j.value("job_id", "")); });
  if (!l) return {};
  const std::string id = l->json.value("job_id", "");
  seen.insert(id);
  return id;
}

// Row 1: slow-header and idle sockets no longer starve everyone else, and are closed.
// REQ: WRK-D19
TEST_F(HostileTest, SlowHeadersAndIdleSocketsLeaveHealthFast) {
  const long limit = raise_fd_limit();
  const int n_idle = static_cast<int>(std::min<long>(1000, limit - 400));
  const int n_slow = 200;
  ASSERT_GT(n_idle, 100) << "fd limit " << limit;
  std::vector<int> idle, slow;
  for (int i = 0; i < n_idle; ++i) idle.push_back(connect_loopback(port(), true));
  const auto slow_start = Clock::now();
  for (int i = 0; i < n_slow; ++i) {
    const int fd = connect_loopback(port());
    ASSERT_GE(fd, 0);
    send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {  // one header byte per socket every 250 ms, never a line end
    while (!stop.load()) {
      for (int fd : slow) ::send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(250ms);
    }
  });
  std::vector<double> ms;
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    RequestOptions o;
    o.timeout = 3s;
    try {
      auto r = http_get(port(), "/health", o);
      if (r.status != 200) ++failed;
      ms.push_back(ms_between(r.sent_at, r.done_at));
    } catch (const std::exception&) {
      ++failed;
    }
    std::this_thread::sleep_for(5ms);
  }
  // Every slow-header socket is closed by the head deadline (plus a poll slice).
  int slow_closed = 0;
  for (int fd : slow)
    slow_closed += peer_closes_within(
        fd,
        std::max<std::chrono::milliseconds>(
            20ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                      slow_start + std::chrono::seconds(kHeadTimeoutSec) + 1500ms - Clock::now())));
  const double held_s = ms_between(slow_start, Clock::now()) / 1000.0;
  stop.store(true);
  trickle.join();
  int idle_closed = 0;  // over the connection cap: the oldest idle ones went first
  for (int i = 0; i < 50; ++i) idle_closed += peer_closes_within(idle[i], 10ms);
  for (int fd : idle) ::close(fd);
  for (int fd : slow) ::close(fd);
  const double p50 = percentile(ms, 50), p99 = percentile(ms, 99);
  std::cout << "FIGURE row1: " << n_idle << " idle + " << n_slow
            << " slow-header connections: /health p50 " << p50 << " ms, p99 " << p99
            << " ms, failed " << failed << "/200; slow sockets closed " << slow_closed << "/"
            << n_slow << " within " << held_s << " s; oldest 50 idle closed " << idle_closed
            << "\n";
  EXPECT_EQ(failed, 0);
  EXPECT_LT(p99, 50.0);
  EXPECT_EQ(slow_closed, n_slow);
  EXPECT_EQ(idle_closed, 50);
}

// Row 1: a body trickled forever is cut at its deadline (3 x the head timeout).
// REQ: WRK-D19
TEST_F(HostileTest, SlowBodyIsCutAtItsDeadline) {
  const int fd = connect_loopback(port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, post_head("/execute", "Content-Length: 100000\r\n") + "{"));
  const auto t0 = Clock::now();
  bool closed = false;
  while (!closed && Clock::now() - t0 < std::chrono::seconds(3 * kHeadTimeoutSec + 3)) {
    ::send(fd, " ", 1, MSG_NOSIGNAL);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) closed = peer_closes_within(fd, 100ms);
  }
  const double s = ms_between(t0, Clock::now()) / 1000.0;
  ::close(fd);
  std::cout << "FIGURE row1-body: trickled body closed after " << s << " s\n";
  EXPECT_TRUE(closed) << "still open after " << s << " s";
}

// Row 2: the 1 MiB limit holds for chunked bodies, while they arrive.
// REQ: WRK-D19
TEST_F(HostileTest, ChunkedBodyOverTheLimitIs413AndMemoryStaysFlat) {
  const size_t base = process_rss(worker().pid());
  RssSampler rss(worker().pid());
  constexpr int kClients = 8;
  constexpr size_t kBodyBytes = 32u << 20;
  std::vector<int> status(kClients, 0);
  std::vector<std::string> bodies(kClients);
  std::vector<std::thread> ts;
  for (int c = 0; c < kClients; ++c) {
    ts.emplace_back([&, c] {
      const int fd = connect_loopback(port());
      if (fd < 0) return;
      std::string out = post_head("/execute", "Transfer-Encoding: chunked\r\n");
      const std::string piece(64 * 1024, 'a');
      std::string chunk = "10000\r\n" + piece + "\r\n";
      size_t sent_body = 0;
      bool first = true;
      ::fcntl(fd, F_SETFL, O_NONBLOCK);
      std::string resp;
      const auto deadline = Clock::now() + 30s;
      size_t off = 0;
      while (Clock::now() < deadline) {
        if (off == out.size() && sent_body < kBodyBytes) {
          out = first ? std::string("10000\r\n{\"prompt\":\"") + piece.substr(11) + "\r\n" : chunk;
          first = false;
          off = 0;
          sent_body += piece.size();
        }
        pollfd p{fd, static_cast<short>(POLLIN | (off < out.size() ? POLLOUT : 0)), 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        if (p.revents & POLLIN) {
          read_until_closed(fd, resp, 5s);
          break;
        }
        const ssize_t n = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
        if (n <= 0 && errno != EAGAIN) {
          read_until_closed(fd, resp, 5s);
          break;
        }
        if (n > 0) off += static_cast<size_t>(n);
      }
      ::close(fd);
      if (resp.rfind("HTTP/1.1 ", 0) == 0) status[c] = std::stoi(resp.substr(9, 3));
      bodies[c] = resp.substr(0, 400);
    });
  }
  for (auto& t : ts) t.join();
  const size_t peak = rss.finish();
  std::cout << "FIGURE row2: " << kClients << " x " << (kBodyBytes >> 20)
            << " MiB chunked uploads: RSS " << mib(base) << " MiB before, peak " << mib(peak)
            << " MiB (+" << mib(peak > base ? peak - base : 0) << ")\n";
  for (int c = 0; c < kClients; ++c) {
    EXPECT_EQ(status[c], 413) << bodies[c];
    EXPECT_NE(bodies[c].find("PAYLOAD_TOO_LARGE"), std::string::npos) << bodies[c];
  }
  EXPECT_LT(peak, base + (64u << 20)) << "peak RSS grew by " << mib(peak - base) << " MiB";
}

// Row 3: 1 MiB of '[' is refused before parsing, 40 at once, without the memory.
// REQ: WRK-D19
TEST_F(HostileTest, DeepNestingIsRefusedBeforeParsing) {
  const size_t base = process_rss(worker().pid());
  RssSampler rss(worker().pid());
  const std::string body((1u << 20) - 64, '[');
  std::vector<HttpResponse> rs(40);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < rs.size(); ++i)
    ts.emplace_back([&, i] { rs[i] = http_request(port(), "POST", "/execute", body); });
  for (auto& t : ts) t.join();
  const size_t peak = rss.finish();
  std::this_thread::sleep_for(200ms);
  const size_t after = process_rss(worker().pid());
  std::cout << "FIGURE row3: 40 x 1 MiB '[' bodies: RSS " << mib(base) << " MiB before, peak "
            << mib(peak) << " MiB, after " << mib(after) << " MiB\n";
  for (const auto& r : rs) {
    ASSERT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json()["error"]["code"], "INVALID_REQUEST");
    EXPECT_EQ(r.json()["error"]["details"][0]["constraint"], "depth") << r.body;
  }
  EXPECT_LT(peak, base + (160u << 20)) << "peak grew " << mib(peak - base) << " MiB";
  EXPECT_LT(after, base + (96u << 20)) << "kept " << mib(after - base) << " MiB";
}

// Row 4: 1e400 anywhere in a JSON body is a clean 400, never a 500 with library text.
// REQ: WRK-D19
TEST_F(HostileTest, OutOfRangeNumbersAreCleanBadRequests) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/execute", R"({"prompt":"Once","max_tokens":1e400})"},
      {"/execute", R"({"prompt":"Once","max_tokens":4,"temperature":-1e400})"},
      {"/v2/execute", R"({"prompt":"Once","x":[1,{"y":1E+999}]})"},
      {"/cancel", R"({"job_id":"a","n":1e400})"},
      {"/cancel/abc", R"({"n":1e400})"},
      {"/v1/completions", R"({"prompt":"Once","max_tokens":1e400})"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"temperature":1e400})"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"top_p":-9e999})"},
  };
  for (const auto& [path, body] : cases) {
    auto r = http_request(port(), "POST", path, body);
    EXPECT_EQ(r.status, 400) << path << " " << body << " -> " << r.body;
    json j;
    ASSERT_NO_THROW(j = r.json()) << r.body;
    ASSERT_TRUE(j["error"].is_object()) << r.body;
    EXPECT_TRUE(j["error"]["code"].is_string()) << r.body;
    const std::string msg = j["error"].value("message", "");
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
    EXPECT_NE(r.body.find("number_range"), std::string::npos) << r.body;
  }
}

// Row 6: a client that goes away is noticed within 100 ms on every route, streaming or
// not, and its job is cancelled.
// REQ: WRK-D19
TEST_F(HostileTest, DisconnectCancelsTheJobOnEveryRoute) {
  struct Route {
    std::string path;
    json body;
  };
  const std::vector<Route> routes = {
      {"/execute", {{"prompt", "Once"}, {"max_tokens", 2000}, {"temperature", 0}}},
      {"/v1/completions",
       {{"prompt", "Once"}, {"max_tokens", 2000}, {"temperature", 0}, {"stream", true}}},
      {"/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2000}, {"temperature", 0}}},
      {"/v2/execute", {{"prompt", "Once"}, {"max_tokens", 2000}, {"temperature", 0}}},
  };
  std::set<std::string> seen;
  for (const auto& l : worker().log_events("execute_start")) seen.insert(l.value("job_id", ""));
  std::vector<double> latencies, end_ms;
  for (const auto& r : routes) {
    for (int rep = 0; rep < 3; ++rep) {
      HttpConnection c("127.0.0.1", port());
      c.send_request("POST", r.path, r.body.dump(), {{"Content-Type", "application/json"}});
      const std::string id = next_started_job(worker(), seen);
      ASSERT_FALSE(id.empty()) << r.path;
      std::this_thread::sleep_for(50ms);
      c.close();
      const auto t0 = Clock::now();
      auto gone = worker().wait_for_log("client_gone", 10s,
                                        [&](const json& j) { return j.value("job_id", "") == id; });
      ASSERT_TRUE(gone.has_value()) << r.path << " job " << id << ": disconnect never noticed";
      const double ms = ms_between(t0, gone->arrival);
      latencies.push_back(ms);
      EXPECT_LT(ms, 100.0) << r.path << ": noticed " << ms << " ms after the client left";
      auto end = worker().wait_for_log("execute_end", 10s,
                                       [&](const json& j) { return j.value("job_id", "") == id; });
      ASSERT_TRUE(end.has_value()) << r.path << " job " << id << " never ended";
      EXPECT_EQ(end->json.value("outcome", ""), "cancelled") << r.path << " " << end->raw;
      end_ms.push_back(ms_between(t0, end->arrival));
      EXPECT_LT(end_ms.back(), 1000.0) << r.path << ": job still ran after the disconnect";
      EXPECT_LT(end->json.value("tokens_out", 0), 2000) << r.path;
    }
  }
  std::cout << "FIGURE row6: " << latencies.size()
            << " requests on 4 routes: close -> client_gone p50 " << percentile(latencies, 50)
            << " ms, max " << percentile(latencies, 100) << " ms; close -> execute_end p50 "
            << percentile(end_ms, 50) << " ms, max " << percentile(end_ms, 100) << " ms\n";
}

// Row 7: a client that half-closes (SHUT_WR) after its request gets the whole response;
// one that half-closes mid-stream still gets its terminal event.
// REQ: WRK-D19
TEST_F(HostileTest, HalfClosedClientsGetTheWholeResponse) {
  const json exec = {{"prompt", "Once"}, {"max_tokens", 24}, {"temperature", 0}};
  for (int rep = 0; rep < 3; ++rep) {
    HttpConnection c("127.0.0.1", port());
    c.send_request("POST", "/execute", exec.dump(), {{"Content-Type", "application/json"}});
    c.shutdown_write();
    c.read_head(30s);
    ASSERT_EQ(c.response().status, 200);
    std::string body;
    while (auto piece = c.read_body_piece(30s)) body += *piece;
    EXPECT_NE(body.find("event: end"), std::string::npos) << body.substr(0, 500);
    EXPECT_NE(body.find("event: started"), std::string::npos);
  }
  for (int rep = 0; rep < 3; ++rep) {
    HttpConnection c("127.0.0.1", port());
    c.send_request("POST", "/v1/completions", exec.dump(), {{"Content-Type", "application/json"}});
    c.shutdown_write();
    c.read_head(30s);
    ASSERT_EQ(c.response().status, 200);
    std::string body;
    while (auto piece = c.read_body_piece(30s)) body += *piece;
    const json j = json::parse(body);
    EXPECT_EQ(j["usage"]["completion_tokens"], 24) << body;
  }
  SseStream s(port(), "/execute",
              json{{"prompt", "Once"}, {"max_tokens", 200}, {"temperature", 0}});
  ASSERT_EQ(s.status(), 200);
  for (int tokens = 0; tokens < 3;) {
    auto e = s.next_event(30s);
    ASSERT_TRUE(e.has_value());
    tokens += e->event == "token";
  }
  s.half_close();
  const auto& evs = s.read_all(60s);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().event, "end") << "mid-stream half-close lost the terminal event";
}

// Row 8: pipelined requests on one connection are all answered, in order.
// REQ: WRK-D19
TEST_F(HostileTest, PipelinedRequestsAreAnsweredInOrder) {
  const std::string exec = json{{"prompt", "Once"}, {"max_tokens", 3}, {"temperature", 0}}.dump();
  const std::string wire = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                           post_raw("/execute", exec, false) +
                           "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" +
                           "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const int fd = connect_loopback(port());
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  ASSERT_TRUE(send_all(fd, wire));
  std::string out;
  EXPECT_TRUE(read_until_closed(fd, out, 10s));
  ::close(fd);
  const double ms = ms_between(t0, Clock::now());
  std::vector<size_t> at;
  for (size_t p = out.find("HTTP/1.1 200"); p != std::string::npos;
       p = out.find("HTTP/1.1 200", p + 1))
    at.push_back(p);
  ASSERT_EQ(at.size(), 4u) << out.substr(0, 2000);
  EXPECT_NE(out.find("\"status\":\"healthy\""), std::string::npos);
  const size_t end_ev = out.find("event: end"), models = out.find("\"object\":\"list\""),
               metrics = out.find("worker_requests_total");
  EXPECT_TRUE(at[0] < at[1] && at[1] < end_ev && end_ev < at[2] && at[2] < models &&
              models < at[3] && at[3] < metrics)
      << out.substr(0, 3000);
  EXPECT_LT(ms, 5000.0) << "answers waited for a timeout";
  std::cout << "FIGURE row8: 4 pipelined requests answered in order in " << ms << " ms\n";
}

// Row 10: header count and size caps, unknown methods at once.
// REQ: WRK-D20
TEST_F(HostileTest, HeaderFloodsAre431AndOtherMethods405AtOnce) {
  std::string many = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 200; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
  many += "\r\n";
  std::string big =
      "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'b') + "\r\n\r\n";
  for (const std::string& req : {many, big}) {
    const int fd = connect_loopback(port());
    ASSERT_GE(fd, 0);
    send_all(fd, req);
    std::string out;
    read_until_closed(fd, out, 5s);
    ::close(fd);
    EXPECT_EQ(out.rfind("HTTP/1.1 431", 0), 0u) << out.substr(0, 300);
    EXPECT_NE(out.find("\"error\""), std::string::npos) << out.substr(0, 300);
  }
  // 100 headers are still fine.
  RequestOptions o;
  for (int i = 0; i < 95; ++i) o.headers.push_back({"X-H" + std::to_string(i), "v"});
  EXPECT_EQ(http_get(port(), "/health", o).status, 200);

  for (const auto& [method, path, want] :
       std::vector<std::tuple<std::string, std::string, int>>{{"PUT", "/execute", 405},
                                                              {"DELETE", "/health", 405},
                                                              {"PATCH", "/shutdown", 405},
                                                              {"PUT", "/nowhere", 404}}) {
    const int fd = connect_loopback(port());
    ASSERT_GE(fd, 0);
    const auto t0 = Clock::now();
    send_all(fd, method + " " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string out;
    read_until_closed(fd, out, 10s);
    ::close(fd);
    const double ms = ms_between(t0, Clock::now());
    EXPECT_EQ(out.rfind("HTTP/1.1 " + std::to_string(want), 0), 0u)
        << method << " " << path << ": " << out.substr(0, 300);
    EXPECT_LT(ms, 1000.0) << method << " " << path << " answered after " << ms << " ms";
  }
}

// Row 10: /shutdown and /cancel refuse what a browser form or no-cors fetch can send.
// REQ: WRK-D20
TEST_F(HostileTest, ControlRoutesRefuseBrowserShapedRequests) {
  struct Case {
    std::string path, body, content_type;
  };
  const std::vector<Case> cases = {
      {"/shutdown", "", ""},
      {"/shutdown", "[1]", "application/json"},
      {"/shutdown", "a=b", "application/x-www-form-urlencoded"},
      {"/shutdown", "{}", "text/plain"},
      {"/shutdown", "--x\r\n\r\n--x--", "multipart/form-data; boundary=x"},
      {"/cancel/abc", "", ""},
      {"/cancel/abc", "{}", "text/plain"},
      {"/cancel", R"({"job_id":"abc"})", "text/plain"},
      {"/cancel", "job_id=abc", "application/x-www-form-urlencoded"},
  };
  for (const auto& c : cases) {
    RequestOptions o;
    o.content_type = c.content_type;
    auto r = http_request(port(), "POST", c.path, c.body, o);
    EXPECT_GE(r.status, 400) << c.path << " '" << c.body << "' " << c.content_type << " -> "
                             << r.status << " " << r.body;
    EXPECT_LT(r.status, 500) << r.body;
    ASSERT_TRUE(worker().running()) << "shut down by " << c.path << " " << c.content_type;
  }
  // The JSON shapes work.
  EXPECT_EQ(http_request(port(), "POST", "/cancel/abc", "{}").status, 202);
  EXPECT_EQ(http_request(port(), "POST", "/cancel", R"({"job_id":"abc"})").status, 202);
}

// Row 10: /health shows no filesystem path to a caller without the key.
// REQ: WRK-D20
TEST(HostileDefaults, HealthShowsNoPathsWithoutTheKey) {
  const std::string model = stories_model();
  {
    WorkerOptions o;
    o.model = model;
    WorkerProcess w(o);
    auto r = http_get(w.port(), "/health");
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.body.find(model), std::string::npos) << r.body;
    EXPECT_FALSE(r.json().contains("model_path")) << r.body;
    EXPECT_EQ(w.stop(), 0);
  }
  WorkerOptions o;
  o.model = model;
  o.extra_args = {"--api-key", "k3y"};
  WorkerProcess w(o);
  EXPECT_EQ(http_get(w.port(), "/health").body.find(model), std::string::npos);
  RequestOptions key;
  key.headers = {{"Authorization", "Bearer k3y"}};
  EXPECT_EQ(http_get(w.port(), "/health", key).json().value("model_path", ""), model);
  EXPECT_EQ(w.stop(), 0);
}

// Row 10: loopback unless --bind says otherwise; a public bind without a key warns.
// REQ: WRK-D20
TEST(HostileDefaults, BindsLoopbackByDefaultAndWarnsOnPublicBindWithoutKey) {
  WorkerOptions o;
  o.model = stories_model();
  o.pass_bind = false;
  WorkerProcess w(o);
  // /proc/net/tcp: the listening socket (state 0A) on our port, local address 127.0.0.1.
  std::ifstream tcp("/proc/" + std::to_string(w.pid()) + "/net/tcp");
  std::string line, listen_addr;
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, "%04X", w.port());
  while (std::getline(tcp, line)) {
    std::istringstream ls(line);
    std::string sl, local, remote, st;
    ls >> sl >> local >> remote >> st;
    if (st == "0A" && local.size() > 5 && local.substr(local.size() - 4) == port_hex)
      listen_addr = local.substr(0, local.size() - 5);
  }
  EXPECT_EQ(listen_addr, "0100007F") << "listening on " << listen_addr << " (hex, not 127.0.0.1)";
  auto start = w.wait_for_log("startup", 1s);
  ASSERT_TRUE(start);
  EXPECT_EQ(start->json.value("bind", ""), "127.0.0.1");
  EXPECT_TRUE(w.log_events("insecure_bind").empty());
  EXPECT_EQ(w.stop(), 0);

  WorkerOptions pub = o;
  pub.pass_bind = true;
  pub.extra_args = {"--bind", "0.0.0.0"};
  WorkerProcess wp(pub);
  auto warn = wp.wait_for_log("insecure_bind", 1s);
  ASSERT_TRUE(warn) << wp.log_text();
  EXPECT_EQ(warn->json.value("level", ""), "warn") << warn->raw;
  EXPECT_EQ(wp.stop(), 0);

  pub.extra_args = {"--bind", "0.0.0.0", "--api-key", "k"};
  WorkerProcess wk(pub);
  EXPECT_TRUE(wk.log_events("insecure_bind").empty());
  EXPECT_EQ(wk.stop(), 0);
}

// Row 10: SIGHUP and SIGQUIT stop the worker like SIGTERM: terminal event, log line, exit 0.
// REQ: WRK-D20
TEST(HostileDefaults, SighupAndSigquitStopLikeSigterm) {
  for (int sig : {SIGHUP, SIGQUIT}) {
    WorkerOptions o;
    o.model = slow_model();
    WorkerProcess w(o);
    SseStream s(w.port(), "/execute",
                json{{"prompt", "Once"}, {"max_tokens", 2000}, {"temperature", 0}});
    ASSERT_EQ(s.status(), 200);
    for (int tokens = 0; tokens < 2;) {
      auto e = s.next_event(30s);
      ASSERT_TRUE(e.has_value());
      tokens += e->event == "token";
    }
    w.send_signal(sig);
    const auto& evs = s.read_all(10s);
    ASSERT_FALSE(evs.empty());
    EXPECT_TRUE(evs.back().event == "end" || evs.back().event == "error")
        << "signal " << sig << ": stream ended without a terminal event";
    auto code = w.wait_exit(6s);
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0) << "signal " << sig;
    auto l = w.wait_for_log("signal", 1s);
    ASSERT_TRUE(l) << w.log_text();
    EXPECT_EQ(l->json.value("name", ""), sig == SIGHUP ? "HUP" : "QUIT");
  }
}

}  // namespace
}  // namespace conformance
