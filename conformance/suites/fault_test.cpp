// Fault injection (WRK-D28, issue 15): with the test-only switch WORKER_TEST_FAULT_ALLOC=N
// the N-th job-time scratch allocation fails. The job that meets it ends `started` ...
// `error` VRAM_OOM (retriable), /health reports unhealthy, the process keeps serving and the
// next job succeeds (M0-W-1021). The cpu case runs everywhere (CI included); the cuda case
// needs a GPU and a CUDA build and says "not run" otherwise.
#include <gtest/gtest.h>

#include <filesystem>

#include "harness/suite.h"

namespace conformance {
namespace {

nlohmann::json fault_job(const std::string& id) {
  return {{"job_id", id}, {"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 0}};
}

// `at`: the switch's N. `mid_stream`: the failing job streams tokens before the failure
// (cpu, N = 3: the prefill and one decode step succeed); cuda, N = 1, fails the prefill
// scratch, the one device allocation a job makes, so none.
void allocation_failure_mid_job(const std::string& backend, int at, bool mid_stream) {
  WorkerOptions o;
  o.model = stories_model();
  o.backend = backend;
  o.env = {"WORKER_TEST_FAULT_ALLOC=" + std::to_string(at)};
  WorkerProcess w(o);
  const auto armed = w.log_events("test_fault_armed");
  ASSERT_EQ(armed.size(), 1u) << w.log_text();
  EXPECT_EQ(armed[0]["level"], "warn");

  const JobStream a = run_job(w.port(), fault_job(unique_job_id("oom")));
  ASSERT_EQ(a.status, 200) << a.describe();
  EXPECT_TRUE(a.violations.empty()) << a.describe();
  ASSERT_NE(a.terminal(), nullptr) << a.describe();
  EXPECT_EQ(a.events.front().event, "started") << a.describe();
  EXPECT_EQ((*a.terminal())["type"], "error") << a.describe();
  EXPECT_EQ((*a.terminal())["code"], "VRAM_OOM") << a.describe();
  EXPECT_EQ((*a.terminal())["retriable"], true) << a.describe();
  if (mid_stream)
    EXPECT_FALSE(a.tokens().empty()) << a.describe();
  else
    EXPECT_TRUE(a.tokens().empty()) << a.describe();
  // M0-W-1021: unhealthy but serving until a job succeeds.
  auto h = http_get(w.port(), "/health");
  EXPECT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(h.json()["status"], "unhealthy") << h.body;

  const JobStream b = run_job(w.port(), fault_job(unique_job_id("after")));
  EXPECT_TRUE(b.violations.empty()) << b.describe();
  ASSERT_NE(b.terminal(), nullptr) << b.describe();
  EXPECT_EQ((*b.terminal())["type"], "end") << b.describe();
  EXPECT_GT((*b.terminal())["tokens_out"], 0) << b.describe();
  EXPECT_EQ(http_get(w.port(), "/health").json()["status"], "healthy");
  EXPECT_TRUE(w.running());
  EXPECT_EQ(w.stop(), 0) << w.log_text();
}

// REQ: WRK-D28 M0-W-1021 WRK-D11 M0-W-1510 WRK-D6
TEST(ConformanceFault, AllocationFailureMidJobCpu) {
  allocation_failure_mid_job("cpu", 3, true);
}

// The GPU form of the same check: the prefill scratch's cudaMalloc fails (injected).
// REQ: WRK-D28 M0-W-1021 WRK-D11 M0-W-1510 WRK-D6
TEST(ConformanceFault, DeviceAllocationFailureMidJobCuda) {
  if (!CONFORMANCE_HAVE_CUDA) GTEST_SKIP() << "not run: this build has no CUDA backend";
  if (!std::filesystem::exists("/dev/nvidia0"))
    GTEST_SKIP() << "not run: no CUDA device on this machine";
  allocation_failure_mid_job("cuda", 1, false);
}

// A parity log that cannot be written (/dev/full: every write fails with ENOSPC) is a
// warning; jobs still stream and end.
// REQ: WRK-D28 WRK-D16
TEST(ConformanceFault, UnwritableParityLogWarnsAndServingContinues) {
  WorkerOptions o;
  o.model = stories_model();
  o.extra_args = {"--log-logits", "/dev/full"};
  WorkerProcess w(o);
  for (int i = 0; i < 2; ++i) {
    const JobStream js = run_job(w.port(), fault_job(unique_job_id("full")));
    EXPECT_TRUE(js.violations.empty()) << js.describe();
    ASSERT_NE(js.terminal(), nullptr) << js.describe();
    EXPECT_EQ((*js.terminal())["type"], "end") << js.describe();
  }
  const auto warn = w.wait_for_log("log_logits_write_failed", std::chrono::seconds(5));
  ASSERT_TRUE(warn.has_value()) << w.log_text();
  EXPECT_EQ(warn->json["level"], "warn");
  EXPECT_EQ(http_get(w.port(), "/health").json()["status"], "healthy");
  EXPECT_EQ(w.stop(), 0) << w.log_text();
}

}  // namespace
}  // namespace conformance
