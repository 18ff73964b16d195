#pragma once
// Per-thread math of the exact non-matmul kernels (exact_ops.cu), __host__ __device__ so the
// host tests (kernels/tests/exact_ops_test.cpp) run the very same code, in the kernels'
// thread decomposition, against the CPU reference (worker/engine/cpu/cpu_ops.h, act_quant.h).
//
// Every function is written operation for operation as the CPU reference computes it: each
// float op is one IEEE op (this header is compiled with -fmad=false in exact_ops.cu; host
// compilers do not contract without an FMA target), every FMA an explicit fmaf().
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gguf/ggml_types.h"   // fp16 / bf16 rounding on the host
#include "gguf/type_traits.h"  // ActType

// #pragma unroll for nvcc only (host compilers warn about the unknown pragma).
#if defined(__CUDACC__)
#define EXOPS_UNROLL _Pragma("unroll")
#else
#define EXOPS_UNROLL
#endif

namespace worker::kern::exact::math {

// a * b rounded to float, never contracted into a following add (on the device __fmul_rn is
// never fused; on the host the empty asm keeps the product in a register as a float).
__host__ __device__ inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float p = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#endif
  return p;
#endif
}

// _mm512_reduce_add_ps of 16 lanes as GCC builds it (cpu::hsum16): 16 -> 8 -> 4 -> 2 -> 1.
__host__ __device__ inline float hsum16(const float* v) {
  float t8[8], t4[4];
  EXOPS_UNROLL
  for (int i = 0; i < 8; ++i) t8[i] = v[i + 8] + v[i];
  EXOPS_UNROLL
  for (int i = 0; i < 4; ++i) t4[i] = t8[i + 4] + t8[i];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// ggml_vec_dot_f32's reduction of its 64 lane accumulators (GGML_F32x16_REDUCE then
// _mm512_reduce_add_ps), as cpu::dot_vecdot.
__host__ __device__ inline float vecdot_reduce64(const float* acc) {
  float r[16];
  EXOPS_UNROLL
  for (int l = 0; l < 16; ++l) r[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
  return hsum16(r);
}

// cpu::dot_vecdot's leftover loop (n % 64 elements from i = np) added to `sum`: 16- and
// 8-wide rounded products added one by one, the last < 8 as FMAs.
__host__ __device__ inline float vecdot_tail(const float* x, const float* y, int np, int n,
                                             float sum) {
  int i = np;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) {
      sum = sum + mul_rn(x[i + l], y[i + l]);
    }
  }
  if (n - i >= 8) {
    for (int l = 0; l < 8; ++l) {
      sum = sum + mul_rn(x[i + l], y[i + l]);
    }
    i += 8;
  }
  for (; i < n; ++i) sum = fmaf(x[i], y[i], sum);
  return sum;
}

// x * 2^n with one rounding (std::ldexp, _mm512_scalef_ps) for |n| <= 192 and a float j near
// 1: j * 2^n is exact in double (the exponent stays within double's range), so one rounding
// to float gives the correctly rounded result, subnormals included.
__host__ __device__ inline float ldexp_once(float j, int n) {
  const int64_t bits = static_cast<int64_t>(n + 1023) << 52;
  double p;
#if defined(__CUDA_ARCH__)
  p = __longlong_as_double(bits);
#else
  memcpy(&p, &bits, sizeof p);
#endif
  return static_cast<float>(static_cast<double>(j) * p);
}

// ggml_v_expf (AVX-512), one lane: cpu::ggml_expf.
__host__ __device__ inline float expf_ggml(float x) {
  const float r = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = fmaf(
      fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
      fmaf(0x1.ffffecp-1f, b, 1.0f));
  if (isnan(n)) return n;
  if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  return ldexp_once(j, static_cast<int>(n));
}

// ggml_v_silu: x / (1 + ggml_v_expf(-x)) (cpu::ggml_silu).
__host__ __device__ inline float silu_ggml(float x) {
  return x / (1.0f + expf_ggml(0.0f - x));
}

