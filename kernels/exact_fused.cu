// Exact fused kernels (see exact.cuh): rmsnorm_act = rmsnorm + quantize_act, swiglu_act =
// swiglu + quantize_act, one launch each. They write exactly what the unfused sequence
// writes (y / g and the ActBuf), so they inherit its exactness:
//  - the op part is the unfused kernel's code: rmsnorm's double tree with the certainty
//    check and the sequential fallback (math::rms_mean_certain; the thread decomposition of
//    exact_ops.cu's ex_rmsnorm_kernel, 256 threads, thread k summing columns k, k + 256, ...,
//    so ExactOpsHost.RmsnormTreeEmulationMatchesCpu covers it), swiglu element-wise with
//    math::swiglu_one;
//  - the rounding part works on the values still in registers, in chunks of 256 columns
//    (thread k of the block holds column c0 + k):
//      F32 / F16 / BF16: element-wise copy / round to nearest even;
//      Q8_0: a warp holds one 32-block (one column per lane): amax by a butterfly max (exact
//        in any order), then quantize_act's formulas (math::act_q8_0_*);
//      Q8_K: the block holds one 256-block: the first element of largest |x| by
//        math::q8k_max_merge (warp butterfly, lower lanes winning ties, then the 8 warps'
//        winners in warp order: the CPU's strict-> scan), iscale = -127 / max, quants, sums
//        of 16 quants by integer shuffles (exact), d = 1 / iscale.
// Deterministic, no atomics; launch geometry depends only on the shapes.
// (The attention's rounding for the next matmul is fused into its decode kernel,
// attention_exact.cu.)
#include <algorithm>
#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_ops_math.cuh"
#include "gguf/ggml_types.h"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

constexpr int kT = 256;  // threads per block; one chunk of columns = kT columns

enum ActKind : int { kActF32 = 0, kActF16 = 1, kActBF16 = 2, kActQ8_0 = 3, kActQ8_K = 4 };

// The rounding quantize_act applies for `type` (a weight type, as quantize_act takes, or
// Q8_0 / Q8_K themselves); checks the row length as quantize_act does.
ActKind act_kind(uint32_t type, int cols, const char* what) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32: return kActF32;
    case GgmlType::F16: return kActF16;
    case GgmlType::BF16: return kActBF16;
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
      if (cols % 32 != 0) {
        throw WorkerError(ErrorCode::Internal, std::string(what) + ": row length " +
                                                   std::to_string(cols) +
                                                   " is not a multiple of 32 (Q8_0 blocks)");
      }
      return kActQ8_0;
    case GgmlType::Q8_K:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
      if (cols % 256 != 0) {
        throw WorkerError(ErrorCode::Internal, std::string(what) + ": row length " +
                                                   std::to_string(cols) +
                                                   " is not a multiple of 256 (Q8_K blocks)");
      }
      return kActQ8_K;
    default:
      throw WorkerError(ErrorCode::Internal, std::string(what) + ": unsupported weight type " +
                                                 std::string(ggml_type_name(type)));
  }
}

// Shared memory of the Q8_K merge (the 8 warps' winners).
struct ActShared {
  float a[kT / kWarp];
  float m[kT / kWarp];
};

