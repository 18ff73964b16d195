// The container image of issue 16, built and run for real: deploy/container/build-image.sh
// (debootstrap + podman import for the base, podman build of the multi-stage
// Containerfile), then the image runs on the CPU backend and answers /health, its own
// readiness probe and one /execute, and stops on SIGTERM with exit code 0. When podman
// cannot run containers on this machine the test says "not run" with podman's reason.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "harness/suite.h"

namespace conformance {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Cmd {
  int rc = -1;
  std::string out;
};

Cmd sh(const std::string& cmd) {
  Cmd r;
  std::array<char, 4096> buf{};
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// REQ: WRK-D22
TEST(ContainerImage, BuildsFromALocalDebianBaseAndServesOnTheCpuBackend) {
  const fs::path work = fs::path(DEPLOY_WORK_DIR) / "image";
  const std::string tag = "localhost/worker-orcd:cpu-test";
  const std::string src = source_dir();
  const auto t0 = Clock::now();
  const Cmd build =
      sh("bash " + src + "/deploy/container/build-image.sh " + work.string() + " " + tag);
  std::printf("%s", build.out.c_str());
  if (build.rc == 77) {
    const std::string why = trim(build.out.substr(build.out.rfind("not run:")));
    std::printf("[deploy] container: %s\n", why.c_str());
    GTEST_SKIP() << why;
  }
  ASSERT_EQ(build.rc, 0) << build.out;
  const double build_s = ms_between(t0, Clock::now()) / 1000.0;

  const std::string podman = "PODMAN_ROOT=" + work.string() + "/podman bash -c 'source " + src +
                             "/deploy/container/podman.sh && \"${PODMAN[@]}\" \"$@\"' podman ";
  const std::string limits = "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096 ";
  // The runtime stage has no compiler or -dev packages.
  const Cmd tools = sh(podman + "run --rm --no-healthcheck --network host " + limits +
                       "--entrypoint /bin/bash " + tag +
                       " -c 'command -v g++ cc cmake; test -e /usr/include/httplib.h && echo "
                       "httplib.h; exit 0'");
  EXPECT_EQ(tools.rc, 0) << tools.out;
  EXPECT_EQ(trim(tools.out), "") << "build tools in the runtime image";

  const int port = find_free_port();
  const std::string name = "worker-orcd-test-" + std::to_string(port);
  const fs::path models = fs::path(stories_model()).parent_path();
  sh(podman + "rm -f " + name);
  // Host network (loopback only): the image's default command binds 0.0.0.0:8080; here the
  // port must be free on the host, so the test picks it and binds loopback.
  const Cmd run =
      sh(podman + "run -d --no-healthcheck --name " + name + " --network host " + limits + "-v " +
         models.string() + ":/models:ro " + tag + " --backend=cpu --bind=127.0.0.1" +
         " --port=" + std::to_string(port) + " --model=/models/stories260K.gguf");
  ASSERT_EQ(run.rc, 0) << run.out;
  const auto started = Clock::now();
  HttpResponse health;
  while (Clock::now() - started < 60s) {
    try {
      health = http_get(port, "/health");
      if (health.status == 200) break;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(health.status, 200) << sh(podman + "logs " + name).out;
  const double ready_ms = ms_between(started, Clock::now());
  EXPECT_EQ(health.json().value("status", ""), "healthy") << health.body;
  EXPECT_EQ(health.header("x-worker-id").value_or(""), health.json().value("worker_id", "?"));

  // The probe the Kubernetes readiness check runs, inside the container.
  const Cmd probe = sh(podman + "exec " + name + " /usr/local/bin/worker-orcd-probe " +
                       std::to_string(port) + " healthy");
  EXPECT_EQ(probe.rc, 0) << probe.out;
  const Cmd wrong = sh(podman + "exec " + name + " /usr/local/bin/worker-orcd-probe " +
                       std::to_string(port) + " loading");
  EXPECT_NE(wrong.rc, 0) << "the probe must fail when the status differs";

  JobStream js = run_job(port, job_request("Once upon a time", 8, 0.0));
  EXPECT_EQ(js.status, 200);
  EXPECT_TRUE(js.violations.empty()) << js.describe();
  ASSERT_FALSE(js.events.empty());
  EXPECT_EQ(js.events.back().event, "end") << js.describe();

  // SIGTERM (podman stop) = the worker's graceful shutdown: exit code 0.
  const Cmd stop = sh(podman + "stop -t 10 " + name);
  EXPECT_EQ(stop.rc, 0) << stop.out;
  const Cmd code = sh(podman + "inspect --format '{{.State.ExitCode}}' " + name);
  EXPECT_EQ(trim(code.out), "0") << sh(podman + "logs " + name).out;
  const Cmd size = sh(podman + "image inspect --format '{{.Size}}' " + tag);
  sh(podman + "rm -f " + name);
  std::printf(
      "[deploy] container: image %s built in %.0f s, %s bytes; /health 200 after %.0f ms; "
      "/execute %zu tokens; stop exit %s\n",
      tag.c_str(), build_s, trim(size.out).c_str(), ready_ms, js.tokens().size(),
      trim(code.out).c_str());
}

}  // namespace
}  // namespace conformance
