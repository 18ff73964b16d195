#include "server/http_server.h"

#include <algorithm>
#include <cctype>
#include <random>

#include <sys/socket.h>

#include "common/log.h"
#include "server/json_guard.h"
#include "server/sse.h"
#include "tokenizer/tokenizer.h"

namespace worker::server {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;

constexpr auto kPollInterval = 20ms;  // stream wake-up for disconnect checks
constexpr auto kQueuedCommentEvery = 1s;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_too_large(httplib::Response& res) {
  send_json(res, 413,
            error_body("PAYLOAD_TOO_LARGE", "request body exceeds 1 MiB", "invalid_request_error",
                       false));
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_json_content_type(const httplib::Request& req) {
  const std::string ct = lower(req.get_header_value("Content-Type"));
  return ct.rfind("application/json", 0) == 0 &&
         (ct.size() == 16 || ct[16] == ';' || ct[16] == ' ');
}

// Routes and the methods they accept, for 405 answers.
std::string allowed_methods(const std::string& path) {
  if (path == "/health" || path == "/metrics" || path == "/v1/models") return "GET";
  if (path == "/execute" || path == "/v2/execute" || path == "/cancel" || path == "/shutdown" ||
      path == "/v1/chat/completions" || path == "/v1/completions" ||
      (path.rfind("/cancel/", 0) == 0 && path.size() > 8 && path.find('/', 8) == std::string::npos))
    return "POST";
  return {};
}

std::string new_job_id() {
  static thread_local std::mt19937_64 gen{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "job-%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}

const char* error_type_for(int status) {
  if (status == 401) return "authentication_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

// Each open SSE stream holds one pool thread for its lifetime: keep enough threads warm that
// a full queue of streams still leaves some for /health, /cancel and /metrics.
HttpLimits limits_for(const ServerConfig& cfg) {
  HttpLimits l = cfg.limits;
  l.min_threads = std::max(l.min_threads, cfg.queue_depth + 24);
  return l;
}

std::string early_error_json(int status, const std::string& message) {
  const char* code = status == 431 ? "HEADERS_TOO_LARGE" : "WORKER_BUSY";
  return dump_json(error_body(code, message, error_type_for(status), status == 503));
}

void close_after(httplib::Response& res) {
  res.set_header("Connection", "close");
  if (Connection* c = current_connection()) c->close_after_response();
}

}  // namespace

json error_body(const std::string& code, const std::string& message, const std::string& type,
                bool retriable) {
  return {
      {"error", {{"code", code}, {"message", message}, {"type", type}, {"retriable", retriable}}}};
}

json error_body(ErrorCode code, const std::string& message) {
  return error_body(std::string(error_code_name(code)), message,
                    error_type_for(error_http_status(code)), error_retriable(code));
}

HttpServer::HttpServer(ServerConfig cfg, Metrics& metrics)
    : cfg_(std::move(cfg)), metrics_(metrics), svr_(limits_for(cfg_), early_error_json) {
  routes();
}

HttpServer::~HttpServer() {
  stop();
}

bool HttpServer::start(std::string& error) {
  if (cfg_.port == 0) {
    port_ = svr_.bind_to_any_port(cfg_.bind);
  } else if (svr_.bind_to_port(cfg_.bind, cfg_.port)) {
    port_ = cfg_.port;
  }
  if (port_ <= 0) {
    error = "cannot listen on " + cfg_.bind + ":" + std::to_string(cfg_.port) +
            " (port in use, not permitted, or bad address)";
    return false;
  }
  svr_.widen_backlog();
  thread_ = std::thread([this] { svr_.listen_after_bind(); });
  // stop() is a no-op until the accept loop runs; wait for it so an early stop() (a failed
  // model load) cannot leave the loop running forever.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!svr_.is_running() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return true;
}

void HttpServer::attach(JobRunner& runner, const Tokenizer& tok, int32_t n_ctx,
                        std::string model_name, json health_static, uint64_t vram_bytes) {
  runner_ = &runner;
  tok_ = &tok;
  n_ctx_ = n_ctx;
  model_name_ = std::move(model_name);
  health_static_ = std::move(health_static);
  metrics_.set_vram_bytes(vram_bytes);
  ready_.store(true, std::memory_order_release);
}

void HttpServer::request_shutdown() {
  {
    std::lock_guard lock(shutdown_mu_);
    shutdown_requested_ = true;
  }
  shutdown_cv_.notify_all();
}

bool HttpServer::wait_shutdown_requested(std::chrono::milliseconds timeout) {
  std::unique_lock lock(shutdown_mu_);
  return shutdown_cv_.wait_for(lock, timeout, [&] { return shutdown_requested_; });
}

bool HttpServer::wait_streams_closed(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (open_streams_.load() > 0) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

void HttpServer::stop() {
  std::call_once(stop_once_, [&] {
    svr_.stop();
    if (thread_.joinable()) thread_.join();
  });
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (cfg_.api_key.empty()) return true;
  return req.get_header_value("Authorization") == "Bearer " + cfg_.api_key;
}

HttpServer::Handler HttpServer::guarded(unsigned guards, Handler h) {
  return [this, guards, h = std::move(h)](const httplib::Request& req, httplib::Response& res) {
    if ((guards & kAuth) && !authorized(req)) {
      metrics_.count_request("unauthorized");
      res.set_header("WWW-Authenticate", "Bearer");
      return send_json(res, 401,
                       error_body("UNAUTHORIZED", "missing or wrong Authorization: Bearer <key>",
                                  "authentication_error", false));
    }
    if ((guards & kJson) && !is_json_content_type(req))
      return send_json(res, 415,
                       error_body("UNSUPPORTED_MEDIA_TYPE", "Content-Type must be application/json",
                                  "invalid_request_error", false));
    if ((guards & kJson) && !req.body.empty()) {
      if (auto e = check_json_limits(req.body)) {
        metrics_.count_request("invalid");
        const std::vector<FieldViolation> v{{e->field, e->rule, e->message}};
        return send_json(
            res, 400, req.path.rfind("/v1/", 0) == 0 ? openai_invalid(v) : invalid_request_body(v));
      }
    }
    if ((guards & kAdmit) && draining_.load()) {
      metrics_.count_request("busy");
      res.set_header("Retry-After", "5");
      return send_json(res, 503,
                       error_body("WORKER_BUSY", "worker is shutting down", "server_error", true));
    }
    if ((guards & kReady) && !ready_.load(std::memory_order_acquire)) {
      res.set_header("Retry-After", "1");
      return send_json(res, 503,
                       error_body("WORKER_BUSY", "model is loading", "server_error", true));
    }
    h(req, res);
  };
}

void HttpServer::routes() {
  svr_.set_payload_max_length(kMaxBodyBytes);
  // cpp-httplib's default also sets SO_REUSEPORT, which lets a second worker bind a port
  // that is in use; keep only SO_REUSEADDR so a busy port is an error (exit 1).
  svr_.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Behind a load balancer every answer names the worker that gave it (errors included).
  svr_.set_default_headers({{"X-Worker-Id", cfg_.worker_id}});

  svr_.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    handle_health(req, res);
  });
  svr_.Get("/metrics", guarded(kAuth, [this](const httplib::Request&, httplib::Response& res) {
             if (runner_) metrics_.set_queue_depth(static_cast<int64_t>(runner_->queue_size()));
             res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
           }));
  const Handler execute = guarded(kAuth | kJson | kReady | kAdmit,
                                  [this](const auto& req, auto& res) { handle_execute(req, res); });
  post("/execute", execute);
  post("/v2/execute", execute);
  // Control routes need Content-Type application/json and an empty or JSON-object body:
  // neither a form nor a no-cors fetch can send that cross-origin without a preflight,
  // which is never granted.
  post("/cancel", guarded(kAuth | kJson, [this](const auto& req, auto& res) {
         const json j = json::parse(req.body, nullptr, false);
         if (j.is_discarded())
           return send_json(res, 400, invalid_request_body({{"body", "json", "invalid JSON"}}));
         if (!j.is_object() || !j.contains("job_id") || !j["job_id"].is_string() ||
             j["job_id"].get_ref<const std::string&>().empty())
           return send_json(
               res, 400,
               invalid_request_body({{"job_id", "required", "job_id must be a non-empty string"}}));
         handle_cancel(j["job_id"].get<std::string>(), res);
       }));
  const auto json_object_body = [](const httplib::Request& req, httplib::Response& res) {
    if (req.body.empty() || json::parse(req.body, nullptr, false).is_object()) return true;
    send_json(res, 400,
              invalid_request_body({{"body", "json", "the body must be empty or a JSON object"}}));
    return false;
  };
  post(R"(/cancel/([^/]+))",
       guarded(kAuth | kJson, [this, json_object_body](const auto& req, auto& res) {
         if (json_object_body(req, res)) handle_cancel(req.path.substr(8), res);  // "/cancel/"
       }));
  post("/shutdown", guarded(kAuth | kJson, [this, json_object_body](const auto& req, auto& res) {
         if (!json_object_body(req, res)) return;
         draining_.store(true);
         send_json(res, 202, {{"status", "shutting_down"}});
         request_shutdown();
       }));
  // Decided from the head alone, before any body byte is read: anything no route takes is
  // answered at once (httplib would first read a body until EOF), and so is a body over
  // the limit; the connection then closes, as its body stays unread.
  svr_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    using R = httplib::Server::HandlerResponse;
    const bool has_body =
        req.has_header("Transfer-Encoding") ||
        (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
    if (req.method == "GET" || req.method == "HEAD") {
      if (has_body) close_after(res);  // GET bodies are never read
      return R::Unhandled;
    }
    if (req.method != "POST" || allowed_methods(req.path) != "POST") {
      close_after(res);
      not_routed(req, res);
      return R::Handled;
    }
    if (!req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
      // `curl -X POST`: nothing follows the headers; httplib would wait for EOF.
      if (!authorized(req)) {
        send_json(res, 401,
                  error_body("UNAUTHORIZED", "missing or wrong Authorization: Bearer <key>",
                             "authentication_error", false));
      } else {
        send_json(res, 411,
                  error_body("LENGTH_REQUIRED", "a JSON body with Content-Length is required",
                             "invalid_request_error", false));
      }
      return R::Handled;
    }
    if (req.has_header("Content-Length") &&
        std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) >
            kMaxBodyBytes) {
      close_after(res);
      send_too_large(res);
      return R::Handled;
    }
    return R::Unhandled;
  });
  post("/v1/chat/completions",
       guarded(kAuth | kJson | kReady | kAdmit,
               [this](const auto& req, auto& res) { handle_openai(req, res, OpenAiKind::Chat); }));
  post("/v1/completions",
       guarded(kAuth | kJson | kReady | kAdmit, [this](const auto& req, auto& res) {
         handle_openai(req, res, OpenAiKind::Completion);
       }));
  svr_.Get("/v1/models", guarded(kAuth | kReady, [this](const auto&, auto& res) {
             send_json(res, 200,
                       {{"object", "list"},
                        {"data", json::array({{{"id", model_name_},
                                               {"object", "model"},
                                               {"created", 0},
                                               {"owned_by", "worker-orcd"}}})}});
           }));

  // Every error answer is JSON. Handlers that already wrote a body keep it.
  // Every error answer is JSON. Handlers that already wrote a body keep it.
  svr_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404 || res.status == 405) return not_routed(req, res);
    if (res.status == 413) return send_too_large(res);
    send_json(res, res.status,
              error_body(res.status >= 500 ? "INTERNAL" : "BAD_REQUEST",
                         "HTTP " + std::to_string(res.status), error_type_for(res.status), false));
  });
  svr_.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        log::error("error", {{"code", "INTERNAL"}, {"message", what}});
        send_json(res, 500, error_body(ErrorCode::Internal, "internal error: " + what));
      });
}

