#include "common.cuh"
#include "cuda_check.h"
#include "launch.cuh"
#include "rmsnorm.cuh"

namespace worker::kern {
namespace {
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(const float* __restrict__ x, const void* __restrict__ w, uint32_t w_type,
                   float* __restrict__ y, int n, float eps) {
  __shared__ float sh[32];
  // The norm weights are never written by a kernel: read the first ones before waiting
  // for the previous kernel (PDL), so their latency overlaps its tail.
  constexpr int kPre = 4;
  float wpre[kPre];
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kThreads;
    wpre[k] = i < n ? load_float_elem(w, w_type, i) : 0.0f;
  }
  griddep_wait();
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.0f, xpre[kPre];
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kThreads;
    xpre[k] = i < n ? xr[i] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    if (threadIdx.x + k * kThreads < n) ss += xpre[k] * xpre[k];
  }
  for (int i = threadIdx.x + kPre * kThreads; i < n; i += kThreads) ss += xr[i] * xr[i];
  ss = block_sum(ss, sh);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i < n) yr[i] = (xpre[k] * scale) * wpre[k];
  }
  for (int i = threadIdx.x + kPre * kThreads; i < n; i += kThreads) {
    yr[i] = (xr[i] * scale) * load_float_elem(w, w_type, i);
  }
}
}  // namespace

void rmsnorm(const float* x, const void* w, uint32_t w_type, float* y, int n_rows, int n, float eps,
             cudaStream_t stream) {
  launch_pdl("rmsnorm_kernel", rmsnorm_kernel, dim3(n_rows), dim3(kThreads), stream, x, w, w_type,
             y, n, eps);
  CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}
}  // namespace worker::kern
