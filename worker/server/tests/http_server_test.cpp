// The HTTP layer in-process: HttpServer + JobRunner + the REAL CPU engine on stories260K,
// driven over real sockets (cpp-httplib client and raw sockets).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "server/http_server.h"
#include "test_support.h"

namespace worker::server {
namespace {
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Sse {
  std::vector<std::pair<std::string, json>> events;  // (event name, data)
  std::vector<std::string> comments;
};

Sse parse_sse(const std::string& body) {
  Sse s;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string frame = body.substr(pos, end - pos);
    pos = end + 2;
    if (frame.rfind(": ", 0) == 0) {
      s.comments.push_back(frame.substr(2));
      continue;
    }
    const size_t nl = frame.find('\n');
    EXPECT_EQ(frame.rfind("event: ", 0), 0u) << frame;
    EXPECT_EQ(frame.compare(nl + 1, 6, "data: "), 0) << frame;
    s.events.emplace_back(frame.substr(7, nl - 7), json::parse(frame.substr(nl + 7)));
  }
  EXPECT_EQ(pos, body.size()) << "trailing partial frame";
  return s;
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads from fd into got until got holds marker; false on EOF or an error first.
bool recv_until(int fd, const std::string& marker, std::string& got) {
  char buf[4096];
  while (got.find(marker) == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  return true;
}

void send_execute(int fd, const json& body_json) {
  const std::string body = body_json.dump();
  const std::string req =
      "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
}

class ServerHttp : public ::testing::Test {
 protected:
  void start(ServerConfig cfg = {}, bool attach = true, JobRunnerOptions ro = {}) {
    ASSERT_TRUE(testing::stories().model);
    engine_ = testing::make_controlled_engine(512);
    cfg.bind = "127.0.0.1";
    cfg.port = 0;
    cfg.worker_id = "123e4567-e89b-12d3-a456-426614174000";
    ro.queue_depth = cfg.queue_depth;
    const Tokenizer& tok = tok_ ? *tok_ : *testing::stories().tok;
    runner_ = std::make_unique<JobRunner>(*engine_, tok, ro, &metrics_);
    http_ = std::make_unique<HttpServer>(cfg, metrics_);
    std::string err;
    ASSERT_TRUE(http_->start(err)) << err;
    if (attach)
      http_->attach(*runner_, tok, engine_->n_ctx(), "stories260K",
                    {{"backend", "cpu"},
                     {"model", "stories260K"},
                     {"tokenizer_kind", "gguf-spm"},
                     {"vocab_size", 512},
                     {"context_length", 512},
                     {"resident", false},
                     {"quant_kind", "F32"}},
                    0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", http_->port());
    client_->set_read_timeout(20, 0);
  }
  void TearDown() override {
    if (http_) http_->begin_drain();
    if (runner_) runner_->stop(0ms);
    if (http_) {
      http_->wait_streams_closed(2s);
      http_->stop();
    }
  }
  httplib::Result post(const std::string& path, const json& body,
                       const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body.dump(), "application/json");
  }
  bool wait_busy(bool want, std::chrono::milliseconds limit = 3s) {
    const auto until = Clock::now() + limit;
    while (runner_->busy() != want && Clock::now() < until) std::this_thread::sleep_for(1ms);
    return runner_->busy() == want;
  }

  const Tokenizer* tok_ = nullptr;  // set before start(): replaces stories260K's
  std::unique_ptr<testing::ControlledEngine> engine_;
  Metrics metrics_;
  std::unique_ptr<JobRunner> runner_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<httplib::Client> client_;
};

// REQ: M0-W-1300 M0-W-1310 M0-W-1311 M0-W-1312 WRK-D6
TEST_F(ServerHttp, ExecuteStreamsSseWithRequiredHeaders) {
  start();
  auto r = post("/execute", {{"prompt", "Once upon a time"},
                             {"max_tokens", 25},
                             {"temperature", 0},
                             {"job_id", "job-1"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(r->get_header_value("Cache-Control"), "no-cache");
  EXPECT_EQ(r->get_header_value("X-Accel-Buffering"), "no");
  const Sse s = parse_sse(r->body);
  ASSERT_GE(s.events.size(), 3u);
  EXPECT_EQ(s.events.front().first, "started");
  EXPECT_EQ(s.events.front().second["job_id"], "job-1");
  EXPECT_TRUE(s.events.front().second["seed"].is_number_unsigned());  // generated seed reported
  for (size_t i = 1; i + 1 < s.events.size(); ++i) {
    EXPECT_EQ(s.events[i].first, "token");
    EXPECT_EQ(s.events[i].second["type"], "token");
    EXPECT_EQ(s.events[i].second["i"], static_cast<int>(i - 1));
  }
  EXPECT_EQ(s.events.back().first, "end");
  EXPECT_EQ(s.events.back().second["tokens_out"], 25);
  EXPECT_EQ(s.events.back().second["stop_reason"], "max_tokens");
  // The v2 alias serves the same stream.
  auto r2 = post("/v2/execute", {{"prompt", "Once upon a time"}, {"max_tokens", 3}});
  ASSERT_TRUE(r2);
  EXPECT_EQ(parse_sse(r2->body).events.back().first, "end");
}

// REQ: WRK-D6 M0-W-1600
TEST_F(ServerHttp, FirstTokenArrivesLongBeforeTheEnd) {
  start();
  engine_->eval_delay_ms = 15;
  const int fd = connect_to(http_->port());
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  send_execute(fd, json{{"prompt", "Once"}, {"max_tokens", 40}});
  std::optional<Clock::time_point> first_token;
  std::string got;
  char buf[4096];
  while (got.find("event: end") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
    if (!first_token && got.find("event: token") != std::string::npos) first_token = Clock::now();
  }
  const auto t_end = Clock::now();
  ::close(fd);
  ASSERT_TRUE(first_token);
  const double first_ms = std::chrono::duration<double, std::milli>(*first_token - t0).count();
  const double total_ms = std::chrono::duration<double, std::milli>(t_end - t0).count();
  // 40 forward passes of >= 15 ms: the end is >= 600 ms away; the first token is not.
  EXPECT_GT(total_ms - first_ms, 400.0) << "first " << first_ms << " total " << total_ms;
}

// REQ: M0-W-1302 WRK-D8 M0-W-1500 M0-W-1811
TEST_F(ServerHttp, ValidationErrorIs400WithDetailsAndNothingIsQueued) {
  start();
  auto r = post("/execute", {{"prompt", "secret words"}, {"top_p", 3}, {"bogus", true}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const json b = json::parse(r->body);
  EXPECT_EQ(b["error"]["code"], "INVALID_REQUEST");
  EXPECT_EQ(b["error"]["details"].size(), 2u);
  EXPECT_EQ(r->body.find("secret words"), std::string::npos);
  EXPECT_EQ(runner_->jobs_completed(), 0u);
  auto c = post("/execute", {{"prompt", "Once"}, {"max_tokens", 600}});  // context is 512
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 400);
  EXPECT_EQ(json::parse(c->body)["error"]["details"][0]["constraint"], "context_length");
}

// REQ: WRK-D8 WRK-D5
TEST_F(ServerHttp, HttpLevelErrorsAreJson) {
  start();
  auto nf = client_->Get("/nope");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(json::parse(nf->body)["error"]["code"], "NOT_FOUND");
  auto na = client_->Get("/execute");
  ASSERT_TRUE(na);
  EXPECT_EQ(na->status, 405);
  EXPECT_EQ(na->get_header_value("Allow"), "POST");
  EXPECT_TRUE(json::parse(na->body).contains("error"));
  auto ct = client_->Post("/execute", R"({"prompt":"x"})", "text/plain");
  ASSERT_TRUE(ct);
  EXPECT_EQ(ct->status, 415);
  EXPECT_TRUE(json::parse(ct->body).contains("error"));
  const std::string big = json{{"prompt", std::string(kMaxBodyBytes + 10, 'a')}}.dump();
  auto tl = client_->Post("/execute", big, "application/json");
  ASSERT_TRUE(tl);
  EXPECT_EQ(tl->status, 413);
  EXPECT_TRUE(json::parse(tl->body).contains("error"));
}

// REQ: WRK-D13
TEST_F(ServerHttp, ApiKeyGuardsEverythingButHealth) {
  ServerConfig cfg;
  cfg.api_key = "s3cret";
  start(cfg);
  auto h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  for (const char* path : {"/metrics", "/nope"}) {
    auto r = client_->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_TRUE(json::parse(r->body).contains("error"));
  }
  auto e = post("/execute", {{"prompt", "x"}}, {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 401);
  auto ok = post("/execute", {{"prompt", "Once"}, {"max_tokens", 2}},
                 {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto m = client_->Get("/metrics", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
}

// REQ: M0-W-1320 WRK-D12 M0-W-1604
TEST_F(ServerHttp, HealthIsCachedAndAnswersWhileAJobRuns) {
  start({}, /*attach=*/false);
  auto loading = client_->Get("/health");
  ASSERT_TRUE(loading);
  EXPECT_EQ(json::parse(loading->body)["status"], "loading");
  auto early = post("/execute", {{"prompt", "x"}});
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 503);
  http_->attach(*runner_, *testing::stories().tok, engine_->n_ctx(), "stories260K",
                {{"backend", "cpu"}, {"tokenizer_kind", "gguf-spm"}, {"vocab_size", 512}}, 0);

  engine_->eval_delay_ms = 20;
  std::thread streamer([&] {
    httplib::Client c("127.0.0.1", http_->port());
    c.set_read_timeout(30, 0);
    c.Post("/execute", json{{"prompt", "Once"}, {"max_tokens", 60}}.dump(), "application/json");
  });
  ASSERT_TRUE(wait_busy(true));
  std::vector<double> ms;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = Clock::now();
    auto h = client_->Get("/health");
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ASSERT_TRUE(h);
    if (i == 0) {
      const json j = json::parse(h->body);
      EXPECT_EQ(j["status"], "healthy");
      EXPECT_EQ(j["busy"], true);
      EXPECT_EQ(j["backend"], "cpu");
      EXPECT_EQ(j["tokenizer_kind"], "gguf-spm");
      EXPECT_EQ(j["vocab_size"], 512);
      EXPECT_TRUE(j.contains("uptime_seconds"));
      EXPECT_TRUE(j.contains("queue_depth"));
      EXPECT_TRUE(j.contains("vram_bytes_used"));
    }
  }
  std::sort(ms.begin(), ms.end());
  std::printf("health while busy: p50 %.3f ms p99 %.3f ms\n", ms[100], ms[197]);
  // Generous (shared 2-core CI machine); the conformance suite measures p99 < 10 ms.
  EXPECT_LT(ms[100], 50.0 * testing::kTimeScale);
  streamer.join();
}

// REQ: WRK-D9 M0-W-1301 WRK-D11
TEST_F(ServerHttp, FullQueueAnswers503WorkerBusyAndQueuedStreamGetsComments) {
  ServerConfig cfg;
  cfg.queue_depth = 1;
  start(cfg);
  engine_->eval_delay_ms = 20;
  std::string second_body;
  std::thread first([&] {
    httplib::Client c("127.0.0.1", http_->port());
    c.set_read_timeout(30, 0);
    c.Post("/execute", json{{"prompt", "Once"}, {"max_tokens", 60}}.dump(), "application/json");
  });
  ASSERT_TRUE(wait_busy(true));
  std::thread second([&] {
    httplib::Client c("127.0.0.1", http_->port());
    c.set_read_timeout(30, 0);
    auto r =
        c.Post("/execute", json{{"prompt", "Once"}, {"max_tokens", 3}}.dump(), "application/json");
    if (r) second_body = r->body;
  });
  const auto until = Clock::now() + 3s;
  while (runner_->queue_size() < 1 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  auto third = post("/execute", {{"prompt", "Once"}, {"max_tokens", 3}});
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 503);
  EXPECT_EQ(json::parse(third->body)["error"]["code"], "WORKER_BUSY");
  EXPECT_FALSE(third->get_header_value("Retry-After").empty());
  first.join();
  second.join();
  const Sse s = parse_sse(second_body);
  ASSERT_FALSE(s.comments.empty());
  EXPECT_EQ(s.comments.front(), "queued position 1");
  EXPECT_EQ(s.events.front().first, "started");
  EXPECT_EQ(s.events.back().first, "end");
  EXPECT_EQ(metrics_.requests("busy"), 1u);
}

// REQ: M0-W-1330 WRK-D10 M0-SYS-6.3.5
TEST_F(ServerHttp, CancelEndpointStopsTheStreamAndIsIdempotent) {
  start();
  engine_->eval_delay_ms = 20;
  std::string body;
  std::thread streamer([&] {
    httplib::Client c("127.0.0.1", http_->port());
    c.set_read_timeout(30, 0);
    auto r =
        c.Post("/execute", json{{"prompt", "Once"}, {"max_tokens", 400}, {"job_id", "c1"}}.dump(),
               "application/json");
    if (r) body = r->body;
  });
  ASSERT_TRUE(wait_busy(true));
  std::this_thread::sleep_for(60ms);
  auto c1 = client_->Post("/cancel/c1", "{}", "application/json");
  ASSERT_TRUE(c1);
  EXPECT_EQ(c1->status, 202);
  streamer.join();
  const Sse s = parse_sse(body);
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events.back().first, "error");
  EXPECT_EQ(s.events.back().second["code"], "CANCELLED");
  EXPECT_EQ(s.events.back().second["retriable"], false);
  auto again = post("/cancel", {{"job_id", "c1"}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 202);
  EXPECT_EQ(json::parse(again->body)["status"], "already_finished");
  auto unknown = post("/cancel", {{"job_id", "never"}});
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 202);
  EXPECT_EQ(json::parse(unknown->body)["status"], "unknown");
}

// REQ: M0-W-1611 WRK-D10
TEST_F(ServerHttp, ClosingTheSocketCancelsTheJob) {
  start();
  engine_->eval_delay_ms = 20;
  const int fd = connect_to(http_->port());
  ASSERT_GE(fd, 0);
  send_execute(fd, json{{"prompt", "Once"}, {"max_tokens", 400}});
  std::string got;
  ASSERT_TRUE(recv_until(fd, "event: token", got)) << got;
  const auto t0 = Clock::now();
  ::close(fd);
  ASSERT_TRUE(wait_busy(false, 2s));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("disconnect -> inference thread idle: %.1f ms\n", ms);
  EXPECT_LT(ms, (100.0 + 20.0) * testing::kTimeScale);  // 100 ms + the pass in flight
  EXPECT_EQ(metrics_.requests("cancelled"), 1u);
  // The worker keeps serving.
  auto r = post("/execute", {{"prompt", "Once"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(parse_sse(r->body).events.back().first, "end");
}

// REQ: M0-W-1611 WRK-D10 WRK-D9
TEST_F(ServerHttp, ClosingAQueuedStreamRemovesItFromTheQueue) {
  start();
  engine_->eval_delay_ms = 20;
  std::thread first([&] {
    httplib::Client c("127.0.0.1", http_->port());
    c.set_read_timeout(30, 0);
    c.Post("/execute", json{{"prompt", "Once"}, {"max_tokens", 60}}.dump(), "application/json");
  });
  ASSERT_TRUE(wait_busy(true));
  const int fd = connect_to(http_->port());
  ASSERT_GE(fd, 0);
  send_execute(fd, json{{"prompt", "Once"}, {"max_tokens", 60}});
  std::string got;
  ASSERT_TRUE(recv_until(fd, ": queued position 1", got)) << got;
  EXPECT_EQ(runner_->queue_size(), 1u);
  const auto t0 = Clock::now();
  ::close(fd);
  const auto until = t0 + 2s;
  while (runner_->queue_size() > 0 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_EQ(runner_->queue_size(), 0u);
  EXPECT_LT(ms, 100.0 * testing::kTimeScale);
  EXPECT_TRUE(runner_->busy()) << "the running job is not affected";
  first.join();
  EXPECT_EQ(metrics_.requests("ok"), 1u);
  EXPECT_EQ(metrics_.requests("cancelled"), 1u);
}

// REQ: WRK-D5
TEST_F(ServerHttp, OpenAiCompletionsStreamAndNonStream) {
  start();
  auto r =
      post("/v1/completions",
           {{"model", "x"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json full = json::parse(r->body);
  EXPECT_EQ(full["object"], "text_completion");
  EXPECT_EQ(full["model"], "x");
  EXPECT_EQ(full["usage"]["completion_tokens"], 8);
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  const std::string text = full["choices"][0]["text"];
  EXPECT_FALSE(text.empty());

  auto s = post("/v1/completions", {{"prompt", "Once upon a time"},
                                    {"max_tokens", 8},
                                    {"temperature", 0},
                                    {"stream", true},
                                    {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->get_header_value("Content-Type"), "text/event-stream");
  std::string streamed;
  std::vector<std::string> datas;
  size_t pos = 0;
  while ((pos = s->body.find("data: ", pos)) != std::string::npos) {
    const size_t e = s->body.find("\n\n", pos);
    datas.push_back(s->body.substr(pos + 6, e - pos - 6));
    pos = e;
  }
  ASSERT_GE(datas.size(), 3u);
  EXPECT_EQ(datas.back(), "[DONE]");
  const json usage = json::parse(datas[datas.size() - 2]);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 8);
  EXPECT_TRUE(usage["choices"].empty());
  for (size_t i = 0; i + 2 < datas.size(); ++i)
    streamed += json::parse(datas[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, text);  // greedy: stream and non-stream agree
}

// REQ: WRK-D5 WRK-D8
TEST_F(ServerHttp, OpenAiChatErrorsUseOpenAiShape) {
  start();
  // stories260K has no chat template: a clear 400, in the shape OpenAI clients parse.
  auto r = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const json e = json::parse(r->body);
  EXPECT_TRUE(e["error"]["message"].is_string());
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"].contains("code"));
  auto bad = post("/v1/chat/completions", {{"messages", json::array()}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

// stories260K's tokenizer, counting how often each text is encoded.
class CountingTokenizer final : public Tokenizer {
 public:
  explicit CountingTokenizer(const Tokenizer& inner) : inner_(inner) {}
  int encodes_of(const std::string& text) const {
    std::lock_guard lock(mu_);
    return static_cast<int>(std::count(seen_.begin(), seen_.end(), text));
  }
  std::string kind() const override { return inner_.kind(); }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override {
    {
      std::lock_guard lock(mu_);
      seen_.emplace_back(text);
    }
    return inner_.encode(text, add_special, parse_special);
  }
  std::string token_to_piece(int32_t id, bool special) const override {
    return inner_.token_to_piece(id, special);
  }
  std::optional<int32_t> bos_id() const override { return inner_.bos_id(); }
  std::optional<int32_t> eos_id() const override { return inner_.eos_id(); }
  bool is_eog(int32_t id) const override { return inner_.is_eog(id); }
  bool add_bos() const override { return inner_.add_bos(); }

 private:
  const Tokenizer& inner_;
  mutable std::mutex mu_;
  mutable std::vector<std::string> seen_;
};

// Issue 13: the prompt is tokenized once per request, at validation; the job runner and the
// engine run on those ids (before, generate() tokenized it a second time).
// REQ: M0-W-1302 WRK-D5 WRK-D8
TEST_F(ServerHttp, PromptIsTokenizedOncePerRequestOnEveryRoute) {
  CountingTokenizer counting(*testing::stories().tok);
  tok_ = &counting;
  start();
  const std::string prompt = "Once upon a time there was a cat";
  const size_t n_ids = testing::stories().tok->encode(prompt, true, false).size();
  auto r = post("/execute",
                {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"stop", {"zq"}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Sse s = parse_sse(r->body);
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events.front().second["prompt_tokens"], n_ids);
  EXPECT_EQ(s.events.back().first, "end") << r->body;
  EXPECT_EQ(counting.encodes_of(prompt), 1);
  EXPECT_EQ(counting.encodes_of("zq"), 1);  // the stop-length check: once too

  const std::string prompt2 = "The little dog ran home";
  auto o = post("/v1/completions", {{"prompt", prompt2}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_TRUE(o);
  ASSERT_EQ(o->status, 200) << o->body;
  EXPECT_EQ(json::parse(o->body)["usage"]["prompt_tokens"],
            testing::stories().tok->encode(prompt2, true, false).size());
  EXPECT_EQ(counting.encodes_of(prompt2), 1);
}

// REQ: M0-W-1350
TEST_F(ServerHttp, MetricsCountRequestsAndTokens) {
  start();
  auto r = post("/execute", {{"prompt", "Once"}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_TRUE(r);
  auto bad = post("/execute", {{"prompt", ""}});
  auto m = client_->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("worker_requests_total{outcome=\"ok\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("worker_requests_total{outcome=\"invalid\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("worker_tokens_generated_total 5"), std::string::npos);
  EXPECT_NE(m->body.find("worker_time_to_first_token_ms_count 1"), std::string::npos);
  EXPECT_NE(m->body.find("worker_inter_token_ms_count"), std::string::npos);
  EXPECT_NE(m->body.find("worker_uptime_seconds"), std::string::npos);
}

// REQ: M0-W-1340 WRK-D13
TEST_F(ServerHttp, ShutdownIsAcceptedAndNewJobsGet503) {
  start();
  auto r = client_->Post("/shutdown", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 202);
  EXPECT_TRUE(http_->wait_shutdown_requested(1s));
  auto e = post("/execute", {{"prompt", "Once"}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 503);
  auto h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["status"], "unhealthy");
}

// An idle keep-alive connection (a client that sent one request and keeps the socket open)
// does not hold up stop(): the connection's wait for the next request notices the stop
// within ~100 ms instead of running out its keep-alive time (5 s), which would eat the
// worker's 5 s shutdown deadline.
// REQ: M0-W-1340 M0-W-1630
TEST_F(ServerHttp, StopIsPromptWithAnIdleKeepAliveConnection) {
  start();
  const int fd = connect_to(http_->port());
  ASSERT_GE(fd, 0);
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string got;
  ASSERT_TRUE(recv_until(fd, "\r\n\r\n", got)) << got;
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  std::this_thread::sleep_for(200ms);  // the connection now waits for its next request
  const auto t0 = Clock::now();
  http_->begin_drain();
  runner_->stop(0ms);
  http_->stop();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_LT(ms.count(), 1000) << "stop() waited for the idle keep-alive connection";
  ::close(fd);
}

}  // namespace
}  // namespace worker::server
