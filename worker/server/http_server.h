#pragma once
// The HTTP front (D5, D9, D12): cpp-httplib routes for /execute, /health, /cancel, /metrics,
// /shutdown and the OpenAI-compatible endpoints. Handlers validate, admit jobs to the
// JobRunner and drain each job's event channel into the response; they never run model code.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/http_conn.h"
#include "server/job_runner.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/request.h"

namespace worker::server {

struct ServerConfig {
  std::string bind = "127.0.0.1";
  int port = 8080;  // 0: any free port (tests)
  std::string api_key;
  size_t queue_depth = 16;
  std::string worker_id;
  HttpLimits limits;
};

inline constexpr size_t kMaxBodyBytes = 1 << 20;

class HttpServer {
 public:
  HttpServer(ServerConfig cfg, Metrics& metrics);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and serves on a background thread. Until attach(), /health says "loading" and
  // job routes answer 503. Returns false (with `error`) when the address cannot be bound.
  bool start(std::string& error);
  int port() const { return port_; }

  // The model is loaded: `health_static` holds the fixed /health fields (backend, model,
  // quant_kind, ...). The runner and tokenizer must outlive this server's use of them.
  void attach(JobRunner& runner, const Tokenizer& tok, int32_t n_ctx, std::string model_name,
              nlohmann::json health_static, uint64_t vram_bytes);

  // Shutdown, in the order main drives it: a request arrives (/shutdown or a signal), new
  // jobs get 503 from begin_drain() on, the runner finishes, open streams drain, stop().
  void request_shutdown();
  bool wait_shutdown_requested(std::chrono::milliseconds timeout);
  void begin_drain() { draining_.store(true); }
  bool wait_streams_closed(std::chrono::milliseconds timeout);
  void stop();

  size_t open_streams() const { return open_streams_.load(); }

 private:
  enum Guard : unsigned {
    kAuth = 1,
    kJson = 2,    // Content-Type must be application/json
    kReady = 8,   // model loaded
    kAdmit = 16,  // refuses while draining
  };
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  Handler guarded(unsigned guards, Handler h);
  void routes();

  void handle_execute(const httplib::Request& req, httplib::Response& res);
  void handle_openai(const httplib::Request& req, httplib::Response& res, OpenAiKind kind);
  void handle_cancel(const std::string& job_id, httplib::Response& res);
  void handle_health(const httplib::Request& req, httplib::Response& res);
  // POST routes read their body through this: the size limit holds for every transfer
  // encoding while the bytes arrive (httplib 0.11 does not bound chunked bodies).
  void post(const std::string& pattern, Handler h);
  // 401, 405 (with Allow) or 404 for a request no route takes.
  void not_routed(const httplib::Request& req, httplib::Response& res) const;

  // Admission result -> HTTP error (false) or true when queued.
  bool admit(const std::shared_ptr<Job>& job, httplib::Response& res);
  using Formatter = std::function<std::string(const JobEvent&)>;
  void stream_job(httplib::Response& res, const std::shared_ptr<Job>& job, Formatter fmt);
  // The request table, then the one tokenization; false (400 sent) on any violation.
  bool parse(const httplib::Request& req, httplib::Response& res, Route route, ParsedRequest& out);
  std::shared_ptr<Job> make_job(ParsedRequest&& pr);
  bool authorized(const httplib::Request& req) const;
  // The client of `job` went away: logged (client_gone) and the job cancelled.
  void client_gone(const std::shared_ptr<Job>& job);

  ServerConfig cfg_;
  Metrics& metrics_;
  GuardedServer svr_;
  std::thread thread_;
  int port_ = -1;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  // Set once by attach(); read by HTTP threads after ready_ is seen true.
  std::atomic<bool> ready_{false};
  JobRunner* runner_ = nullptr;
  const Tokenizer* tok_ = nullptr;
  int32_t n_ctx_ = 0;
  std::string model_name_;
  nlohmann::json health_static_;

  std::atomic<bool> draining_{false};
  std::mutex shutdown_mu_;
  std::condition_variable shutdown_cv_;
  bool shutdown_requested_ = false;
  std::atomic<size_t> open_streams_{0};
  std::once_flag stop_once_;
};

// {"error":{"code","message","type","retriable"}}: one shape that also satisfies OpenAI
// clients, which read error.message/type/code.
nlohmann::json error_body(ErrorCode code, const std::string& message);
nlohmann::json error_body(const std::string& code, const std::string& message,
                          const std::string& type, bool retriable);

}  // namespace worker::server
