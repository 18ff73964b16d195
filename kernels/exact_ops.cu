// Exact kernels, see exact.cuh: rmsnorm and swiglu, each the floats of the CPU reference
// (worker/engine/cpu/cpu_ops.{h,cpp}) bit for bit. The per-thread math is in
// exact_ops_math.cuh (shared with the host tests, which emulate these decompositions).
//
// Orders reproduced, and why each is exact:
//  - rmsnorm (cpu::rms_norm_row): the CPU sums the float squares x*x sequentially in double.
//    Here a fixed tree sums them in double (threads' strided partial sums, then warp
//    butterflies). The two double sums differ by at most ~2n * 2^-53 of the sum; the mean is
//    float(sum / n), a monotone function of the sum, so when it gives the same float at both
//    ends of that interval (math::rms_mean_certain) the tree's mean is the CPU's. Otherwise
//    (the interval straddles a float rounding boundary: probability ~n * 2^-29 per row,
//    about 4e-6 for n = 896) thread 0 redoes the sum sequentially in the CPU's order. So the
//    mean is always the CPU's; scale = 1/sqrtf(mean + eps) and y = (x*scale)*w are the same
//    IEEE ops.
//  - swiglu (cpu::swiglu_row): element-wise; ggml_silu with ggml_expf (its ldexp as one
//    rounding of an exact double product) for i < F & ~15; the scalar tail calls libm's expf
//    on the CPU: here glibc's expf algorithm in double (math::expf_libm; equal to glibc 2.36's
//    on all but 2 of 3.3e8 floats checked; exact.cuh's "exp in double, rounded once" differs
//    from glibc for 6e-4 of inputs, so it is not used).
// (The attention is attention_exact.cu.) No atomics; every result is computed by one fixed
// order.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_ops_math.cuh"
#include "exact_quant_math.cuh"  // qm::half_bits (device_map_for_tests)
#include "gguf/ggml_types.h"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

// ---- rmsnorm -------------------------------------------------------------------------

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    ex_rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                      float* __restrict__ y, int n, float eps) {
  __shared__ double shd[32];
  __shared__ float sh_mean;
  // Norm weights are never written by a kernel: read them before the PDL wait.
  constexpr int kPre = 4;
  float wpre[kPre];
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    wpre[k] = i < n ? w[i] : 0.0f;
  }
  griddep_wait();
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float xpre[kPre];
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    xpre[k] = i < n ? xr[i] : 0.0f;
    if (i < n) s += static_cast<double>(xpre[k] * xpre[k]);
  }
  for (int i = threadIdx.x + kPre * kNormThreads; i < n; i += kNormThreads) {
    s += static_cast<double>(xr[i] * xr[i]);
  }
  s = math::block_sum_double(s, shd);
  float mean;
  if (!math::rms_mean_certain(s, n, &mean)) {  // uniform: every thread has the same s
    if (threadIdx.x == 0) {
      double q = 0.0;  // the CPU's order
      for (int i = 0; i < n; ++i) q += static_cast<double>(xr[i] * xr[i]);
      sh_mean = math::rms_mean(q, n);
    }
    __syncthreads();
    mean = sh_mean;
  }
  const float scale = math::rms_scale(mean, eps);
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    if (i < n) yr[i] = (xpre[k] * scale) * wpre[k];
  }
  for (int i = threadIdx.x + kPre * kNormThreads; i < n; i += kNormThreads) {
    yr[i] = (xr[i] * scale) * w[i];
  }
}

// ---- swiglu --------------------------------------------------------------------------

constexpr int kSwigluThreads = 256;

using math::swiglu_one;  // shared with exact_fused.cu's swiglu_act

__global__ void __launch_bounds__(kSwigluThreads)
    ex_swiglu_kernel(float* __restrict__ g, const float* __restrict__ u, int n_tok, int F) {
  griddep_wait();
  const int f16 = F & ~15;
  const size_t total = static_cast<size_t>(n_tok) * F;
  const size_t stride = static_cast<size_t>(gridDim.x) * kSwigluThreads;
  if (F % 4 == 0) {  // 16-byte accesses; a group of 4 never straddles a row or the tail
    for (size_t v4 = static_cast<size_t>(blockIdx.x) * kSwigluThreads + threadIdx.x; v4 < total / 4;
         v4 += stride) {
      const int i = static_cast<int>((v4 * 4) % static_cast<size_t>(F));
      float4 gv = reinterpret_cast<const float4*>(g)[v4];
      const float4 uv = reinterpret_cast<const float4*>(u)[v4];
      gv.x = swiglu_one(gv.x, uv.x, i, f16);
      gv.y = swiglu_one(gv.y, uv.y, i + 1, f16);
      gv.z = swiglu_one(gv.z, uv.z, i + 2, f16);
      gv.w = swiglu_one(gv.w, uv.w, i + 3, f16);
      reinterpret_cast<float4*>(g)[v4] = gv;
    }
  } else {
    for (size_t k = static_cast<size_t>(blockIdx.x) * kSwigluThreads + threadIdx.x; k < total;
         k += stride) {
      g[k] = swiglu_one(g[k], u[k], static_cast<int>(k % static_cast<size_t>(F)), f16);
    }
  }
}

__global__ void ex_map_kernel(int which, const float* __restrict__ x, float* __restrict__ y,
                              size_t n) {
  griddep_wait();
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    if (which == 3) {  // the fp16 bits in v's low half
      y[i] = qm::half_bits(__float_as_uint(v));
      continue;
    }
    y[i] = which == 0 ? math::expf_ggml(v) : (which == 1 ? math::silu_ggml(v) : math::expf_libm(v));
  }
}

}  // namespace

namespace math {
void device_map_for_tests(int which, const float* x, float* y, size_t n) {
  launch_pdl("ex_map_kernel", ex_map_kernel, dim3(1024), dim3(256), cudaStream_t{}, which, x, y, n);
  CUDA_CHECK_LAUNCH("ex_map_kernel");
}
}  // namespace math

void rmsnorm(const float* x, const float* w, float* y, int n_rows, int n, float eps,
             cudaStream_t stream) {
  if (n_rows <= 0 || n <= 0) return;
  launch_pdl("ex_rmsnorm_kernel", ex_rmsnorm_kernel, dim3(n_rows), dim3(kNormThreads), stream, x, w,
             y, n, eps);
  CUDA_CHECK_LAUNCH("ex_rmsnorm_kernel");
}

void swiglu(float* g, const float* u, int n_tok, int F, cudaStream_t stream) {
  if (n_tok <= 0 || F <= 0) return;
  const size_t total = static_cast<size_t>(n_tok) * F;
  const size_t per = F % 4 == 0 ? total / 4 : total;
  const int blocks =
      static_cast<int>(std::min<size_t>((per + kSwigluThreads - 1) / kSwigluThreads, 132 * 8));
  launch_pdl("ex_swiglu_kernel", ex_swiglu_kernel, dim3(blocks), dim3(kSwigluThreads), stream, g, u,
             n_tok, F);
  CUDA_CHECK_LAUNCH("ex_swiglu_kernel");
}

}  // namespace worker::kern::exact
