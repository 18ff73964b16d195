#pragma once
// out[t] = dequantized row tokens[t] of the embedding table, any supported type. Token ids
// are read from device memory (so the decode step can be a replayed CUDA graph); the
// caller has range-checked them.
#include <cuda_runtime.h>
#include <stdint.h>

#include "weights.cuh"

namespace worker::kern {
void embed(const WeightView& table, const int32_t* tokens, int n_tok, float* out,
           cudaStream_t stream);
}
