#pragma once
// CPU sampler (M0-W-1030..1032, 1420, 1421). Order: repetition penalty (over history, as
// llama.cpp: positive logits divided, negative multiplied) -> greedy if temperature == 0
// -> top-k -> temperature -> softmax -> top-p -> min-p -> draw with the seeded RNG.
//
// The exact procedure, so that another backend can reproduce it id for id:
//  1. penalty: every distinct id of `history` (ids outside the vocabulary ignored) once:
//     logit > 0 ? logit / penalty : logit * penalty (skipped when penalty == 1).
//  2. temperature <= 0: return argmax (lowest id on ties); no random draw is made.
//  3. candidates sorted by (logit descending, id ascending); top_k > 0 keeps the first k.
//  4. scaled = logit / temperature (float); p_i = exp(double(scaled_i - scaled_0)) / sum.
//  5. top_p < 1: keep the shortest prefix whose cumulative p >= top_p (at least 1).
//  6. min_p > 0: keep the candidates with p >= min_p * p_0 (at least 1).
//  7. u = sampler_uniform(rng) * (sum of kept p); return the first kept candidate whose
//     running cumulative p exceeds u (the last one if rounding leaves none).
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace worker {

// One uniform draw in [0, 1) from the job's generator: the only way either backend
// consumes randomness, so cpu and cuda draw identical streams. (rng() >> 11) * 2^-53.
double sampler_uniform(std::mt19937_64& rng);

int32_t sample_logits(std::span<const float> logits, const SamplingParams& params,
                      std::span<const int32_t> history, std::mt19937_64& rng);

struct SampleCandidate {
  int32_t id;
  double p;  // probability after steps 1..6, not yet renormalised over the kept set
};
// Steps 1 and 3..6 above: the candidates the draw chooses from, in draw order.
// Requires temperature > 0.
std::vector<SampleCandidate> sampler_candidates(std::span<const float> logits,
                                                const SamplingParams& params,
                                                std::span<const int32_t> history);

// Step 1 alone, in place.
void apply_repetition_penalty(std::span<float> logits, float penalty,
                              std::span<const int32_t> history);

// argmax with lowest-id tie break
int32_t argmax(std::span<const float> v);

}  // namespace worker
