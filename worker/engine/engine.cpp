#include "engine/engine.h"

#include <stdexcept>
#include <string>

#include "common/errors.h"
#include "engine/sampler.h"

namespace worker {

int32_t Engine::sample(const SamplingParams& params, std::span<const int32_t> history,
                       std::mt19937_64& rng, uint64_t* logits_hash) {
  if (logits_hash) *logits_hash = worker::logits_hash(logits());
  return sample_logits(logits(), params, history, rng);
}

void check_eval_input(std::span<const int32_t> tokens, int32_t n_past, int32_t n_ctx,
                      int64_t vocab_size) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw WorkerError(ErrorCode::InvalidRequest, "eval of zero tokens");
  if (n_past + n > n_ctx) {
    throw WorkerError(ErrorCode::InvalidRequest, "context overflow: " + std::to_string(n_past) +
                                                     " cached + " + std::to_string(n) +
                                                     " new tokens exceed the context size " +
                                                     std::to_string(n_ctx));
  }
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab_size) {
      throw WorkerError(ErrorCode::InvalidRequest, "token id " + std::to_string(id) +
                                                       " outside the vocabulary (size " +
                                                       std::to_string(vocab_size) + ")");
    }
  }
}

std::string kv_cache_arg(const std::string& value) {
  if (value != "f16" && value != "f32")
    throw std::invalid_argument("--kv-cache must be f16 or f32, got '" + value + "'");
  return value;
}

}  // namespace worker
