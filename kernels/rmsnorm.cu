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
  griddep_enter();
  __shared__ float sh[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, sh);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
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
