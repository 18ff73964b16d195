#include "engine/engine.h"

#include "engine/sampler.h"

namespace worker {

int32_t Engine::sample(const SamplingParams& params, std::span<const int32_t> history,
                       std::mt19937_64& rng) {
  return sample_logits(logits(), params, history, rng);
}

}  // namespace worker