void HttpServer::not_routed(const httplib::Request& req, httplib::Response& res) const {
  if (!authorized(req) && req.path != "/health") {
    res.set_header("WWW-Authenticate", "Bearer");
    return send_json(res, 401,
                     error_body("UNAUTHORIZED", "missing or wrong Authorization: Bearer <key>",
                                "authentication_error", false));
  }
  const std::string allow = allowed_methods(req.path);
  if (!allow.empty()) {
    res.set_header("Allow", allow);
    return send_json(
        res, 405,
        error_body("METHOD_NOT_ALLOWED", req.method + " is not allowed here; use " + allow,
                   "invalid_request_error", false));
  }
  send_json(res, 404, error_body("NOT_FOUND", "no such route", "invalid_request_error", false));
}

void HttpServer::post(const std::string& pattern, Handler h) {
  svr_.Post(pattern, [h = std::move(h)](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& read) {
    if (req.is_multipart_form_data()) {  // httplib reads those only part by part
      close_after(res);
      return send_json(res, 415,
                       error_body("UNSUPPORTED_MEDIA_TYPE", "Content-Type must be application/json",
                                  "invalid_request_error", false));
    }
    std::string body;
    bool too_large = false;
    const bool ok = read([&](const char* data, size_t n) {
      too_large = body.size() + n > kMaxBodyBytes;
      if (!too_large) body.append(data, n);
      return !too_large;
    });
    if (too_large || res.status == 413) {
      close_after(res);
      return send_too_large(res);
    }
    if (!ok) {
      close_after(res);
      return send_json(res, 400,
                       error_body("BAD_REQUEST", "the request body could not be read",
                                  "invalid_request_error", false));
    }
    httplib::Request with_body = req;
    with_body.body = std::move(body);
    h(with_body, res);
  });
}

