#include "launch.cuh"

namespace worker::kern {
namespace {
// Does nothing; launched without the PDL attribute it starts only after the previous
// kernel has completed, and (never triggering early) lets the next kernel start only
// after it has completed itself.
__global__ void pdl_fence_kernel() {}
}  // namespace

void pdl_fence(cudaStream_t stream) {
  if (!pdl_enabled()) return;
  pdl_fence_kernel<<<1, 1, 0, stream>>>();
  CUDA_CHECK_LAUNCH("pdl_fence_kernel");
}
}  // namespace worker::kern
