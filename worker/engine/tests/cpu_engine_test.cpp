// CPU backend against the real stories260K model and llama.cpp's greedy continuation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/errors.h"
#include "common/test_helpers.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/sampler.h"

namespace worker {
namespace {

std::shared_ptr<const Model> load_stories() {
  const std::string path = test::shared_fixtures() + "/stories260K.gguf";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "missing shared fixture " << path << " (set WORKER_SHARED_FIXTURES)";
    return nullptr;
  }
  return load_model(path);
}

nlohmann::json load_golden() {
  const std::string path = test::shared_fixtures() + "/stories260K.greedy200.json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing shared fixture " << path;
    return {};
  }
  return nlohmann::json::parse(in);
}

// REQ: M0-W-1214 M0-W-1420 M0-SYS-2.3.1 WRK-D1
TEST(EngineCpuStories, Greedy200FromBosEqualsLlamaCpp) {
  auto model = load_stories();
  ASSERT_TRUE(model);
  const auto golden = load_golden();
  ASSERT_FALSE(golden.is_null());
  const auto prompt = golden.at("prompt_tokens").get<std::vector<int32_t>>();
  const auto expected = golden.at("generated_tokens").get<std::vector<int32_t>>();
  ASSERT_EQ(expected.size(), 200u);

  auto engine = make_cpu_engine(model, 0);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::mt19937_64 rng(0);
  engine->eval(prompt);
  std::vector<int32_t> got;
  for (size_t i = 0; i < expected.size(); ++i) {
    const int32_t id = engine->sample(greedy, got, rng);
    got.push_back(id);
    engine->eval(std::span<const int32_t>(&got.back(), 1));
  }
  EXPECT_EQ(got, expected);
}

// Prefill of a sequence in one call equals evaluating it token by token (same KV cache,
// same logits up to float summation order: like llama.cpp, a batch is summed in tinyBLAS
// order and one token in vec_dot order), and reset() starts over at position 0 (same
// call, same floats).
// REQ: M0-W-1420 WRK-D15
TEST(EngineCpuStories, BatchPrefillEqualsTokenByToken) {
  auto model = load_stories();
  ASSERT_TRUE(model);
  const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 432, 383, 286};
  auto a = make_cpu_engine(model, 64);
  a->eval(toks, true);
  auto b = make_cpu_engine(model, 64);
  for (size_t i = 0; i < toks.size(); ++i) {
    b->eval(std::span<const int32_t>(&toks[i], 1));
    const auto la = a->logits_at(i), lb = b->logits();
    ASSERT_EQ(la.size(), lb.size());
    for (size_t j = 0; j < la.size(); ++j) ASSERT_NEAR(la[j], lb[j], 1e-4f) << "pos " << i;
  }
  EXPECT_EQ(a->n_past(), 8);
  const std::vector<float> last(a->logits().begin(), a->logits().end());
  a->reset();
  EXPECT_EQ(a->n_past(), 0);
  a->eval(toks, true);
  for (size_t j = 0; j < last.size(); ++j) ASSERT_EQ(a->logits()[j], last[j]);
  // Only the last position's logits: its last-layer FFN runs on one row, as in llama.cpp.
  a->reset();
  a->eval(toks);
  for (size_t j = 0; j < last.size(); ++j) ASSERT_NEAR(a->logits()[j], last[j], 1e-4f);
}

// REQ: M0-W-1420 WRK-D8
TEST(EngineCpuStories, ContextOverflowIsInvalidRequest) {
  auto model = load_stories();
  ASSERT_TRUE(model);
  auto e = make_cpu_engine(model, 4);
  EXPECT_EQ(e->n_ctx(), 4);
  const std::vector<int32_t> toks = {1, 2, 3};
  e->eval(toks);
  try {
    e->eval(toks);
    FAIL() << "no overflow error";
  } catch (const WorkerError& err) {
    EXPECT_EQ(err.code(), ErrorCode::InvalidRequest);
    EXPECT_NE(std::string(err.what()).find("context"), std::string::npos);
  }
  const std::vector<int32_t> bad = {100000};
  EXPECT_THROW(e->eval(bad), WorkerError);
}

}  // namespace
}  // namespace worker

namespace worker {
namespace {

// The per-layer checkpoint sink sees every layer's tensors for every token, with the
// widths of the model, and l_out of one layer is what the next layer normalises.
TEST(EngineCpuStories, CheckpointSinkReportsEveryLayer) {
  auto model = load_stories();
  ASSERT_TRUE(model);
  const auto& cfg = model->config;
  std::map<std::string, int> count;
  std::map<std::pair<int, int32_t>, std::vector<float>> l_out, ffn_inp;
  auto e = make_cpu_engine(
      model, 16, [&](std::string_view name, int layer, int32_t pos, std::span<const float> v) {
        count[std::string(name)]++;
        for (float x : v) ASSERT_TRUE(std::isfinite(x));
        if (name == "q") {
          EXPECT_EQ(v.size(), static_cast<size_t>(cfg.n_head * cfg.head_dim));
        } else if (name == "k") {
          EXPECT_EQ(v.size(), static_cast<size_t>(cfg.n_head_kv * cfg.head_dim));
        } else if (name == "ffn_act") {
          EXPECT_EQ(v.size(), static_cast<size_t>(cfg.n_ff));
        }
        if (name == "l_out") l_out[{layer, pos}].assign(v.begin(), v.end());
        if (name == "ffn_inp") ffn_inp[{layer, pos}].assign(v.begin(), v.end());
      });
  const std::vector<int32_t> toks = {1, 403, 407};
  e->eval(toks);
  const int L = static_cast<int>(cfg.n_layer);
  for (const char* n : {"attn_norm", "q", "k", "v", "attn_out", "ffn_inp"}) {
    EXPECT_EQ(count[n], 3 * L) << n;
  }
  // llama.cpp keeps only the output rows before the last layer's FFN; so does the engine
  for (const char* n : {"ffn_norm", "ffn_act", "l_out"}) EXPECT_EQ(count[n], 3 * L - 2) << n;
  EXPECT_EQ(count["result_norm"], 1);  // only the position whose logits are computed
  const std::pair<int, int32_t> key{0, 2};
  EXPECT_NE(l_out[key], ffn_inp[key]);  // the FFN changed the residual
  // A second eval continues the positions.
  const int32_t next = 261;
  e->eval(std::span<const int32_t>(&next, 1));
  EXPECT_EQ(l_out.count({L - 1, 3}), 1u);
}

}  // namespace
}  // namespace worker
