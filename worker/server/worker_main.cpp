#include "server/worker_main.h"

#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>
#include <thread>

#include "common/errors.h"
#include "common/fault_injection.h"
#include "common/log.h"
#include "engine/engine.h"
#include "gguf/model_config.h"
#include "server/cli.h"
#include "server/http_server.h"
#include "server/job_runner.h"
#include "server/logits_log.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace worker::server {
namespace {
using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int fail(const std::string& code, const std::string& message, json extra = json::object()) {
  extra["code"] = code;
  extra["message"] = message;
  log::error("error", extra);
  return 1;
}

// Blocks SIGTERM/SIGINT in every thread (call before creating any) and waits for them on
// one thread, so shutdown runs as ordinary code instead of inside a signal handler.
class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int)> on_signal) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a dead client is a failed write, never a dead worker
    thread_ = std::thread([this, cb = std::move(on_signal)] {
      while (!stop_.load()) {
        timespec ts{0, 100'000'000};
        const int sig = sigtimedwait(&set_, nullptr, &ts);
        if (sig > 0) cb(sig);
      }
    });
  }
  ~SignalWatcher() {
    stop_.store(true);
    thread_.join();
  }

 private:
  sigset_t set_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void post_ready_callback(const std::string& url, const json& payload) {
  const auto scheme_end = url.find("://");
  const auto path_start = url.find('/', scheme_end + 3);
  const std::string base = url.substr(0, path_start);
  const std::string path = path_start == std::string::npos ? "/" : url.substr(path_start);
  try {
    httplib::Client cli(base);
    cli.set_connection_timeout(3);
    cli.set_read_timeout(5);
    auto r = cli.Post(path, payload.dump(), "application/json");
    if (!r)
      log::warn("callback_failed", {{"url", url}, {"message", httplib::to_string(r.error())}});
    else if (r->status >= 300)
      log::warn("callback_failed", {{"url", url}, {"status", r->status}});
    else
      log::info("callback_sent", {{"url", url}, {"status", r->status}});
  } catch (const std::exception& e) {
    log::warn("callback_failed", {{"url", url}, {"message", e.what()}});
  }
}

}  // namespace