void HttpServer::handle_health(const httplib::Request& req, httplib::Response& res) {
  // Cached state only: atomics and the JSON fixed at attach(); never the inference thread.
  const bool ready = ready_.load(std::memory_order_acquire);
  json h = ready ? health_static_ : json::object();
  // Filesystem paths only for a caller holding the key (none when no key is configured).
  if (cfg_.api_key.empty() || !authorized(req)) h.erase("model_path");
  std::string status = "loading";
  if (ready)
    status = (draining_.load() || (runner_ && runner_->degraded())) ? "unhealthy" : "healthy";
  h["status"] = status;
  h["worker_id"] = cfg_.worker_id;
  h["uptime_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  h["busy"] = ready && runner_ && runner_->busy();
  h["queue_depth"] = ready && runner_ ? runner_->queue_size() : 0;
  // Updated by the inference thread after every job (KV cache + scratch included).
  h["vram_bytes_used"] = metrics_.vram_bytes();
  send_json(res, status == "loading" ? 503 : 200, h);
}

void HttpServer::client_gone(const std::shared_ptr<Job>& job) {
  log::info("client_gone", {{"job_id", job->id}});
  runner_->cancel_job(job, CancelReason::Disconnect);
}

void HttpServer::handle_cancel(const std::string& job_id, httplib::Response& res) {
  std::string status = "unknown";
  if (runner_) {
    switch (runner_->cancel(job_id, CancelReason::Request)) {
      case JobRunner::CancelResult::CancelledRunning: status = "cancelling"; break;
      case JobRunner::CancelResult::RemovedQueued: status = "cancelled"; break;
      case JobRunner::CancelResult::AlreadyFinished: status = "already_finished"; break;
      case JobRunner::CancelResult::Unknown: status = "unknown"; break;
    }
  }
  log::info("cancel_request", {{"job_id", job_id}, {"status", status}});
  send_json(res, 202, {{"job_id", job_id}, {"status", status}});
}

bool HttpServer::parse(const httplib::Request& req, httplib::Response& res, Route route,
                       ParsedRequest& out) {
  auto v = parse_request(req.body, route, out);
  if (v.empty()) v = prepare_prompt(out, *tok_, n_ctx_);
  if (v.empty()) return true;
  metrics_.count_request("invalid");
  send_json(res, 400, route == kExecute ? invalid_request_body(v) : openai_invalid(v));
  return false;
}

std::shared_ptr<Job> HttpServer::make_job(ParsedRequest&& pr) {
  auto job = std::make_shared<Job>();
  job->id = pr.job_id.empty() ? new_job_id() : pr.job_id;
  job->request = std::move(pr.gen);
  if (!pr.seed_given) job->request.sampling.seed = random_seed();
  job->prompt_is_template = pr.prompt_is_template;
  job->model = model_name_;
  job->worker_id = cfg_.worker_id;
  return job;
}

bool HttpServer::admit(const std::shared_ptr<Job>& job, httplib::Response& res) {
  switch (runner_->submit(job)) {
    case JobRunner::Admission::Accepted: return true;
    case JobRunner::Admission::Busy:
      metrics_.count_request("busy");
      res.set_header("Retry-After", "1");
      send_json(res, 503,
                error_body(ErrorCode::WorkerBusy, "admission queue is full (--queue-depth " +
                                                      std::to_string(cfg_.queue_depth) + ")"));
      return false;
    case JobRunner::Admission::ShuttingDown:
      metrics_.count_request("busy");
      res.set_header("Retry-After", "5");
      send_json(res, 503, error_body(ErrorCode::WorkerBusy, "worker is shutting down"));
      return false;
    case JobRunner::Admission::DuplicateId:
      metrics_.count_request("invalid");
      send_json(res, 400,
                invalid_request_body({{"job_id", "unique", "a job with this job_id is active"}}));
      return false;
  }
  return false;
}

void HttpServer::handle_execute(const httplib::Request& req, httplib::Response& res) {
  ParsedRequest pr;
  if (!parse(req, res, kExecute, pr)) return;
  auto job = make_job(std::move(pr));
  if (!admit(job, res)) return;
  stream_job(res, job, [](const JobEvent& ev) { return sse_event(ev.type(), ev.data); });
}

void HttpServer::stream_job(httplib::Response& res, const std::shared_ptr<Job>& job,
                            Formatter fmt) {
  struct StreamState {
    std::shared_ptr<Job> job;
    Formatter fmt;
    Connection* conn = nullptr;
    size_t last_pos = 0;
    std::chrono::steady_clock::time_point last_comment{};
  };
  auto st = std::make_shared<StreamState>();
  st->job = job;
  st->fmt = std::move(fmt);
  st->conn = current_connection();
  open_streams_.fetch_add(1);
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_header("X-Job-Id", job->id);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) -> bool {
        auto gone = [&] {
          client_gone(st->job);
          return false;
        };
        // A FIN means close or half-close: a comment probes it (a closed peer answers RST,
        // seen by the next check); a half-closed client still gets the whole stream.
        auto peer_gone = [&] {
          if (!st->conn) return false;
          if (st->conn->peer() == Connection::Peer::Gone) return true;
          if (!st->conn->probe_due()) return false;
          st->conn->probed();
          const std::string probe = sse_comment("ping");
          return !sink.write(probe.data(), probe.size());
        };
        auto first = st->job->events.pop(kPollInterval);
        std::string out;
        bool terminal = false;
        if (first) {
          std::vector<JobEvent> evs;
          evs.push_back(std::move(*first));
          for (auto& e : st->job->events.drain()) evs.push_back(std::move(e));
          for (const auto& e : evs) {
            out += st->fmt(e);
            if (e.terminal()) {
              terminal = true;
              break;  // nothing follows the terminal event
            }
          }
        } else {
          if (peer_gone()) return gone();
          const size_t pos = runner_->queue_position(*st->job);
          const auto now = std::chrono::steady_clock::now();
          if (pos > 0 && (pos != st->last_pos || now - st->last_comment >= kQueuedCommentEvery)) {
            out = sse_comment("queued position " + std::to_string(pos));
            st->last_pos = pos;
            st->last_comment = now;
          }
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return gone();
        if (terminal) {
          sink.done();
          return true;
        }
        if (peer_gone()) return gone();
        return true;
      },
      [this, st](bool) {
        // Whatever ended the response (done, write failure, server stop), a job whose
        // terminal event was not produced yet must not keep running for nobody.
        if (!st->job->terminated()) runner_->cancel_job(st->job, CancelReason::Disconnect);
        open_streams_.fetch_sub(1);
      });
}

