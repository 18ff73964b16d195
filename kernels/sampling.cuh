#pragma once
// Token sampling on the GPU: the CPU sampler's procedure (worker/engine/sampler.h) step for
// step, so both backends pick the same id from the same logits and the same draw, always
// (WRK-D18): repetition penalty over the distinct history ids -> greedy argmax (lowest id on
// ties) when temperature <= 0 -> otherwise sort by (logit desc, id asc), top-k, integer
// weights floor(2^32 e^(scaled - scaled_0)) (engine/sampler_math.h), top-p and min-p on
// integer prefix sums, and the integer draw. Integer sums are exact in any order, so the
// parallel reductions here equal the CPU's loops. Parameters, history and the draw live in
// device memory (filled by the host per step); the result is one SampleOut on the device.
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
  uint64_t draw = 0;  // 53 random bits drawn by the host with sampler_draw(rng)
};

// What one sampling step leaves on the device: the id and the receipt's hash of the logits
// it was sampled from (WRK-D18), copied back together.
struct SampleOut {
  int32_t id = 0;
  int32_t reserved = 0;
  uint64_t logits_hash = 0;
};

// Where one sampling step leaves its result: *out (device memory), and, when io is set, the
// next decode step's input, io[0] = n_past and io[1] = the id, written by the same kernel (no host
// round trip and no kernel of its own: CudaEngine::sample_and_continue).
struct SampleSink {
  SampleOut* out = nullptr;
  int32_t* io = nullptr;
  int32_t n_past = 0;
};

// Device scratch for a vocabulary of n_vocab; sizes from sampling_scratch_bytes().
struct SampleScratch {
  float* work = nullptr;          // canonical (+0 for -0), penalized logits [V]
  float* keys_sorted = nullptr;   // [V]
  int32_t* ids = nullptr;         // 0..V-1 [V] (constant after init)
  int32_t* ids_sorted = nullptr;  // [V]
  uint64_t* weights = nullptr;    // integer candidate weights [V]
  int32_t* seen = nullptr;        // [V] zero between calls (penalty dedup)
  float* part_v = nullptr;        // [kArgmaxBlocks] per-block maxima
  int32_t* part_i = nullptr;      // [kArgmaxBlocks] their ids
  uint64_t* part_h = nullptr;     // [kArgmaxBlocks] per-block logits-hash sums
  void* sort_temp = nullptr;
  size_t sort_temp_bytes = 0;
};

constexpr int kArgmaxBlocks = 256;

size_t sampling_sort_temp_bytes(int n_vocab);
// Fills ids with 0..V-1 and clears seen; call once after allocating.
void sampling_init(const SampleScratch& s, int n_vocab, cudaStream_t stream);
// history: device [max n_history]. apply_penalty = the host's knowledge that
// repetition_penalty != 1 and the history is not empty (else the greedy path reads the
// logits in place, saving launches).
void sample(const float* logits, int n_vocab, const SampleParams* d_params, bool greedy,
            bool apply_penalty, const int32_t* d_history, const SampleScratch& s,
            const SampleSink& sink, cudaStream_t stream);
}  // namespace worker::kern
