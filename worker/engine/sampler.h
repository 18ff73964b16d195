#pragma once
// CPU sampler (M0-W-1030..1032, 1420, 1421). Order: repetition penalty (over history, as
// llama.cpp: positive logits divided, negative multiplied) -> greedy if temperature == 0
// -> top-k -> temperature -> softmax -> top-p -> min-p -> draw with the seeded RNG.
//
// The exact procedure (WRK-D18), which the GPU sampler (kernels/sampling.cu) reproduces
// pick for pick: every step is integer arithmetic or a fixed IEEE operation, see
// engine/sampler_math.h.
//  1. penalty: every distinct id of `history` (ids outside the vocabulary ignored) once:
//     logit > 0 ? logit / penalty : logit * penalty (skipped when penalty == 1).
//  2. temperature <= 0: return argmax (lowest id on ties); no random draw is made.
//  3. candidates sorted by (logit descending, id ascending; -0 equals +0); top_k > 0 keeps
//     the first k.
//  4. scaled = logit / temperature (float); weight w_i = sampler_math::weight(scaled_i -
//     scaled_0) = floor(2^32 e^(scaled_i - scaled_0)), an integer; total = sum of w_i.
//  5. top_p < 1: keep the shortest prefix whose cumulative weight >= top_p * total
//     (double product, at least 1 kept).
//  6. min_p > 0: keep the prefix before the first candidate with w < min_p * 2^32 (the top
//     candidate's weight is 2^32; at least 1 kept).
//  7. draw = sampler_draw(rng) (53 bits); target = floor(draw * kept_total / 2^53); return
//     the first kept candidate whose cumulative weight exceeds target.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace worker {

// One draw of 53 random bits (rng() >> 11) from the job's generator: the only way either
// backend consumes randomness, so cpu and cuda draw identical streams.
uint64_t sampler_draw(std::mt19937_64& rng);

// The engine's guard for callers that bypass the server's request table (CLI, receipt
// replay): parameters the sampler cannot run are WorkerError(InvalidRequest), for either
// backend's sample(). The HTTP ranges live in server/request.cpp.
void check_sampling_params(const SamplingParams& p);

int32_t sample_logits(std::span<const float> logits, const SamplingParams& params,
                      std::span<const int32_t> history, std::mt19937_64& rng);

struct SampleCandidate {
  int32_t id;
  uint64_t weight;  // step 4's integer weight (the top candidate's is 2^32)
  double p;         // weight / total of step 4 (before top-p / min-p), for inspection
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

// The receipt's per-step logits hash (WRK-D18, sampler_math::logit_term); the GPU sampler
// computes the same value in any summation order.
uint64_t logits_hash(std::span<const float> logits);

}  // namespace worker