void HttpServer::handle_openai(const httplib::Request& req, httplib::Response& res,
                               OpenAiKind kind) {
  ParsedRequest pr;
  if (!parse(req, res, kind == OpenAiKind::Chat ? kChat : kCompletion, pr)) return;
  const std::string model = pr.model.empty() ? model_name_ : pr.model;
  const bool stream = pr.stream;
  const bool include_usage = pr.include_usage;
  auto job = make_job(std::move(pr));
  if (!admit(job, res)) return;

  OpenAiStream os{kind, (kind == OpenAiKind::Chat ? "chatcmpl-" : "cmpl-") + job->id, model,
                  std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count()};
  const auto prompt_n = static_cast<int64_t>(job->request.prompt_tokens.size());

  if (stream) {
    return stream_job(res, job, [os, prompt_n, include_usage](const JobEvent& ev) -> std::string {
      const bool chat = os.kind == OpenAiKind::Chat;
      switch (ev.kind) {
        case JobEvent::Kind::Started:
          return chat ? sse_data(
                            dump_json(os.chunk({{"role", "assistant"}, {"content", ""}}, nullptr)))
                      : std::string();
        case JobEvent::Kind::Token: {
          const json t = ev.data.value("t", "");
          return sse_data(dump_json(os.chunk(chat ? json{{"content", t}} : t, nullptr)));
        }
        case JobEvent::Kind::End: {
          const int64_t n = ev.data.value("tokens_out", int64_t{0});
          json fin = os.chunk(chat ? json::object() : json(""),
                              openai_finish_reason(ev.data.value("stop_reason", "")));
          if (ev.data.contains("receipt")) fin["receipt"] = ev.data["receipt"];  // WRK-D18
          std::string out;
          if (include_usage) {
            out = sse_data(dump_json(fin)) + sse_data(dump_json(os.usage_chunk(prompt_n, n)));
          } else {
            fin["usage"] = openai_usage(prompt_n, n);
            out = sse_data(dump_json(fin));
          }
          return out + sse_data("[DONE]");
        }
        case JobEvent::Kind::Error: {
          const std::string code = ev.data.value("code", "INTERNAL");
          json e = error_body(code, ev.data.value("message", ""),
                              code == "INVALID_REQUEST" ? "invalid_request_error" : "server_error",
                              ev.data.value("retriable", false));
          return sse_data(dump_json(e)) + sse_data("[DONE]");
        }
      }
      return {};
    });
  }

  // Not streaming: collect on this HTTP thread, still watching for a client hang-up (a
  // FIN is probed with an interim 100 Continue; a closed peer answers it with RST).
  // Checked every poll interval even while tokens keep arriving.
  Connection* conn = current_connection();
  std::string text;
  auto next_check = std::chrono::steady_clock::now();
  for (;;) {
    auto ev = job->events.pop(kPollInterval);
    if (conn && std::chrono::steady_clock::now() >= next_check) {
      next_check = std::chrono::steady_clock::now() + kPollInterval;
      if (conn->peer() == Connection::Peer::Gone || (conn->probe_due() && !conn->send_continue())) {
        client_gone(job);
        return close_after(res);
      }
    }
    if (!ev) continue;
    if (ev->kind == JobEvent::Kind::Token) text += ev->data.value("t", "");
    if (ev->kind == JobEvent::Kind::End) {
      json full = os.full(text, openai_finish_reason(ev->data.value("stop_reason", "")), prompt_n,
                          ev->data.value("tokens_out", int64_t{0}));
      if (ev->data.contains("receipt")) full["receipt"] = ev->data["receipt"];  // WRK-D18
      return send_json(res, 200, full);
    }
    if (ev->kind == JobEvent::Kind::Error) {
      const std::string code = ev->data.value("code", "INTERNAL");
      int status = 500;
      for (auto c : {ErrorCode::Cancelled, ErrorCode::InferenceTimeout, ErrorCode::VramOom,
                     ErrorCode::WorkerBusy, ErrorCode::InvalidRequest})
        if (code == error_code_name(c)) status = error_http_status(c);
      return send_json(res, status,
                       error_body(code, ev->data.value("message", ""), error_type_for(status),
                                  ev->data.value("retriable", false)));
    }
  }
}

}  // namespace worker::server