// expf for SwiGLU's scalar tail, where the CPU calls libm's expf: glibc's algorithm (2.27+,
// the generic e_expf.c every x86-64 glibc uses: x * 32/ln2 = k + r, 2^(k/32) from a table of
// the 32 doubles 2^(i/32) with the exponent bits folded, a degree-3 polynomial in r, all in
// double, rounded once to float). Exhaustively checked on the host against this machine's
// glibc 2.36 expf (SwigluTailExpMatchesLibm): equal on every float with |x| in [2^-12, 110]
// but 2 of 3.3e8 (there glibc's float is 0.5013 ulp off, ours the correctly rounded one);
// the FMA and non-FMA builds of that code agree on every input tried. (Plain exp in double
// rounded once, the correctly rounded expf, differs from glibc for 6e-4 of the inputs.)
#define EXOPS_EXP2_TAB                                                                             \
  {                                                                                                \
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,    \
        0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull,                       \
        0x3fef1e9df51fdee1ull, 0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull,                       \
        0x3feedea64c123422ull, 0x3feece086061892dull, 0x3feebfdad5362a27ull,                       \
        0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,                       \
        0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull,                       \
        0x3feea589994cce13ull, 0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull,                       \
        0x3feec49182a3f090ull, 0x3feed503b23e255dull, 0x3feee89f995ad3adull,                       \
        0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,                       \
        0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull \
  }
// [i] = bits of 2^(i/32) (correctly rounded double) - (i << 47).
#if defined(__CUDACC__)
static __constant__ uint64_t kExp2TabDev[32] = EXOPS_EXP2_TAB;
#endif
static constexpr uint64_t kExp2Tab[32] = EXOPS_EXP2_TAB;

__host__ __device__ inline uint64_t dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}
__host__ __device__ inline double dfrom(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}
// Double ops that are never contracted (device: explicit round-to-nearest intrinsics).
__host__ __device__ inline double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  double p = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(p));
#endif
  return p;
#endif
}
__host__ __device__ inline double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

__host__ __device__ inline float expf_libm(float x) {
  uint32_t ux;
  memcpy(&ux, &x, sizeof ux);
  const uint32_t abstop = (ux >> 20) & 0x7ffu;
  if (abstop >= 0x42bu) {                // |x| >= 88 or NaN
    if (ux == 0xff800000u) return 0.0f;  // -inf
    if (abstop >= 0x7f8u) return x + x;  // inf, NaN
    if (x > 0x1.62e42ep6f) return INFINITY;
    if (x < -0x1.9fe368p6f) return 0.0f;
  }
  const double inv_ln2_n = 0x1.71547652b82fep+0 * 32;
  const double shift = 0x1.8p+52;
  const double c0 = 0x1.c6af84b912394p-5 / (32.0 * 32.0 * 32.0);
  const double c1 = 0x1.ebfce50fac4f3p-3 / (32.0 * 32.0);
  const double c2 = 0x1.62e42ff0c52d6p-1 / 32.0;
  const double z = dmul(inv_ln2_n, static_cast<double>(x));
  double kd = dadd(z, shift);  // rounds z to an integer, ties to even
  const uint64_t ki = dbits(kd);
  kd = dadd(kd, -shift);
  const double r = dadd(z, -kd);
#if defined(__CUDA_ARCH__)
  uint64_t t = kExp2TabDev[ki & 31];
#else
  uint64_t t = kExp2Tab[ki & 31];
#endif
  t += ki << 47;
  const double s = dfrom(t);
  const double p = fma(c0, r, c1);
  const double r2 = dmul(r, r);
  double y = fma(c2, r, 1.0);
  y = fma(p, r2, y);
  y = dmul(y, s);
  return static_cast<float>(y);
}