// Writes row t's rounded / quantized value of column `col` = c0 + threadIdx.x (v: its value;
// valid: col < n). Called by every thread of the block for the same c0 (Q8_K synchronizes
// the block; Q8_0 the warp).
template <int AK>
__device__ __forceinline__ void act_store(float v, int col, bool valid, int n, size_t t,
                                          const ActBuf& a, ActShared& sh) {
  if constexpr (AK == kActF32) {
    if (valid) a.f[t * n + col] = v;
  } else if constexpr (AK == kActF16) {
    if (valid) a.f[t * n + col] = math::act_round_fp16(v);
  } else if constexpr (AK == kActBF16) {
    if (valid) a.f[t * n + col] = math::act_round_bf16(v);
  } else if constexpr (AK == kActQ8_0) {
    // n % 32 == 0 and c0 % 256 == 0: a warp's 32 columns are one block, all valid or none
    // (warp-uniform branch).
    if (valid) {
      float amax = fabsf(v);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      a.q[t * n + col] = math::act_q8_0_quant(v, math::act_q8_0_id(amax));
      if (threadIdx.x % kWarp == 0) a.d[t * (n / 32) + col / 32] = math::act_q8_0_d(amax);
    }
  } else {
    // Q8_K: n % 256 == 0, every thread valid; the block's 256 columns are one Q8_K block.
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    float am = fabsf(v), mx = v;
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const float oa = __shfl_xor_sync(0xffffffffu, am, o);
      const float om = __shfl_xor_sync(0xffffffffu, mx, o);
      math::q8k_max_merge(am, mx, oa, om, (lane ^ o) < lane);
    }
    if (lane == 0) {
      sh.a[warp] = am;
      sh.m[warp] = mx;
    }
    __syncthreads();
    // The warps' winners in index order with the CPU's strict > from amax = 0.
    float amax = 0.0f, mxv = 0.0f;
#pragma unroll
    for (int w = 0; w < kT / kWarp; ++w) math::q8k_max_merge(amax, mxv, sh.a[w], sh.m[w], false);
    __syncthreads();  // sh is rewritten by the next chunk
    int qi = 0;
    float dv = 0.0f;
    if (amax != 0.0f) {
      const float iscale = -127.f / mxv;
      qi = math::act_q8_k_quant(v, iscale);
      dv = 1 / iscale;
    }
    a.q[t * n + col] = static_cast<int8_t>(qi);
    int s = qi;  // sums of 16 quants: integers, exact in any order
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane % 16 == 0) a.bsum[t * (n / 16) + col / 16] = s;
    if (threadIdx.x == 0) a.d[t * (n / 256) + col / 256] = dv;
  }
}

// ---- rmsnorm + act: one block per row (ex_rmsnorm_kernel's decomposition) ----------

template <int AK>
__global__ void __launch_bounds__(kT)
    ex_rmsnorm_act_kernel(const float* __restrict__ x, const float* __restrict__ w,
                          float* __restrict__ y, int n, float eps, ActBuf a) {
  __shared__ double shd[32];
  __shared__ float sh_mean;
  __shared__ ActShared sha;
  // Norm weights are never written by a kernel: read them before the PDL wait.
  constexpr int kPre = 4;
  float wpre[kPre];
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kT;
    wpre[k] = i < n ? w[i] : 0.0f;
  }
  griddep_wait();
  const size_t row = blockIdx.x;
  const float* xr = x + row * n;
  float* yr = y + row * n;
  float xpre[kPre];
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kT;
    xpre[k] = i < n ? xr[i] : 0.0f;
    if (i < n) s += static_cast<double>(xpre[k] * xpre[k]);
  }
  for (int i = threadIdx.x + kPre * kT; i < n; i += kT) s += static_cast<double>(xr[i] * xr[i]);
  // The block's double tree, as math::block_sum_double (warp butterflies, then the
  // warps' sums; every thread gets the same bits).
  {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) shd[warp] = s;
    __syncthreads();
    double r = lane < kT / kWarp ? shd[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    s = r;
  }
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
    const int c0 = k * kT;
    if (c0 >= n) break;  // uniform
    const int i = c0 + threadIdx.x;
    const bool valid = i < n;
    const float v = (xpre[k] * scale) * wpre[k];
    if (valid) yr[i] = v;
    act_store<AK>(v, i, valid, n, row, a, sha);
  }
  for (int c0 = kPre * kT; c0 < n; c0 += kT) {
    const int i = c0 + threadIdx.x;
    const bool valid = i < n;
    const float v = valid ? (xr[i] * scale) * w[i] : 0.0f;
    if (valid) yr[i] = v;
    act_store<AK>(v, i, valid, n, row, a, sha);
  }
}

