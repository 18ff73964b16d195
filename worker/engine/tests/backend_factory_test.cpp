// The backend factory: one model description from the detected architecture drives a
// backend through the Engine interface (M0-W-1213), and a backend is only ever the one
// asked for (D4: no silent fallback).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "common/errors.h"
#include "common/test_helpers.h"
#include "engine/engine.h"
#include "gguf/model_config.h"

using namespace worker;

namespace {

std::string stories_path() {
  return test::shared_fixtures() + "/stories260K.gguf";
}
std::string haiku_path() {
  return test::source_dir() + "/fixtures/haiku/haiku-qwen2.gguf";
}

void expect_finite_logits(const Engine& engine, int64_t vocab) {
  const auto logits = engine.logits();
  ASSERT_EQ(static_cast<int64_t>(logits.size()), vocab);
  size_t finite = 0;
  float lo = logits[0];
  float hi = logits[0];
  for (float v : logits) {
    finite += std::isfinite(v) ? 1 : 0;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_EQ(finite, logits.size());
  EXPECT_GT(hi - lo, 1e-3f) << "logits are flat: nothing was computed";
}

}  // namespace

// REQ: M0-W-1213 M0-W-1212 WRK-D1
TEST(EngineBackendFactory, CpuBackendFollowsTheDetectedArchitecture) {
  ASSERT_TRUE(std::filesystem::exists(stories_path())) << stories_path();
  ASSERT_TRUE(std::filesystem::exists(haiku_path())) << haiku_path();

  auto llama = load_model(stories_path());
  auto engine = make_engine("cpu", llama, 64);
  EXPECT_EQ(engine->config().arch_name, "llama");
  EXPECT_FALSE(engine->config().rope_neox);
  EXPECT_EQ(engine->info().backend, "cpu");
  const std::vector<int32_t> bos = {1};
  engine->eval(bos);
  EXPECT_EQ(engine->n_past(), 1);
  expect_finite_logits(*engine, llama->config.vocab_size);

  auto qwen = load_model(haiku_path());
  auto qwen_engine = make_engine("cpu", qwen, 64);
  EXPECT_EQ(qwen_engine->config().arch_name, "qwen2");
  EXPECT_TRUE(qwen_engine->config().rope_neox);
  EXPECT_TRUE(qwen_engine->config().has_qkv_bias);
  const std::vector<int32_t> prompt = {5, 6, 7};
  qwen_engine->eval(prompt);
  EXPECT_EQ(qwen_engine->n_past(), 3);
  expect_finite_logits(*qwen_engine, qwen->config.vocab_size);
  qwen_engine->reset();
  EXPECT_EQ(qwen_engine->n_past(), 0);
}

// REQ: M0-W-1213 WRK-D4
TEST(EngineBackendFactory, UnknownBackendIsAClearError) {
  auto model = load_model(stories_path());
  try {
    (void)make_engine("tpu", model, 64);
    FAIL() << "make_engine accepted an unknown backend";
  } catch (const WorkerError& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidRequest);
    EXPECT_NE(std::string(e.what()).find("tpu"), std::string::npos) << e.what();
  }
}

// The cuda backend is either really cuda or a clear CUDA_ERROR: never a cpu engine in
// disguise (no silent fallback).
// REQ: WRK-D4 M0-SYS-2.2.1
TEST(EngineBackendFactory, CudaIsNeverSilentlyReplacedByCpu) {
  auto model = load_model(stories_path());
  try {
    auto engine = make_engine("cuda", model, 64);
    EXPECT_EQ(engine->info().backend, "cuda");
    EXPECT_TRUE(engine->info().resident);
  } catch (const WorkerError& e) {
    EXPECT_EQ(e.code(), ErrorCode::CudaError) << e.what();
    EXPECT_FALSE(std::string(e.what()).empty());
  }
}

// The load progress callback (issue 17's terminal progress line): the cpu backend reads every
// weight byte once before it is ready and reports the bytes as they go, ending at the total.
// REQ: WRK-D26
TEST(EngineBackendFactory, CpuBackendReportsLoadProgressUpToEveryTensorByte) {
  auto qwen = load_model(haiku_path());
  uint64_t want = 0;
  for (const TensorInfo& t : qwen->file->tensors()) want += t.nbytes;
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  auto engine = make_engine("cpu", qwen, 64, 0, false, "", [&](uint64_t done, uint64_t total) {
    calls.emplace_back(done, total);
  });
  ASSERT_GE(calls.size(), 2u) << "a 4 MiB model is reported in more than one step";
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, want);
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first);
    }
  }
  EXPECT_EQ(calls.back().first, want);
  engine->eval(std::vector<int32_t>{5, 6, 7});
  expect_finite_logits(*engine, qwen->config.vocab_size);
}
