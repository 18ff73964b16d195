#include "server/worker_main.h"

#include <httplib.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <regex>
#include <thread>

#include "build_info.h"
#include "common/errors.h"
#include "common/fault_injection.h"
#include "common/log.h"
#include "common/sha256.h"
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

// Blocks SIGTERM/SIGINT/SIGHUP/SIGQUIT in every thread (call before creating any) and waits for
// them on one thread, so shutdown runs as ordinary code instead of inside a signal handler.
class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int)> on_signal) {
    sigemptyset(&set_);
    // SIGHUP (terminal gone) and SIGQUIT would otherwise kill the worker with no terminal
    // event: they stop it like SIGTERM.
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&set_, sig);
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

std::string human_bytes(double b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

// The model load as a person at a terminal sees it (issue 17): one progress line redrawn in
// place, only when stderr is a TTY. The JSON lines are written either way, unchanged.
class LoadDisplay {
 public:
  explicit LoadDisplay(const std::string& model_path)
      : on_(isatty(STDERR_FILENO) == 1),
        file_(std::filesystem::path(model_path).filename().string()) {}
  ~LoadDisplay() { clear(); }
  bool on() const { return on_; }
  void phase(const std::string& what) {
    if (on_) log::status("loading " + file_ + ": " + what);
  }
  void bytes(uint64_t done, uint64_t total) {
    if (!on_) return;
    const auto now = Clock::now();
    if (!started_) start_ = now, started_ = true;
    if (done < total && now - last_ < 100ms) return;  // ~10 redraws a second
    last_ = now;
    // Rate over the byte phase only (from the first report), "--" until it can be told.
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
    const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(frac * 24);
    char eta[32] = "ETA --";
    if (done >= total)
      std::snprintf(eta, sizeof eta, "done in %.1f s", secs);
    else if (rate > 0)
      std::snprintf(eta, sizeof eta, "ETA %.1f s", static_cast<double>(total - done) / rate);
    char pct[8];
    std::snprintf(pct, sizeof pct, "%3.0f%%", 100.0 * frac);
    log::status("loading " + file_ + " [" + std::string(static_cast<size_t>(filled), '#') +
                std::string(static_cast<size_t>(24 - filled), '.') + "] " + pct + "  " +
                human_bytes(static_cast<double>(done)) + " / " +
                human_bytes(static_cast<double>(total)) + "  " +
                (rate > 0 ? human_bytes(rate) + "/s" : std::string("-- B/s")) + "  " + eta);
  }
  void clear() {
    if (on_) log::status("");
  }

 private:
  bool on_;
  std::string file_;
  bool started_ = false;
  Clock::time_point start_{}, last_{};
};

std::string ready_banner(const std::string& model, const std::string& file, const ModelConfig& cfg,
                         int32_t n_ctx, const BackendInfo& info, const std::string& numerics,
                         uint64_t vram, const std::string& bind, int port, double load_ms) {
  std::string host = bind == "0.0.0.0" ? "127.0.0.1" : bind == "::" ? "::1" : bind;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  std::string backend = info.backend;
  if (info.backend == "cuda")
    backend += " on " + info.device_name + " (sm " + info.sm + "), numerics " + numerics;
  char secs[16];
  std::snprintf(secs, sizeof secs, "%.1f s", load_ms / 1000);
  return "worker-orcd ready: model " + model + " (" + file + ", " + cfg.quant_kind + ", " +
         cfg.arch_name + ", ctx " + std::to_string(n_ctx) + ") | backend " + backend + " | VRAM " +
         (info.backend == "cuda" ? human_bytes(static_cast<double>(vram)) : "none (cpu)") +
         " | http://" + host + ":" + std::to_string(port) + " | loaded in " + secs;
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
  // A fixed mmap threshold: buffers of 128 KiB and more (request bodies up to the 1 MiB
  // limit) are mapped and go back to the system when freed. glibc's default raises the
  // threshold after the first such free, and attack-sized bodies then stay in the arenas.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
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
  scfg.limits.head_timeout = std::chrono::milliseconds(std::llround(opt.http_timeout_sec * 1000));
  scfg.limits.body_timeout = 3 * scfg.limits.head_timeout;
  HttpServer http(scfg, metrics);
  std::atomic<int> signal_seen{0};
  SignalWatcher signals([&](int sig) {
    log::info("signal", {{"signal", sig}, {"name", sigabbrev_np(sig)}, {"action", "shutdown"}});
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
  if (!is_loopback_address(opt.bind) && opt.api_key.empty())
    log::warn("insecure_bind",
              {{"bind", opt.bind},
               {"message", "listening on " + opt.bind +
                               " WITHOUT --api-key: anyone who can reach this port can run jobs, "
                               "cancel them and shut the worker down"}});

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
  LoadDisplay display(opt.model);
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
    display.phase("reading the GGUF header");
    model = load_model(opt.model);
    log::info("model_load_progress", {{"percent", 25}});
    display.phase("building the tokenizer");
    tok = make_tokenizer(*model->file, opt.tokenizer);
    log::info("model_load_progress", {{"percent", 50}});
    display.phase(opt.backend == "cuda" ? "creating the CUDA context" : "reading the weights");
    engine = make_engine(opt.backend, model, opt.ctx_size, opt.gpu_device, opt.numerics == "fast",
                         opt.kv_cache,
                         [&display](uint64_t done, uint64_t total) { display.bytes(done, total); });
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

  // Receipts (WRK-D18): the model's content hash is computed after `ready`, off the load's
  // critical path, on a low-priority thread; a job that ends before it is done waits for it.
  auto receipt_ctx = std::make_shared<ReceiptContext>();
  std::promise<std::string> model_hash;
  receipt_ctx->model_hash = model_hash.get_future().share();
  receipt_ctx->model_name = model_name;
  std::error_code size_ec;
  receipt_ctx->model_bytes = std::filesystem::file_size(opt.model, size_ec);
  receipt_ctx->backend = info;
  receipt_ctx->tokenizer_kind = tok->kind();
  receipt_ctx->n_ctx = engine->n_ctx();
  receipt_ctx->worker_build = build_info::kCommit;

  // The streams' connection threads poll for the next token event before sleeping on the CUDA
  // backend (EventChannel::set_spin); WORKER_EVENT_SPIN_US (microseconds, 0 = never) overrides.
  {
    int64_t spin_us = info.backend == "cuda" ? 2000 : 0;
    if (const char* e = std::getenv("WORKER_EVENT_SPIN_US"); e != nullptr) {
      char* end = nullptr;
      const long long v = std::strtoll(e, &end, 10);
      if (end != e && *end == '\0' && v >= 0 && v <= 1000000) {
        spin_us = v;
      } else {
        log::warn("event_spin_ignored", {{"WORKER_EVENT_SPIN_US", std::string(e)},
                                         {"reason", "not an integer in 0 .. 1000000"}});
      }
    }
    EventChannel::set_spin(std::chrono::microseconds(spin_us));
  }

  JobRunner runner(
      *engine, *tok,
      {.queue_depth = opt.queue_depth, .inference_timeout_sec = opt.inference_timeout_sec},
      &metrics, logits_log.get(), receipt_ctx);
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
               {"numerics", info.numerics},
               {"kv_cache", info.kv_cache},
               {"sm", info.sm},
               {"cuda_runtime_version", info.cuda_runtime_version},
               {"device_name", info.device_name},
               {"decode", info.decode},
               {"gpu_device", opt.gpu_device},
               // What ran, for every report and bug (issue 17).
               {"build",
                {{"commit", build_info::kCommit},
                 {"build_date", build_info::kDate},
                 {"build_type", build_info::kType},
                 {"cuda_arch", build_info::kCudaArch},
                 {"numerics", info.backend == "cuda" ? opt.numerics : "reference"}}}},
              vram);
  const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_load).count();
  display.clear();
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
  if (display.on())
    log::terminal_line(
        ready_banner(model_name, std::filesystem::path(opt.model).filename().string(), cfg,
                     engine->n_ctx(), info, opt.numerics, vram, opt.bind, http.port(), load_ms));

  std::atomic<bool> stop_hash{false};
  std::thread hasher([path = opt.model, promise = std::move(model_hash), &stop_hash]() mutable {
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);  // below the inference thread
    try {
      promise.set_value(file_content_hash(path, 0, [&](uint64_t, uint64_t) { return !stop_hash; }));
    } catch (const std::exception& e) {
      if (!stop_hash) log::warn("model_hash_failed", {{"message", e.what()}});
      promise.set_exception(std::current_exception());
    }
  });

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
  // It may fire while the process is already tearing down (after worker_main returned, with
  // static objects destroyed): log::emergency, not the logger, and no allocation.
  std::thread watchdog([t_stop] {
    while (Clock::now() - t_stop < 4800ms) std::this_thread::sleep_for(20ms);
    log::emergency("warn", "shutdown_forced", "orderly shutdown exceeded 4.8 s");
    std::_Exit(0);
  });
  watchdog.detach();

  http.begin_drain();
  // An unfinished model hash is abandoned (a job ending now gets "unavailable" in its
  // receipt) so that it cannot hold up the 5 s shutdown.
  stop_hash.store(true);
  runner.stop(2500ms);  // running job: finish within 2.5 s or be cancelled
  hasher.join();
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
