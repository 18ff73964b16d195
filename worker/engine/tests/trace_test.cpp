// `worker-orcd trace` on the CPU: the reference against itself is identical through every
// layer and the logits, and one value moved one ulp inside one op of side B (the engine's
// test-only perturbation, which later ops then read) is named exactly: step, layer, op,
// position, index, both values. The CUDA sides run in worker/cuda/tests/cuda_trace_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/test_helpers.h"
#include "engine/trace.h"
#include "gguf/model_config.h"

namespace worker {
namespace {

const char* const kLayerOps[] = {"attn_norm", "q",       "k",        "v",
                                 "k_cache",   "v_cache", "attn_out", "ffn_inp",
                                 "ffn_norm",  "ffn_act", "l_out"};

std::string require(const std::string& path) {
  if (!std::filesystem::exists(path)) ADD_FAILURE() << "missing fixture " << path;
  return path;
}

TraceOptions cpu_vs_cpu(const std::string& model) {
  TraceOptions o;
  o.model = model;
  o.a = o.b = "cpu";
  o.tokens = {1, 403, 407, 261, 500};
  o.steps = 2;
  return o;
}

// REQ: WRK-D29
TEST(Trace, CpuAgainstItselfIsIdenticalInBothCacheModes) {
  for (const std::string& model : {require(test::shared_fixtures() + "/stories260K.gguf"),
                                   require(test::generated_fixtures() + "/qwen2-g7-q8_0.gguf")}) {
    for (const bool kv_f16 : {true, false}) {
      TraceOptions o = cpu_vs_cpu(model);
      o.kv_f16 = kv_f16;
      const TraceResult r = run_trace(o);
      EXPECT_FALSE(r.diff.has_value()) << model << "\n" << describe(r, o);
      const int L = static_cast<int>(load_model(model)->config.n_layer);
      EXPECT_EQ(r.n_layers, L);
      EXPECT_EQ(r.steps_run, 3);
      // every layer op, result_norm and the logits, in each of the 3 evals
      EXPECT_EQ(r.ops_compared, 3 * (11 * L + 2)) << model;
      EXPECT_TRUE(r.skipped.empty());
      EXPECT_NE(
          describe(r, o).find("identical through " + std::to_string(L) + " layers and logits"),
          std::string::npos);
    }
  }
}

// REQ: WRK-D29
TEST(Trace, NamesThePerturbedOpExactly) {
  const std::string model = require(test::shared_fixtures() + "/stories260K.gguf");
  const auto cfg = load_model(model)->config;
  const int64_t D = cfg.n_embd, QD = cfg.n_head * cfg.head_dim, KD = cfg.n_head_kv * cfg.head_dim;
  auto width = [&](const std::string& op) -> int64_t {
    if (op == "q" || op == "attn_out") return QD;
    if (op == "k" || op == "v" || op == "k_cache" || op == "v_cache") return KD;
    if (op == "ffn_act") return cfg.n_ff;
    return D;
  };
  std::vector<std::pair<int, std::string>> cases;
  for (const char* op : kLayerOps) cases.emplace_back(1, op);
  cases.emplace_back(0, "attn_norm");
  cases.emplace_back(static_cast<int>(cfg.n_layer) - 1, "attn_out");
  for (const auto& [layer, op] : cases) {
    TraceOptions o = cpu_vs_cpu(model);
    o.perturb_b.perturb_op = op;
    o.perturb_b.perturb_layer = layer;
    const int64_t flat = 2 * width(op) + 7;  // position 2 of the prompt, element 7
    o.perturb_b.perturb_index = flat;
    const TraceResult r = run_trace(o);
    ASSERT_TRUE(r.diff.has_value()) << op;
    const TraceDiff& d = *r.diff;
    EXPECT_EQ(d.step, 0) << op;
    EXPECT_EQ(d.layer, layer) << op;
    EXPECT_EQ(d.op, op);
    EXPECT_EQ(d.pos, 2) << op;
    EXPECT_EQ(d.index, 7) << op;
    EXPECT_EQ(d.flat_index, flat) << op;
    EXPECT_EQ(d.b, std::nextafter(d.a, INFINITY)) << op;
    EXPECT_EQ(d.n_diff, 1) << op;
    EXPECT_EQ(d.max_abs_diff, static_cast<double>(d.b) - static_cast<double>(d.a)) << op;
    const std::string text = describe(r, o);
    EXPECT_NE(text.find("layer " + std::to_string(layer) + ", op " + op + ", pos 2, index 7"),
              std::string::npos)
        << text;
  }
  // After the last layer: result_norm holds the last position only (one row).
  TraceOptions o = cpu_vs_cpu(model);
  o.perturb_b.perturb_op = "result_norm";
  o.perturb_b.perturb_layer = -1;
  o.perturb_b.perturb_index = 5;
  const TraceResult r = run_trace(o);
  ASSERT_TRUE(r.diff.has_value());
  EXPECT_EQ(r.diff->op, "result_norm");
  EXPECT_EQ(r.diff->layer, -1);
  EXPECT_EQ(r.diff->pos, 4);
  EXPECT_EQ(r.diff->index, 5);
  EXPECT_NE(describe(r, o).find("output, op result_norm"), std::string::npos);
}

// REQ: WRK-D29
TEST(Trace, RejectsBadSides) {
  TraceOptions o = cpu_vs_cpu(require(test::shared_fixtures() + "/stories260K.gguf"));
  o.b = "gpu";
  EXPECT_THROW(run_trace(o), std::invalid_argument);
  o.b = "cuda:exact";
  o.perturb_b.perturb_op = "q";
  EXPECT_THROW(run_trace(o), std::invalid_argument);  // perturbation is a cpu-side switch
}

}  // namespace
}  // namespace worker