// ---- swiglu + act: grid (chunk blocks, tokens), chunks of 256 columns ---------------

template <int AK>
__global__ void __launch_bounds__(kT)
    ex_swiglu_act_kernel(float* __restrict__ g, const float* __restrict__ u, int F, ActBuf a) {
  __shared__ ActShared sha;
  griddep_wait();
  const size_t t = blockIdx.y;
  const int f16 = F & ~15;
  float* gr = g + t * F;
  const float* ur = u + t * F;
  for (int c0 = blockIdx.x * kT; c0 < F; c0 += gridDim.x * kT) {  // uniform over the block
    const int i = c0 + threadIdx.x;
    const bool valid = i < F;
    float v = 0.0f;
    if (valid) {
      v = math::swiglu_one(gr[i], ur[i], i, f16);
      gr[i] = v;
    }
    act_store<AK>(v, i, valid, F, t, a, sha);
  }
}

template <int AK>
void launch_rmsnorm_act(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                        const ActBuf& a, cudaStream_t stream) {
  launch_pdl("ex_rmsnorm_act_kernel", ex_rmsnorm_act_kernel<AK>, dim3(n_rows), dim3(kT), stream, x,
             w, y, n, eps, a);
  CUDA_CHECK_LAUNCH("ex_rmsnorm_act_kernel");
}

template <int AK>
void launch_swiglu_act(float* g, const float* u, int n_tok, int F, const ActBuf& a,
                       cudaStream_t stream) {
  // One block per chunk of 256 columns (at decode, F = 4864: 19 blocks), fewer when many
  // tokens fill the GPU anyway.
  const int chunks = (F + kT - 1) / kT;
  const int per_tok = std::max(1, std::min(chunks, (132 * 8 + n_tok - 1) / n_tok));
  launch_pdl("ex_swiglu_act_kernel", ex_swiglu_act_kernel<AK>, dim3(per_tok, n_tok), dim3(kT),
             stream, g, u, F, a);
  CUDA_CHECK_LAUNCH("ex_swiglu_act_kernel");
}

}  // namespace

void rmsnorm_act(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                 uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  if (n_rows <= 0 || n <= 0) return;
  switch (act_kind(act_type, n, "exact::rmsnorm_act")) {
    case kActF32: return launch_rmsnorm_act<kActF32>(x, w, y, n_rows, n, eps, a, stream);
    case kActF16: return launch_rmsnorm_act<kActF16>(x, w, y, n_rows, n, eps, a, stream);
    case kActBF16: return launch_rmsnorm_act<kActBF16>(x, w, y, n_rows, n, eps, a, stream);
    case kActQ8_0: return launch_rmsnorm_act<kActQ8_0>(x, w, y, n_rows, n, eps, a, stream);
    case kActQ8_K: return launch_rmsnorm_act<kActQ8_K>(x, w, y, n_rows, n, eps, a, stream);
  }
}

void swiglu_act(float* g, const float* u, int n_tok, int F, uint32_t act_type, const ActBuf& a,
                cudaStream_t stream) {
  if (n_tok <= 0 || F <= 0) return;
  if (n_tok > 65535) {
    throw WorkerError(ErrorCode::Internal,
                      "exact::swiglu_act: " + std::to_string(n_tok) + " tokens (grid y limit)");
  }
  switch (act_kind(act_type, F, "exact::swiglu_act")) {
    case kActF32: return launch_swiglu_act<kActF32>(g, u, n_tok, F, a, stream);
    case kActF16: return launch_swiglu_act<kActF16>(g, u, n_tok, F, a, stream);
    case kActBF16: return launch_swiglu_act<kActBF16>(g, u, n_tok, F, a, stream);
    case kActQ8_0: return launch_swiglu_act<kActQ8_0>(g, u, n_tok, F, a, stream);
    case kActQ8_K: return launch_swiglu_act<kActQ8_K>(g, u, n_tok, F, a, stream);
  }
}

}  // namespace worker::kern::exact
