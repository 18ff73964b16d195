#pragma once
// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, per row of n; w is F32/F16/BF16 (ggml's
// rms_norm followed by the weight multiply).
#include <cuda_runtime.h>
#include <stdint.h>

namespace worker::kern {
void rmsnorm(const float* x, const void* w, uint32_t w_type, float* y, int n_rows, int n, float eps,
             cudaStream_t stream);
}
