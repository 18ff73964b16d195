#pragma once
// Token sampling on the GPU, the same pipeline as the CPU sampler (worker/engine/sampler.cpp)
// so both backends pick the same ids from the same logits and the same uniform draw:
// repetition penalty over the distinct history ids -> greedy argmax (lowest id on ties)
// when temperature <= 0 -> otherwise sort by (logit desc, id asc), top-k, temperature,
// softmax in double, top-p, min-p, then the first candidate whose cumulative probability
// exceeds u * total. Parameters, history and the draw u live in device memory (filled by
// the host per step), and the result is one int32 on the device.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace worker::kern {

struct SampleParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t top_k = 0;
  int32_t n_history = 0;
  double u = 0.0;  // uniform [0,1) drawn by the host with sampler_uniform(rng)
};

// Device scratch for a vocabulary of n_vocab; sizes from sampling_scratch_bytes().
struct SampleScratch {
  float* work = nullptr;          // penalized logits [V]
  float* keys_sorted = nullptr;   // [V]
  int32_t* ids = nullptr;         // 0..V-1 [V] (constant after init)
  int32_t* ids_sorted = nullptr;  // [V]
  double* probs = nullptr;        // [V]
  int32_t* seen = nullptr;        // [V] zero between calls (penalty dedup)
  float* part_v = nullptr;        // [kArgmaxBlocks] per-block maxima
  int32_t* part_i = nullptr;      // [kArgmaxBlocks] their ids
  void* sort_temp = nullptr;
  size_t sort_temp_bytes = 0;
};

constexpr int kArgmaxBlocks = 256;

size_t sampling_sort_temp_bytes(int n_vocab);
// Fills ids with 0..V-1 and clears seen; call once after allocating.
void sampling_init(const SampleScratch& s, int n_vocab, cudaStream_t stream);
// history: device [max n_history]; out: device int32. apply_penalty = the host's
// knowledge that repetition_penalty != 1 and the history is not empty (else the logits
// are used in place, saving two launches per token).
void sample(const float* logits, int n_vocab, const SampleParams* d_params, bool greedy,
            bool apply_penalty, const int32_t* d_history, const SampleScratch& s, int32_t* d_out,
            cudaStream_t stream);
}  // namespace worker::kern
