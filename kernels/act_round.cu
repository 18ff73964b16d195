// Activation rounding (act_round.cuh), bit for bit cpu::quantize_activation.
//
// quantize_act: cpu::quantize_activation row by row.
//  - F32 / F16 / BF16: elementwise copy / round to nearest even (__float2half_rn,
//    __float2bfloat16_rn: the same rounding as fp32_to_fp16 / fp32_to_bf16).
//  - Q8_0 (for Q8_0 / Q4_0 / Q5_0 weights): one warp per 32-block, amax by warp max (max is
//    exact in any order), d = amax / 127 (IEEE division) rounded through fp16,
//    q = round-half-even(x * (127 / amax)).
//  - Q8_K (Q4_K / Q6_K): one warp per 256-block; the element of largest |x|, first in index
//    order on ties (the CPU's strict >: each lane scans its 8 elements in order, lanes merge
//    with the lower lane winning ties), iscale = -127 / max, q = min(127, rint(iscale * x)),
//    bsum per 16 (integers), d = 1 / iscale.
//
//
// rmsnorm_act = rmsnorm + quantize_act, swiglu_act = swiglu + quantize_act, one launch each. They
// write exactly what the unfused sequence writes (y / g and the ActBuf), so they inherit its
// exactness:
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

#include "act_round.cuh"
#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact_float_math.cuh"
#include "exact_ops_math.cuh"
#include "exact_quant_math.cuh"
#include "gguf/ggml_types.h"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

size_t align256(size_t n) {
  return (n + 255) & ~size_t{255};
}

// ---------------------------------------------------------------------------------------
// quantize_act

template <ActType A>  // F32 (a copy), F16 or BF16
__global__ void act_float_kernel(const float* __restrict__ x, float* __restrict__ f, size_t n) {
  griddep_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    f[i] = math::act_round(A, x[i]);
  }
}

constexpr int kActThreads = 256;

// One warp per 32-block; blocks are numbered over the whole [n_tok][cols] array (a row's
// blocks are contiguous and rows follow each other, in x as in a.q / a.d).
__global__ void __launch_bounds__(kActThreads)
    act_q8_0_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ d,
                    size_t n_blocks) {
  griddep_wait();
  const size_t warps = static_cast<size_t>(gridDim.x) * (kActThreads / kWarp);
  for (size_t k = blockIdx.x * static_cast<size_t>(kActThreads / kWarp) + threadIdx.x / kWarp;
       k < n_blocks; k += warps)  // warp-uniform
    qm::act_q8_0_block(x, q, d, k);
}

// One warp per 256-block, lane l holding elements 8l..8l+7.
__global__ void __launch_bounds__(kActThreads)
    act_q8_k_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ d,
                    int32_t* __restrict__ bsum, size_t n_blocks) {
  griddep_wait();
  const size_t warps = static_cast<size_t>(gridDim.x) * (kActThreads / kWarp);
  for (size_t k = blockIdx.x * static_cast<size_t>(kActThreads / kWarp) + threadIdx.x / kWarp;
       k < n_blocks; k += warps)  // warp-uniform
    qm::act_q8_k_block(x, q, d, bsum, k);
}

int grid_for(size_t work_items, int per_block) {
  const size_t b =
      (work_items + static_cast<size_t>(per_block) - 1) / static_cast<size_t>(per_block);
  return static_cast<int>(std::min<size_t>(std::max<size_t>(b, 1), 65535));
}

constexpr int kT = 256;  // threads per block; one chunk of columns = kT columns

// The rounding quantize_act applies for weight type `type`; checks the row length as
// quantize_act does.
ActType act_checked(uint32_t type, int cols, const char* what) {
  const ActType t = act_type_for(type, what);
  if (cols % act_block(t) != 0) {
    throw WorkerError(ErrorCode::Internal,
                      std::string(what) + ": row length " + std::to_string(cols) +
                          " is not a multiple of " + std::to_string(act_block(t)) + " (" +
                          std::string(ggml_type_name(type)) + " activation blocks)");
  }
  return t;
}

// Shared memory of the Q8_K merge (the 8 warps' winners).
struct ActShared {
  float a[kT / kWarp];
  float m[kT / kWarp];
};

