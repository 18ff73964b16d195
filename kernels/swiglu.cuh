#pragma once
// SwiGLU: g[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)), in place over n values.
#include <cuda_runtime.h>
#include <stddef.h>

namespace worker::kern {
void swiglu(float* g, const float* u, size_t n, cudaStream_t stream);
// y[i] += x[i] (residual add; the engine fuses most residual adds into the matvec).
void add_inplace(float* y, const float* x, size_t n, cudaStream_t stream);
}  // namespace worker::kern
