// `worker-orcd trace` with CUDA sides (GPU machine; "not run" elsewhere): the exact path
// against the CPU reference is identical through every layer and the logits in both cache
// modes, and the fast path against the exact one is traced to an op (it differs somewhere).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/trace.h"
#include "gpu_test_util.h"

namespace worker {
namespace {

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("WORKER_GENERATED_FIXTURES");
  const std::string path =
      (dir ? std::string(dir) : std::string(WORKER_SOURCE_DIR) + "/fixtures/generated") + "/" +
      name;
  if (!std::filesystem::exists(path)) ADD_FAILURE() << "missing fixture " << path;
  return path;
}

// REQ: WRK-D29 M0-W-1201
TEST(CudaTrace, ExactIsIdenticalToTheCpuReference) {
  REQUIRE_GPU();
  for (const char* m : {"qwen2-g7-q8_0.gguf", "qwen2-g7-f16.gguf", "llama-g2-q4_k.gguf"}) {
    for (const bool kv_f16 : {true, false}) {
      TraceOptions o;
      o.model = fixture(m);
      o.a = "cpu";
      o.b = "cuda:exact";
      o.kv_f16 = kv_f16;
      o.tokens = {1, 20, 30, 40, 50, 60, 70};
      o.steps = 3;
      const TraceResult r = run_trace(o);
      EXPECT_FALSE(r.diff.has_value()) << m << "\n" << describe(r, o);
      EXPECT_EQ(r.steps_run, 4);
      // k and v before the cache exist on the CPU side only
      EXPECT_EQ(r.skipped, (std::vector<std::string>{"k", "v"})) << describe(r, o);
    }
  }
}

// REQ: WRK-D29
TEST(CudaTrace, FastAgainstExactNamesAnOp) {
  REQUIRE_GPU();
  TraceOptions o;
  o.model = fixture("qwen2-g7-f16.gguf");
  o.a = "cuda:exact";
  o.b = "cuda:fast";
  o.tokens = {1, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170};
  const TraceResult r = run_trace(o);
  ASSERT_TRUE(r.diff.has_value()) << describe(r, o);
  EXPECT_FALSE(r.diff->op.empty());
  EXPECT_NE(r.diff->a, r.diff->b);
  EXPECT_GT(r.diff->max_abs_diff, 0.0);
}

}  // namespace
}  // namespace worker
