#pragma once
// Shared by the server tests: the real stories260K model on the CPU engine, and an Engine
// decorator that slows or fails the REAL engine's forward pass on demand, so that cancel,
// timeout and VRAM_OOM paths are exercised deterministically (the decorator never produces
// logits itself).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/errors.h"
#include "common/test_helpers.h"
#include "engine/engine.h"
#include "gguf/model_config.h"
#include "tokenizer/tokenizer.h"

namespace worker::server::testing {

// Latency bounds in these tests are the requirement's numbers; sanitizer builds run ~10x
// slower, so their bounds are scaled (the plain build checks the real numbers).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr double kTimeScale = 10.0;
#else
inline constexpr double kTimeScale = 1.0;
#endif

inline std::string stories_path() {
  return worker::test::shared_fixtures() + "/stories260K.gguf";
}

struct StoriesModel {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
};

// Loads once per process; FAILS loudly when the fixture is missing.
inline const StoriesModel& stories() {
  static const StoriesModel m = [] {
    StoriesModel s;
    const std::string p = stories_path();
    if (!std::filesystem::exists(p)) {
      ADD_FAILURE() << "missing shared fixture " << p << " (set WORKER_SHARED_FIXTURES)";
      return s;
    }
    s.model = load_model(p);
    s.tok = make_tokenizer(*s.model->file);
    return s;
  }();
  return m;
}

class ControlledEngine final : public Engine {
 public:
  explicit ControlledEngine(std::unique_ptr<Engine> inner) : inner_(std::move(inner)) {}
  std::atomic<int> eval_delay_ms{0};
  std::atomic<int> fail_oom_at_eval{-1};  // throw VRAM_OOM on this eval call (0-based)
  std::atomic<int> evals{0};
  std::atomic<int> resets{0};
  std::atomic<bool> resident{true};
  // eval_overlapped calls its `meanwhile` after the work (as late as a GPU backend may: after
  // queueing everything) instead of the default's before it.
  std::atomic<bool> meanwhile_last{false};

  const ModelConfig& config() const override { return inner_->config(); }
  BackendInfo info() const override { return inner_->info(); }
  VramUsage vram() const override { return inner_->vram(); }
  bool verify_residency() override { return resident.load(); }
  int32_t n_ctx() const override { return inner_->n_ctx(); }
  int32_t n_past() const override { return inner_->n_past(); }
  void reset() override {
    ++resets;
    inner_->reset();
  }
  void eval(std::span<const int32_t> tokens, bool all_logits) override {
    const int n = evals++;
    if (n == fail_oom_at_eval.load())
      throw WorkerError(ErrorCode::VramOom, "test: KV cache allocation failed");
    if (const int d = eval_delay_ms.load(); d > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(d));
    inner_->eval(tokens, all_logits);
  }
  void eval_overlapped(std::span<const int32_t> tokens, bool all_logits,
                       const std::function<void()>& meanwhile) override {
    if (!meanwhile_last.load()) return Engine::eval_overlapped(tokens, all_logits, meanwhile);
    eval(tokens, all_logits);
    if (meanwhile) meanwhile();
  }
  std::span<const float> logits() const override { return inner_->logits(); }
  std::span<const float> logits_at(size_t i) const override { return inner_->logits_at(i); }
  int32_t sample(const SamplingParams& p, std::span<const int32_t> h, std::mt19937_64& rng,
                 uint64_t* logits_hash) override {
    return inner_->sample(p, h, rng, logits_hash);
  }

 private:
  std::unique_ptr<Engine> inner_;
};

inline std::unique_ptr<ControlledEngine> make_controlled_engine(int32_t ctx = 512) {
  return std::make_unique<ControlledEngine>(make_engine("cpu", stories().model, ctx));
}

}  // namespace worker::server::testing
