#pragma once
// CPU sampler (M0-W-1030..1032, 1420, 1421). Order: repetition penalty (over history, as
// llama.cpp: positive logits divided, negative multiplied) -> greedy if temperature == 0
// -> top-k -> temperature -> softmax -> top-p -> min-p -> draw with the seeded RNG.
#include <cstdint>
#include <random>
#include <span>

#include "engine/engine.h"

namespace worker {

// One uniform draw in [0, 1) from the job's generator: the only way either backend
// consumes randomness, so cpu and cuda draw identical streams.
double sampler_uniform(std::mt19937_64& rng);

int32_t sample_logits(std::span<const float> logits, const SamplingParams& params,
                      std::span<const int32_t> history, std::mt19937_64& rng);

// argmax with lowest-id tie break
int32_t argmax(std::span<const float> v);

}  // namespace worker
