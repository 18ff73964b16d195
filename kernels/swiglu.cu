#include "common.cuh"
#include "cuda_check.h"
#include "launch.cuh"
#include "swiglu.cuh"

namespace worker::kern {
namespace {
__global__ void swiglu_kernel(float* __restrict__ g, const float* __restrict__ u, size_t n) {
  griddep_wait();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float x = g[i];
    g[i] = x / (1.0f + expf(-x)) * u[i];
  }
}
__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, size_t n) {
  griddep_wait();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}
}  // namespace

void swiglu(float* g, const float* u, size_t n, cudaStream_t stream) {
  launch_pdl("swiglu_kernel", swiglu_kernel, dim3(static_cast<unsigned>((n + 255) / 256)),
             dim3(256), stream, g, u, n);
  CUDA_CHECK_LAUNCH("swiglu_kernel");
}
void add_inplace(float* y, const float* x, size_t n, cudaStream_t stream) {
  launch_pdl("add_kernel", add_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256),
             stream, y, x, n);
  CUDA_CHECK_LAUNCH("add_kernel");
}
}  // namespace worker::kern
