// Scale-out behind nginx (issue 16): three real workers on loopback behind Debian's nginx,
// configured with deploy/nginx/worker-orcd-locations.conf and the upstream block that
// deploy/nginx/make-upstream.sh writes. nginx runs in the foreground with its prefix, temp
// folders and logs under the build tree; its access log records every worker each request
// tried ($upstream_status "503, 200" = one retry), which is how retries are counted.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "harness/suite.h"

namespace conformance {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const char* kNginx = "/usr/sbin/nginx";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string run_capture(const std::string& cmd) {
  std::array<char, 4096> buf{};
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int rc = ::pclose(p);
  if (rc != 0) throw std::runtime_error(cmd + " failed (" + std::to_string(rc) + "): " + out);
  return out;
}

bool port_open(int port) {
  try {
    HttpConnection c("127.0.0.1", port);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// nginx in the foreground (daemon off, one worker process) with its own prefix.
class Nginx {
 public:
  Nginx(const fs::path& dir, int port, const std::string& upstream_block) : dir_(dir) {
    if (::access(kNginx, X_OK) != 0) {
      throw std::runtime_error(std::string("no nginx at ") + kNginx +
                               " (Debian package nginx; ci/setup.sh installs it)");
    }
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "logs");
    fs::create_directories(dir_ / "tmp");
    std::ofstream(dir_ / "worker-orcd-upstream.conf") << upstream_block;
    const std::string d = dir_.string();
    std::ofstream conf(dir_ / "nginx.conf");
    conf << "daemon off;\nworker_processes 1;\npid " << d << "/nginx.pid;\n"
         << "error_log " << d << "/logs/error.log info;\n"
         << "events { worker_connections 1024; }\nhttp {\n"
         << "  client_body_temp_path " << d << "/tmp/body;\n  proxy_temp_path " << d
         << "/tmp/proxy;\n  fastcgi_temp_path " << d << "/tmp/fastcgi;\n  uwsgi_temp_path " << d
         << "/tmp/uwsgi;\n  scgi_temp_path " << d << "/tmp/scgi;\n"
         << "  log_format tries '$http_x_test_tag $status \"$upstream_status\"';\n"
         << "  access_log " << d << "/logs/access.log tries;\n"
         << "  include " << d << "/worker-orcd-upstream.conf;\n"
         << "  server {\n    listen 127.0.0.1:" << port << ";\n    include " << source_dir()
         << "/deploy/nginx/worker-orcd-locations.conf;\n  }\n}\n";
    conf.close();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      const std::string out = d + "/logs/stderr.log";
      FILE* f = std::freopen(out.c_str(), "w", stderr);
      (void)f;
      ::execl(kNginx, kNginx, "-p", (d + "/").c_str(), "-c", (d + "/nginx.conf").c_str(), "-e",
              (d + "/logs/error.log").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const auto deadline = Clock::now() + 10s;
    while (!port_open(port)) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("nginx exited at start:\n" + logs());
      }
      if (Clock::now() > deadline) throw std::runtime_error("nginx did not listen:\n" + logs());
      std::this_thread::sleep_for(20ms);
    }
  }
  ~Nginx() { stop(); }
  Nginx(const Nginx&) = delete;
  Nginx& operator=(const Nginx&) = delete;

  // Fast shutdown (SIGTERM); true when nginx exited 0.
  bool stop() {
    if (pid_ <= 0) return true;
    ::kill(pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 500 && ::waitpid(pid_, &st, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(10ms);
    if (::waitpid(pid_, &st, WNOHANG) == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
      return false;
    }
    pid_ = -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  std::string logs() const {
    return "--- nginx stderr\n" + read_file(dir_ / "logs/stderr.log") + "--- nginx error.log\n" +
           read_file(dir_ / "logs/error.log");
  }
  // Access log lines: tag, status, upstream statuses (one per worker tried).
  struct Entry {
    std::string tag;
    int status = 0;
    std::vector<int> tries;
  };
  std::vector<Entry> access() const {
    std::vector<Entry> out;
    std::istringstream in(read_file(dir_ / "logs/access.log"));
    std::string line;
    while (std::getline(in, line)) {
      Entry e;
      std::istringstream ls(line);
      ls >> e.tag >> e.status;
      std::string rest;
      std::getline(ls, rest);
      for (char& c : rest)
        if (c == '"' || c == ',' || c == ':') c = ' ';
      std::istringstream rs(rest);
      std::string s;
      while (rs >> s)
        if (s != "-") e.tries.push_back(std::stoi(s));
      out.push_back(e);
    }
    return out;
  }
  // Access entries whose tag starts with `prefix`; waits briefly (nginx logs at the end).
  std::vector<Entry> access_for(const std::string& prefix, size_t want) const {
    std::vector<Entry> got;
    for (int i = 0; i < 200; ++i) {
      got.clear();
      for (auto& e : access())
        if (e.tag.rfind(prefix, 0) == 0) got.push_back(e);
      if (got.size() >= want) break;
      std::this_thread::sleep_for(10ms);
    }
    return got;
  }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
};

// Three workers (ids ...0001..0003) and nginx in front of them.
class Cluster {
 public:
  Cluster(const std::string& name, const std::string& model, int queue_depth) {
    std::string args;
    for (int i = 0; i < 3; ++i) {
      ids.push_back("5ca1e0d0-0000-4000-8000-00000000000" + std::to_string(i + 1));
      WorkerOptions o;
      o.model = model;
      o.extra_args = {"--worker-id", ids.back(), "--queue-depth", std::to_string(queue_depth)};
      workers.push_back(std::make_unique<WorkerProcess>(o));
      args += " " + ids.back() + "=127.0.0.1:" + std::to_string(workers.back()->port());
    }
    upstream = run_capture("bash " + source_dir() + "/deploy/nginx/make-upstream.sh" + args);
    port = find_free_port();
    nginx = std::make_unique<Nginx>(fs::path(SCALEOUT_WORK_DIR) / name, port, upstream);
  }
  ~Cluster() {
    if (nginx && !nginx->stop()) ADD_FAILURE() << "nginx did not stop cleanly\n" << nginx->logs();
    for (auto& w : workers)
      if (w->running()) {
        const int rc = w->stop();
        if (rc != 0) ADD_FAILURE() << "worker exit code " << rc << "\n" << w->log_text();
      }
  }
  int index_of(const std::string& id) const {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == id) return static_cast<int>(i);
    return -1;
  }

  std::vector<std::unique_ptr<WorkerProcess>> workers;
  std::vector<std::string> ids;
  std::string upstream;
  int port = 0;
  std::unique_ptr<Nginx> nginx;
};

RequestOptions tagged(const std::string& tag, std::chrono::milliseconds timeout = 60s) {
  RequestOptions o;
  o.headers = {{"X-Test-Tag", tag}};
  o.timeout = timeout;
  return o;
}

nlohmann::json long_job(const std::string& id) {
  return {{"job_id", id}, {"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"temperature", 0}};
}

// Opens a long job through nginx and reads up to its `started` event and first token.
// Returns the stream and the index of the worker that runs it (from `started`).
struct Running {
  std::unique_ptr<SseStream> stream;
  std::string job_id;
  std::string worker_id;
};
Running start_long(int port, const std::string& tag) {
  Running r;
  r.job_id = unique_job_id(tag);
  r.stream = std::make_unique<SseStream>(port, "/execute", long_job(r.job_id), tagged(tag));
  if (r.stream->status() != 200)
    throw std::runtime_error(tag + ": status " + std::to_string(r.stream->status()) + " " +
                             r.stream->read_body());
  auto started = r.stream->next_event(30s);
  if (!started || started->event != "started")
    throw std::runtime_error(tag + ": first event is not started");
  r.worker_id = nlohmann::json::parse(started->data).value("worker_id", "");
  const auto header = r.stream->response().header("x-worker-id");
  if (!header || *header != r.worker_id)
    throw std::runtime_error(tag + ": X-Worker-Id header '" + header.value_or("(none)") +
                             "' differs from started.worker_id '" + r.worker_id + "'");
  auto tok = r.stream->next_event(30s);
  if (!tok || tok->event != "token") throw std::runtime_error(tag + ": no first token");
  return r;
}

bool wait_idle(int port, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    auto h = http_get(port, "/health").json();
    if (h["busy"] == false && h["queue_depth"] == 0) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

int retries(const std::vector<Nginx::Entry>& es) {
  int n = 0;
  for (const auto& e : es) n += e.tries.empty() ? 0 : static_cast<int>(e.tries.size()) - 1;
  return n;
}

// 30 concurrent streams through nginx: every one complete and in order, each naming its
// worker (X-Worker-Id == started.worker_id), and all three workers used.
// REQ: WRK-D21 WRK-D6
TEST(ScaleOutNginx, ThirtyConcurrentStreamsSpreadOverThreeWorkers) {
  Cluster c("spread", stories_model(), 16);
  constexpr int kRequests = 30;
  std::vector<JobStream> results(kRequests);
  std::vector<std::string> headers(kRequests), errors(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i)
    threads.emplace_back([&, i] {
      try {
        const std::string tag = "spread-" + std::to_string(i);
        SseStream s(c.port, "/execute",
                    job_request("Once upon a time", 24, 0.8, 1000 + static_cast<unsigned>(i)),
                    tagged(tag));
        headers[i] = s.response().header("x-worker-id").value_or("");
        results[i] = collect(s, 60s);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  std::map<std::string, int> per_worker;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_EQ(errors[i], "");
    const JobStream& js = results[i];
    EXPECT_EQ(js.status, 200);
    EXPECT_TRUE(js.violations.empty()) << js.describe();
    ASSERT_NE(js.terminal(), nullptr) << js.describe();
    EXPECT_EQ(js.events.back().event, "end") << js.describe();
    ASSERT_NE(js.started(), nullptr);
    const std::string wid = js.started()->value("worker_id", "");
    EXPECT_GE(c.index_of(wid), 0) << "unknown worker_id " << wid;
    EXPECT_EQ(headers[i], wid) << "X-Worker-Id header vs started.worker_id";
    ++per_worker[wid];
  }
  const auto log = c.nginx->access_for("spread-", kRequests);
  EXPECT_EQ(log.size(), static_cast<size_t>(kRequests)) << c.nginx->logs();
  std::string counts;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    counts += " worker" + std::to_string(i + 1) + "=" + std::to_string(per_worker[c.ids[i]]);
    EXPECT_GT(per_worker[c.ids[i]], 0) << "worker " << i + 1 << " served nothing";
  }
  std::printf("[scaleout] spread: requests=%d%s retries=%d\n", kRequests, counts.c_str(),
              retries(log));
  RecordProperty("per_worker", counts);
}

// Queue depth 0: each worker takes one job and answers 503 WORKER_BUSY to the next. nginx
// must retry a busy worker's 503 on the others (the POST included) and answer 503 only when
// every worker is busy; once one is free again, requests succeed at once.
// REQ: WRK-D21 WRK-D9
TEST(ScaleOutNginx, BusyWorkersAreSkippedAnd503OnlyWhenAllAreBusy) {
  Cluster c("busy", slow_model(), 0);
  // Three long jobs through nginx: every worker gets one, whatever the round-robin order.
  std::vector<Running> jobs;
  std::map<std::string, int> per_worker;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(start_long(c.port, "busy-fill-" + std::to_string(i)));
    ++per_worker[jobs.back().worker_id];
  }
  EXPECT_EQ(per_worker.size(), 3u) << "three jobs with queue depth 0 must land on three workers";
  for (size_t i = 0; i < c.ids.size(); ++i)
    EXPECT_TRUE(http_get(c.workers[i]->port(), "/health").json()["busy"].get<bool>());

  // All busy: 503 WORKER_BUSY, after nginx tried every worker.
  auto busy = http_post_json(c.port, "/execute", job_request("x", 3, 0.0), tagged("busy-all"));
  EXPECT_EQ(busy.status, 503) << busy.body;
  EXPECT_EQ(busy.json()["error"]["code"], "WORKER_BUSY") << busy.body;
  EXPECT_TRUE(busy.header("retry-after").has_value());
  EXPECT_GE(c.index_of(busy.header("x-worker-id").value_or("")), 0) << "errors name the worker too";
  const auto all = c.nginx->access_for("busy-all", 1);
  ASSERT_EQ(all.size(), 1u) << c.nginx->logs();
  std::map<int, int> tried;
  for (int s : all[0].tries) ++tried[s];
  EXPECT_GE(tried[503], 3) << "nginx answered 503 before trying every worker";
  EXPECT_EQ(tried.size(), 1u) << "only 503s expected from busy workers";

  // Free one worker (cancel its job on that worker, through the proxy by worker id): the
  // next request must go there, even though every worker answered 503 a moment ago.
  const Running& victim = jobs[1];
  RequestOptions cancel_opts = tagged("busy-cancel");
  cancel_opts.headers.push_back({"X-Worker-Id", victim.worker_id});
  auto cancel = http_post_json(c.port, "/cancel", {{"job_id", victim.job_id}}, cancel_opts);
  EXPECT_EQ(cancel.status, 202) << cancel.body;
  EXPECT_EQ(cancel.json().value("status", ""), "cancelling") << cancel.body;
  JobStream cancelled = collect(*victim.stream, 30s);
  ASSERT_NE(cancelled.terminal(), nullptr) << cancelled.describe();
  EXPECT_EQ((*cancelled.terminal())["code"], "CANCELLED") << cancelled.describe();
  const int freed = c.index_of(victim.worker_id);
  ASSERT_GE(freed, 0);
  ASSERT_TRUE(wait_idle(c.workers[freed]->port(), 10s));
  SseStream next(c.port, "/execute", job_request("Once upon a time", 4, 0.0), tagged("busy-next"));
  ASSERT_EQ(next.status(), 200) << next.read_body();
  JobStream js = collect(next, 30s);
  EXPECT_TRUE(js.violations.empty()) << js.describe();
  EXPECT_EQ(js.events.back().event, "end") << js.describe();
  ASSERT_NE(js.started(), nullptr);
  EXPECT_EQ(js.started()->value("worker_id", ""), victim.worker_id)
      << "the only free worker must get the job";

  // A cancel without X-Worker-Id cannot be routed: a clear 400, not a wrong "unknown".
  auto unrouted = http_post_json(c.port, "/cancel", {{"job_id", jobs[0].job_id}});
  EXPECT_EQ(unrouted.status, 400) << unrouted.body;
  // Per-worker /health through the proxy, for monitoring.
  for (size_t i = 0; i < c.ids.size(); ++i) {
    auto h = http_get(c.port, "/workers/" + c.ids[i] + "/health");
    EXPECT_EQ(h.status, 200) << h.body;
    EXPECT_EQ(h.json().value("worker_id", ""), c.ids[i]);
    EXPECT_EQ(h.header("x-worker-id").value_or(""), c.ids[i]);
  }
  EXPECT_EQ(http_get(c.port, "/workers/00000000-0000-4000-8000-000000000000/health").status, 404);

  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i == 1) continue;
    http_post_json(c.port, "/workers/" + jobs[i].worker_id + "/cancel",
                   {{"job_id", jobs[i].job_id}});
    collect(*jobs[i].stream, 30s);
  }
  // nginx writes a stream's access line once the client closed its connection (lingering
  // close after the last chunk): close them all, then count.
  for (auto& j : jobs) j.stream->close();
  next.close();
  const auto log = c.nginx->access_for("busy-", 6);
  EXPECT_EQ(log.size(), 6u) << c.nginx->logs();
  const int n = retries(log);
  std::printf(
      "[scaleout] busy: requests=%zu fill_workers=%zu all_busy_status=%d all_busy_tries=%zu "
      "retries=%d freed=worker%d\n",
      log.size(), per_worker.size(), busy.status, all[0].tries.size(), n, freed + 1);
  // The all-busy request alone retried at least twice; the fill requests retried whenever
  // round robin pointed at a worker already busy.
  EXPECT_GE(n, 2);
}

// A client that goes away through nginx: nginx closes its upstream connection and the
// worker cancels the job and is free again.
// REQ: WRK-D21 WRK-D10
TEST(ScaleOutNginx, ClientDisconnectThroughNginxCancelsTheJobOnItsWorker) {
  Cluster c("disconnect", slow_model(), 0);
  Running r = start_long(c.port, "disc");
  const int w = c.index_of(r.worker_id);
  ASSERT_GE(w, 0);
  const auto t0 = Clock::now();
  r.stream->close();
  auto end = c.workers[w]->wait_for_log("execute_end", 10s, [&](const nlohmann::json& j) {
    return j.value("job_id", "") == r.job_id;
  });
  ASSERT_TRUE(end.has_value()) << "the job kept running after the client left\n"
                               << c.workers[w]->log_text() << c.nginx->logs();
  EXPECT_EQ(end->json.value("outcome", ""), "cancelled") << end->raw;
  const double ms = ms_between(t0, end->arrival);
  EXPECT_LT(ms, 3000.0);
  EXPECT_TRUE(wait_idle(c.workers[w]->port(), 5s));
  std::printf("[scaleout] disconnect: worker%d cancelled the job %.0f ms after the close\n", w + 1,
              ms);
  RecordProperty("disconnect_to_cancel_ms", std::to_string(ms));
}

// One worker killed (SIGKILL) while it streams: the client's stream must end visibly (no
// `end` event; the chunked body is cut off), the other streams finish, and every later
// request succeeds on the two survivors.
// REQ: WRK-D21
TEST(ScaleOutNginx, KilledWorkerEndsItsStreamVisiblyAndTheRestServe) {
  Cluster c("kill", slow_model(), 0);
  std::vector<Running> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back(start_long(c.port, "kill-fill-" + std::to_string(i)));
  const int victim = c.index_of(jobs[0].worker_id);
  ASSERT_GE(victim, 0);
  c.workers[victim]->send_signal(SIGKILL);
  ASSERT_TRUE(c.workers[victim]->wait_exit(5s).has_value());

  // The victim's stream: read to its end; record how it ended.
  std::string outcome;
  std::vector<std::string> after;
  try {
    while (auto e = jobs[0].stream->next_event(30s)) after.push_back(e->event);
    outcome = "ended at EOF without a terminal event";
  } catch (const std::exception& e) {
    outcome = std::string("cut off: ") + e.what();
  }
  // Ended (cut off or EOF), not hanging; and never with a terminal event.
  EXPECT_EQ(outcome.find("timed out"), std::string::npos) << outcome;
  for (const auto& ev : after) {
    EXPECT_NE(ev, "end") << "a killed worker's stream must not look complete";
    EXPECT_NE(ev, "error");  // nobody is left to send one
  }

  // The survivors' jobs are untouched: cancel them (through the proxy) and see CANCELLED.
  for (int i = 1; i < 3; ++i) {
    auto r = http_post_json(c.port, "/workers/" + jobs[i].worker_id + "/cancel",
                            {{"job_id", jobs[i].job_id}});
    EXPECT_EQ(r.status, 202) << r.body;
    JobStream js = collect(*jobs[i].stream, 30s);
    ASSERT_NE(js.terminal(), nullptr) << js.describe();
    EXPECT_EQ((*js.terminal())["code"], "CANCELLED") << js.describe();
    ASSERT_TRUE(wait_idle(c.workers[c.index_of(jobs[i].worker_id)]->port(), 10s));
  }

  // Every later request succeeds, on the survivors only. Sequential, so that queue depth 0
  // never makes both survivors busy.
  constexpr int kLater = 8;
  std::map<std::string, int> per_worker;
  for (int i = 0; i < kLater; ++i) {
    SseStream s(c.port, "/execute", job_request("Once upon a time", 3, 0.0),
                tagged("kill-later-" + std::to_string(i)));
    ASSERT_EQ(s.status(), 200) << "request " << i << " after the kill: " << s.read_body()
                               << c.nginx->logs();
    JobStream js = collect(s, 30s);
    EXPECT_TRUE(js.violations.empty()) << js.describe();
    ASSERT_EQ(js.events.back().event, "end") << js.describe();
    const std::string wid = js.started()->value("worker_id", "");
    EXPECT_NE(wid, c.ids[victim]);
    ++per_worker[wid];
  }
  const auto later = c.nginx->access_for("kill-later-", kLater);
  EXPECT_EQ(per_worker.size(), 2u) << "both survivors serve";
  std::string counts;
  for (size_t i = 0; i < c.ids.size(); ++i)
    counts += " worker" + std::to_string(i + 1) + "=" + std::to_string(per_worker[c.ids[i]]);
  std::printf(
      "[scaleout] kill: worker%d killed; its in-flight stream: %s (%zu events after the "
      "kill); later requests=%d%s retries=%d\n",
      victim + 1, outcome.c_str(), after.size(), kLater, counts.c_str(), retries(later));
  RecordProperty("killed_stream_outcome", outcome);
}

}  // namespace
}  // namespace conformance