// exp in double rounded once (the correctly rounded expf but where the double is within
// its error of a tie): kept for the measurement in SwigluTailExpMatchesLibm.
__host__ __device__ inline float expf_double_rounded(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

// ggml_silu_f32 * u for SwiGLU's last F % 16 columns.
__host__ __device__ inline float swiglu_tail(float g, float u) {
  return (g / (1.0f + expf_libm(-g))) * u;
}

#if defined(__CUDACC__)
// Block-wide double sum (fixed tree: warp butterflies, then the warps' sums); every thread
// gets the same bits (a butterfly's lanes add the same two values). `sh` holds >= 32.
__device__ __forceinline__ double block_sum_double(double v, double* sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int nw = (blockDim.x + 31) / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = lane < nw ? sh[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}
#endif

// A double sum of n non-negative terms computed in a tree (the GPU) differs from the same
// terms summed sequentially (the CPU) by at most (n-1) * 2^-53 of the sum each, to first
// order. `f` maps the sum to the float the op needs (monotone: the rounding of a double
// quotient to float); if f gives the same float at both ends of the interval that holds both
// sums, the tree's result is the CPU's exactly; otherwise (near a float rounding boundary,
// probability ~n * 2^-29 per call) the caller recomputes the sum sequentially. Returns
// whether the tree's value is certain; *out = f(tree sum).
__host__ __device__ inline double tree_sum_slack(double s, int n) {
  return s * (4.0 * static_cast<double>(n) + 4.0) * 0x1p-53;
}

// rms_norm's mean = float(sum / n).
__host__ __device__ inline float rms_mean(double sum, int n) {
  return static_cast<float>(sum / static_cast<double>(n));
}
__host__ __device__ inline bool rms_mean_certain(double s_tree, int n, float* mean) {
  const double e = tree_sum_slack(s_tree, n);
  *mean = rms_mean(s_tree, n);
  return rms_mean(s_tree - e, n) == *mean && rms_mean(s_tree + e, n) == *mean;
}
__host__ __device__ inline float rms_scale(float mean, float eps) {
  return 1.0f / sqrtf(mean + eps);
}

// ---- fused kernels' helpers (exact_fused.cu) ------------------------------------------

// One SwiGLU element of column i of a row of F (cpu::swiglu_row): ggml_silu below
// f16 = F & ~15, the libm-expf tail from there.
__host__ __device__ inline float swiglu_one(float g, float u, int i, int f16) {
  return i < f16 ? silu_ggml(g) * u : swiglu_tail(g, u);
}

// Activation rounding per element, as cpu::quantize_activation computes it: used by
// quantize_act (exact_quant_math.cuh) and the fused kernels alike.
__host__ __device__ inline float act_round_fp16(float x) {
#if defined(__CUDA_ARCH__)
  return __half2float(__float2half_rn(x));
#else
  return fp16_to_fp32(fp32_to_fp16(x));
#endif
}
__host__ __device__ inline float act_round_bf16(float x) {
#if defined(__CUDA_ARCH__)
  return __bfloat162float(__float2bfloat16_rn(x));
#else
  return bf16_to_fp32(fp32_to_bf16(x));
#endif
}
// The element-wise rounding for a float weight's activations (its vec_dot_type): F16 / BF16
// round to that type and back; F32 leaves v as it is (so do Q8_0 / Q8_K, whose block
// quantization is act_round.cu's, not an element-wise step).
__host__ __device__ inline float act_round(ActType t, float v) {
  return t == ActType::F16 ? act_round_fp16(v) : t == ActType::BF16 ? act_round_bf16(v) : v;
}
// nearbyint / ggml's nearest_int (round half to even; |v| < 2^22).
__host__ __device__ inline int act_round_even(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  return static_cast<int>(nearbyintf(v));
#endif
}
// Q8_0: id = 127 / amax (0 for an all-zero block), q = rint(x * id), d = fp16(amax / 127).
__host__ __device__ inline float act_q8_0_id(float amax) {
  return amax != 0.0f ? 127.f / amax : 0.0f;
}
__host__ __device__ inline int8_t act_q8_0_quant(float x, float id) {
  return static_cast<int8_t>(act_round_even(x * id));
}
__host__ __device__ inline float act_q8_0_d(float amax) {
  return act_round_fp16(amax / 127.f);
}
// Q8_K: iscale = -127 / max, q = min(127, rint(iscale * x)), d = 1 / iscale.
__host__ __device__ inline int8_t act_q8_k_quant(float x, float iscale) {
  const int q = act_round_even(iscale * x);
  return static_cast<int8_t>(q < 127 ? q : 127);
}
// Q8_K's max: the element of largest |x|, the first in index order on ties (the CPU's
// strict > scan). Merging the winners (a, m) of two index ranges, `other` holding (oa, om):
// the other wins when strictly larger, or equal and its range comes first. Any merge tree
// of aligned ranges with this rule gives the CPU's element.
__host__ __device__ inline void q8k_max_merge(float& a, float& m, float oa, float om,
                                              bool other_first) {
  if (oa > a || (oa == a && other_first)) {
    a = oa;
    m = om;
  }
}

// Test hook (defined in exact_ops.cu): y[i] = f(x[i]) on the device for i < n, with f
// expf_ggml (which 0), silu_ggml (1), expf_libm (2) or qm::half_bits of the low 16 bits of x[i]'s
// bits (3); x, y device memory. Lets the GPU
// tests check these device functions on millions of inputs against the CPU's.
void device_map_for_tests(int which, const float* x, float* y, size_t n);

}  // namespace worker::kern::exact::math