int worker_main(int argc, char** argv) {
  CliOptions opt;
  try {
    opt = parse_cli(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::invalid_argument& e) {
    // stderr carries JSON lines only (D14); the usage text is behind --help.
    return fail("INVALID_ARGUMENT", std::string(e.what()) + " (see --help)");
  }
  if (opt.help) {
    std::fputs(cli_usage().c_str(), stdout);
    return 0;
  }
  log::set_context(
      {{"worker_id", opt.worker_id}, {"model_ref", opt.model}, {"gpu_device", opt.gpu_device}});
  const json where = {{"gpu_device", opt.gpu_device}, {"model_path", opt.model}};

  Metrics metrics;
  ServerConfig scfg;
  scfg.bind = opt.bind;
  scfg.port = opt.port;
  scfg.api_key = opt.api_key;
  scfg.queue_depth = opt.queue_depth;
  scfg.worker_id = opt.worker_id;
  HttpServer http(scfg, metrics);
  std::atomic<int> signal_seen{0};
  SignalWatcher signals([&](int sig) {
    signal_seen.store(sig);
    http.begin_drain();
    http.request_shutdown();
  });

  log::info("startup", {{"backend", opt.backend},
                        {"bind", opt.bind},
                        {"port", opt.port},
                        {"worker_id_generated", opt.worker_id_generated},
                        {"queue_depth", opt.queue_depth},
                        {"inference_timeout_sec", opt.inference_timeout_sec}});

  // The port is claimed first so a busy port fails in milliseconds, not after the load;
  // /health answers "loading" meanwhile (D12) and job routes 503.
  std::string bind_error;
  if (!http.start(bind_error)) {
    json f = where;
    f["bind"] = opt.bind;
    f["port"] = opt.port;
    return fail("PORT_UNAVAILABLE", bind_error, f);
  }

  // Model load (D14 progress: 0 file check, 25 parsed + bound, 50 tokenizer, 75 backend
  // context + weights resident, 100 ready to serve).
  const auto t_load = Clock::now();
  log::info("model_load_start", {{"backend", opt.backend}});
  log::info("model_load_progress", {{"percent", 0}});
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  try {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(opt.model, ec))
      throw WorkerError(ErrorCode::ModelLoadFailed,
                        "model file '" + opt.model + "' does not exist or is not a regular file");
    model = load_model(opt.model);
    log::info("model_load_progress", {{"percent", 25}});
    tok = make_tokenizer(*model->file, opt.tokenizer);
    log::info("model_load_progress", {{"percent", 50}});
    engine = make_engine(opt.backend, model, opt.ctx_size, opt.gpu_device, opt.numerics == "fast");
    log::info("model_load_progress", {{"percent", 75}});
  } catch (const WorkerError& e) {
    http.stop();
    json f = where;
    f["backend"] = opt.backend;
    // M0-W-1020: the log line carries required and available bytes as fields too.
    static const std::regex req_re("required (\\d+)"), avail_re("available (\\d+)");
    std::smatch m;
    const std::string msg = e.what();
    if (std::regex_search(msg, m, req_re)) f["required_bytes"] = std::stoull(m[1].str());
    if (std::regex_search(msg, m, avail_re)) f["available_bytes"] = std::stoull(m[1].str());
    const std::string code = e.code() == ErrorCode::InvalidRequest
                                 ? "MODEL_LOAD_FAILED"
                                 : std::string(error_code_name(e.code()));
    return fail(code, e.what(), f);
  } catch (const std::exception& e) {
    http.stop();
    json f = where;
    f["backend"] = opt.backend;
    return fail("MODEL_LOAD_FAILED", e.what(), f);
  }

  if (fault::alloc_fault_at() > 0)  // WRK-D28: say loudly that a test switch is armed
    log::warn("test_fault_armed", {{"switch", fault::kAllocEnv}, {"at", fault::alloc_fault_at()}});
  std::unique_ptr<LogitsLog> logits_log;
  if (!opt.log_logits.empty()) {
    try {
      logits_log = std::make_unique<LogitsLog>(opt.log_logits);
    } catch (const std::exception& e) {
      http.stop();
      return fail("INVALID_ARGUMENT", e.what(), where);
    }
  }

  const ModelConfig& cfg = engine->config();
  const BackendInfo info = engine->info();
  const uint64_t vram = engine->vram().total();
  std::string model_name = cfg.name;
  if (model_name.empty()) model_name = std::filesystem::path(opt.model).stem().string();
  metrics.set_vram_bytes(vram);

  JobRunner runner(
      *engine, *tok,
      {.queue_depth = opt.queue_depth, .inference_timeout_sec = opt.inference_timeout_sec},
      &metrics, logits_log.get());
  http.attach(runner, *tok, engine->n_ctx(), model_name,
              {{"backend", info.backend},
               {"model", model_name},
               {"model_path", opt.model},
               {"architecture", cfg.arch_name},
               {"resident", info.resident},
               {"quant_kind", cfg.quant_kind},
               {"tokenizer_kind", tok->kind()},
               {"vocab_size", tok->vocab_size()},
               {"context_length", engine->n_ctx()},
               {"sm", info.sm},
               {"cuda_runtime_version", info.cuda_runtime_version},
               {"device_name", info.device_name},
               {"gpu_device", opt.gpu_device}},
              vram);
  const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_load).count();
  log::info("model_load_progress", {{"percent", 100}});
  log::info("model_load_complete", {{"vram_bytes", vram},
                                    {"duration_ms", load_ms},
                                    {"architecture", cfg.arch_name},
                                    {"quant_kind", cfg.quant_kind},
                                    {"context_length", engine->n_ctx()}});
  log::info("ready", {{"worker_id", opt.worker_id},
                      {"vram_bytes", vram},
                      {"port", http.port()},
                      {"backend", info.backend}});

  std::thread callback;
  if (!opt.callback_url.empty()) {
    callback = std::thread(post_ready_callback, opt.callback_url,
                           json{{"worker_id", opt.worker_id},
                                {"vram_bytes", vram},
                                {"port", http.port()},
                                {"model", model_name},
                                {"model_path", opt.model},
                                {"backend", info.backend},
                                {"gpu_device", opt.gpu_device},
                                {"context_length", engine->n_ctx()},
                                {"status", "ready"}});
  }

  while (!http.wait_shutdown_requested(200ms)) {
  }
  const auto t_stop = Clock::now();
  log::info("shutdown", {{"reason", signal_seen.load() ? "signal" : "request"},
                         {"signal", signal_seen.load()}});
  // Safety net for the 5 s deadline (M0-W-1630): the orderly path below takes < 5 s unless
  // something is wedged; then exit anyway, as SIGKILL would.
  std::thread watchdog([t_stop] {
    while (Clock::now() - t_stop < 4800ms) std::this_thread::sleep_for(20ms);
    log::warn("shutdown_forced", {{"message", "orderly shutdown exceeded 4.8 s"}});
    std::_Exit(0);
  });
  watchdog.detach();

  http.begin_drain();
  runner.stop(2500ms);  // running job: finish within 2.5 s or be cancelled
  http.wait_streams_closed(1000ms);
  http.stop();
  if (callback.joinable()) callback.join();
  logits_log.reset();  // drains and flushes the JSONL
  engine.reset();      // frees device memory before exit
  log::info(
      "shutdown_complete",
      {{"duration_ms", std::chrono::duration<double, std::milli>(Clock::now() - t_stop).count()}});
  return 0;
}

}  // namespace worker::server