// Writes row t's rounded / quantized value of column `col` = c0 + threadIdx.x (v: its value;
// valid: col < n). Called by every thread of the block for the same c0 (Q8_K synchronizes
// the block; Q8_0 the warp).
template <ActType AK>
__device__ __forceinline__ void act_store(float v, int col, bool valid, int n, size_t t,
                                          const ActBuf& a, ActShared& sh) {
  if constexpr (AK == ActType::F32 || AK == ActType::F16 || AK == ActType::BF16) {
    const float r = math::act_round(AK, v);
    if (valid) a.f[t * n + col] = r;
    if constexpr (ActBuf::permuted_rounding(AK)) {
      // tinyBLAS's permuted rows (ActBuf::fp), the padding past n included (-0)
      const int np = xf::tb_perm_cols(n);
      if (a.fp != nullptr && col < np) {
        a.fp[t * static_cast<size_t>(np) + xf::tb_perm_pos(col)] = valid ? r : -0.0f;
      }
    }
  } else if constexpr (AK == ActType::Q8_0) {
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

template <ActType AK>
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

template <ActType AK>
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

template <ActType AK>
void launch_rmsnorm_act(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                        const ActBuf& a, cudaStream_t stream) {
  launch_pdl("ex_rmsnorm_act_kernel", ex_rmsnorm_act_kernel<AK>, dim3(n_rows), dim3(kT), stream, x,
             w, y, n, eps, a);
  CUDA_CHECK_LAUNCH("ex_rmsnorm_act_kernel");
}

template <ActType AK>
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

// Whether act_store writes the permuted rows ActBuf::fp for rounding t.
bool permutes(ActType t, const ActBuf& a) {
  return a.fp != nullptr && ActBuf::permuted_rounding(t);
}

// f(integral_constant<ActType, t>) for a run-time rounding t.
template <class F>
void with_act(ActType t, F&& f) {
  switch (t) {
    case ActType::F32: return f(std::integral_constant<ActType, ActType::F32>{});
    case ActType::F16: return f(std::integral_constant<ActType, ActType::F16>{});
    case ActType::BF16: return f(std::integral_constant<ActType, ActType::BF16>{});
    case ActType::Q8_0: return f(std::integral_constant<ActType, ActType::Q8_0>{});
    case ActType::Q8_K: return f(std::integral_constant<ActType, ActType::Q8_K>{});
  }
}

}  // namespace

size_t act_buffer_bytes(int max_tok, int max_cols, size_t mma_bytes) {
  const size_t n = static_cast<size_t>(max_tok) * static_cast<size_t>(max_cols);
  const size_t nt = static_cast<size_t>(max_tok);
  const size_t mc = static_cast<size_t>(max_cols);
  const size_t np = nt * static_cast<size_t>(xf::tb_perm_cols(max_cols));  // ActBuf::fp
  return align256(n * sizeof(float)) + align256(np * sizeof(float)) + align256(n) +
         align256(nt * (mc / 32) * sizeof(float)) + align256(nt * (mc / 16) * sizeof(int32_t)) +
         align256(mma_bytes);
}

ActBuf act_buffer_at(void* base, int max_tok, int max_cols, size_t mma_bytes) {
  const size_t n = static_cast<size_t>(max_tok) * static_cast<size_t>(max_cols);
  const size_t nt = static_cast<size_t>(max_tok);
  const size_t mc = static_cast<size_t>(max_cols);
  auto* p = static_cast<uint8_t*>(base);
  ActBuf a;
  a.f = reinterpret_cast<float*>(p);
  p += align256(n * sizeof(float));
  a.fp = reinterpret_cast<float*>(p);
  p += align256(nt * static_cast<size_t>(xf::tb_perm_cols(max_cols)) * sizeof(float));
  a.q = reinterpret_cast<int8_t*>(p);
  p += align256(n);
  a.d = reinterpret_cast<float*>(p);
  p += align256(nt * (mc / 32) * sizeof(float));
  a.bsum = reinterpret_cast<int32_t*>(p);
  p += align256(nt * (mc / 16) * sizeof(int32_t));
  if (mma_bytes > 0) {
    a.mma = p;
    a.mma_bytes = mma_bytes;
  }
  return a;
}

void quantize_act(uint32_t weight_type, const float* x, int n_tok, int cols, const ActBuf& a,
                  cudaStream_t stream) {
  if (n_tok <= 0 || cols <= 0) throw WorkerError(ErrorCode::Internal, "quantize_act: empty shape");
  const ActType t = act_type_for(weight_type, "quantize_act");
  if (cols % act_block(t) != 0) {
    throw WorkerError(ErrorCode::Internal,
                      "quantize_act: row length " + std::to_string(cols) +
                          " is not a multiple of " + std::to_string(act_block(t)) + " (" +
                          std::string(ggml_type_name(weight_type)) + " activation blocks)");
  }
  const size_t n = static_cast<size_t>(n_tok) * static_cast<size_t>(cols);
  const size_t nb = n / static_cast<size_t>(act_block(t));
  const dim3 per_elem(grid_for(n, kActThreads)), per_block(grid_for(nb, kActThreads / kWarp));
  with_act(t, [&](auto ak) {
    constexpr ActType AK = decltype(ak)::value;
    if constexpr (AK == ActType::Q8_0) {
      launch_pdl("exact_act_q8_0_kernel", act_q8_0_kernel, per_block, dim3(kActThreads), stream, x,
                 a.q, a.d, nb);
    } else if constexpr (AK == ActType::Q8_K) {
      launch_pdl("exact_act_q8_k_kernel", act_q8_k_kernel, per_block, dim3(kActThreads), stream, x,
                 a.q, a.d, a.bsum, nb);
    } else {
      launch_pdl("exact_act_float_kernel", act_float_kernel<AK>, per_elem, dim3(kActThreads),
                 stream, x, a.f, n);
    }
  });
}

void rmsnorm_act(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                 uint32_t act_type, ActBuf& a, cudaStream_t stream) {
  if (n_rows <= 0 || n <= 0) return;
  const ActType t = act_checked(act_type, n, "exact::rmsnorm_act");
  with_act(t, [&](auto k) {
    launch_rmsnorm_act<decltype(k)::value>(x, w, y, n_rows, n, eps, a, stream);
  });
  a.holds(t, y, permutes(t, a));
}

void swiglu_act(float* g, const float* u, int n_tok, int F, uint32_t act_type, ActBuf& a,
                cudaStream_t stream) {
  if (n_tok <= 0 || F <= 0) return;
  if (n_tok > 65535) {
    throw WorkerError(ErrorCode::Internal,
                      "exact::swiglu_act: " + std::to_string(n_tok) + " tokens (grid y limit)");
  }
  const ActType t = act_checked(act_type, F, "exact::swiglu_act");
  with_act(t, [&](auto k) { launch_swiglu_act<decltype(k)::value>(g, u, n_tok, F, a, stream); });
  a.holds(t, g, permutes(t, a));
}

}  // namespace worker::kern::exact
