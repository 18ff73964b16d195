#pragma once
// Per-thread math of the exact attention (attention_exact.cu), __host__ __device__ so the host
// emulation tests (kernels/tests/attention_exact_test.cpp) run the very same code, in the
// kernels' thread decomposition, against cpu::attention_head / attention_head_f16.
//
// The two cache types differ only in a few per-element steps, gathered in a traits struct
// (KvF32, KvF16) that every kernel is templated over:
//   what                   FP32 cache (cpu::attention_head)    FP16 cache (attention_head_f16)
//   cache element          float                               fp16 bits, round to nearest even
//   query before KQ        as is                               rounded to fp16
//   KQ, one token          ggml_vec_dot_f32 (kq_vec)           ggml_vec_dot_f16 (kq_vec)
//   KQ, batch of >= 2      vec_dot, as for one token           tinyBLAS F16 when head_dim % 16 == 0
//   KQV weight             e * inv                             fp16(e * inv)
// Everything else (softmax, the KQV lane chains and their trees) is the same code for both.
// Compiled with -fmad=false: every FMA is an explicit fmaf(), every product the CPU rounds is
// rounded (math::mul_rn).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "exact_ops_math.cuh"  // hsum16, vecdot_reduce64, vecdot_tail, mul_rn, act_round_fp16
#include "gguf/ggml_types.h"   // fp16 conversions on the host

namespace worker::kern::exact::math {

// float -> fp16 bits, round to nearest even (ggml_cpu_fp32_to_fp16: _mm512_cvtps_ph with
// _MM_FROUND_TO_NEAREST_INT; worker's fp32_to_fp16 on the host).
__host__ __device__ inline uint16_t f2h(float x) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(x));
#else
  return fp32_to_fp16(x);
#endif
}
// fp16 bits -> float (exact).
__host__ __device__ inline float h2f(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_fp32(h);
#endif
}

__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// N (a multiple of 8) consecutive cache values at p as floats (exact). On the device, when p is
// 16-byte aligned, as 16-byte loads (a K row is read by one thread); the values are the same.
template <int N>
__host__ __device__ inline void load_row(const float* p, bool aligned, float* f) {
#if defined(__CUDA_ARCH__)
  if (aligned) {
    EXOPS_UNROLL
    for (int c = 0; c < N / 4; ++c) {
      const float4 u = __ldg(reinterpret_cast<const float4*>(p) + c);
      f[4 * c] = u.x;
      f[4 * c + 1] = u.y;
      f[4 * c + 2] = u.z;
      f[4 * c + 3] = u.w;
    }
    return;
  }
#else
  (void)aligned;
#endif
  EXOPS_UNROLL
  for (int i = 0; i < N; ++i) f[i] = p[i];
}
template <int N>
__host__ __device__ inline void load_row(const uint16_t* p, bool aligned, float* f) {
#if defined(__CUDA_ARCH__)
  if (aligned) {
    EXOPS_UNROLL
    for (int c = 0; c < N / 8; ++c) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + c);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
      EXOPS_UNROLL
      for (int i = 0; i < 4; ++i) {
        f[8 * c + 2 * i] = h2f(static_cast<uint16_t>(w[i] & 0xFFFFu));  // little endian
        f[8 * c + 2 * i + 1] = h2f(static_cast<uint16_t>(w[i] >> 16));
      }
    }
    return;
  }
#else
  (void)aligned;
#endif
  EXOPS_UNROLL
  for (int i = 0; i < N; ++i) f[i] = h2f(p[i]);
}

// The 64 FMA chains of ggml_vec_dot over n & ~63 of a cache row E* (global memory, or float
// in shared memory with global = false), reduced as GGML_F32x16_REDUCE + hsum16.
template <class E>
__host__ __device__ inline float vecdot64_head(const E* k, const float* q, int n, bool global) {
  float acc[64];
  EXOPS_UNROLL
  for (int l = 0; l < 64; ++l) acc[l] = 0.0f;
  const int np = n & ~63;
  const bool al = global && aligned16(k);
  for (int i = 0; i < np; i += 64) {
    float kf[64];
    load_row<64>(k + i, al, kf);
    EXOPS_UNROLL
    for (int l = 0; l < 64; ++l) acc[l] = fmaf(kf[l], q[i + l], acc[l]);
  }
  return vecdot_reduce64(acc);
}

// One 16-element step of tinyBLAS's 16 lanes: acc[l] = fma(k[l], q[l], acc[l]).
__host__ __device__ inline void tiny16_step(float (&acc)[16], const float* kf, const float* q) {
  EXOPS_UNROLL
  for (int l = 0; l < 16; ++l) acc[l] = fmaf(kf[l], q[l], acc[l]);
}

// FP32 cache: cpu::attention_head's orders.
struct KvF32 {
  using T = float;
  static constexpr const char* kName = "f32";
  __host__ __device__ static T store(float x) { return x; }
  __host__ __device__ static float load(T x) { return x; }
  __host__ __device__ static float query(float x) { return x; }
  // KQ is always vec_dot (cpu::attention_head): no kq_tiny16.
  static constexpr bool kTinyKq = false;
  static bool kq_tiny(int, int) { return false; }
  // cpu::dot_vecdot: the 64 chains, then its 16/8-wide rounded leftovers and the FMA tail.
  // `global`: k is a global cache row (16-byte loads where aligned), else a shared copy.
  __host__ __device__ static float kq_vec(const float* k, const float* q, int hd, bool global) {
    return vecdot_tail(k, q, hd & ~63, hd, vecdot64_head(k, q, hd, global));
  }
  __host__ __device__ static float prob(float e, float inv) { return mul_rn(e, inv); }
};

// FP16 cache: cpu::attention_head_f16's orders (llama.cpp with type_k = type_v = F16).
struct KvF16 {
  using T = uint16_t;
  static constexpr const char* kName = "f16";
  __host__ __device__ static T store(float x) { return f2h(x); }
  __host__ __device__ static float load(T x) { return h2f(x); }
  // mul_mat converts its F32 operand to the F16 cache's vec_dot_type.
  __host__ __device__ static float query(float x) { return act_round_fp16(x); }
  // cpu::kq16_tiny: tinyBLAS F16 x F16 for a batch with head_dim % 16 == 0.
  static constexpr bool kTinyKq = true;
  static bool kq_tiny(int hd, int n_tok) { return n_tok >= 2 && hd % 16 == 0; }
  // ggml_vec_dot_f16 (cpu::dot_vecdot(.., f16 = true)): the 64 chains, then each leftover
  // product rounded to float and added in double. k: fp16 bits in global memory, or (global
  // false) the exact float values of a row in shared memory.
  template <class E>
  __host__ __device__ static float kq_vec(const E* k, const float* q, int hd, bool global) {
    double s = static_cast<double>(vecdot64_head(k, q, hd, global));
    for (int i = hd & ~63; i < hd; ++i) {
      s += static_cast<double>(mul_rn(value(k[i]), q[i]));
    }
    return static_cast<float>(s);
  }
  // tinyBLAS F16 x F16 (cpu::dot_tinyblas): lane l = FMA chain over the elements i = l
  // (mod 16), then _mm512_reduce_add_ps (hsum16). hd % 16 == 0.
  __host__ __device__ static float kq_tiny16(const T* k, const float* q, int hd) {
    float acc[16];
    EXOPS_UNROLL
    for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
    const bool al = aligned16(k);  // hd % 16 == 0: every step stays aligned
    for (int i = 0; i < hd; i += 16) {
      float kf[16];
      load_row<16>(k + i, al, kf);
      tiny16_step(acc, kf, q + i);
    }
    return hsum16(acc);
  }
  // The same dot with the key row already converted (kf: hd floats, e.g. in registers).
  __host__ __device__ static float kq_tiny16(const float* kf, const float* q, int hd) {
    float acc[16];
    EXOPS_UNROLL
    for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
    for (int i = 0; i < hd; i += 16) tiny16_step(acc, kf + i, q + i);
    return hsum16(acc);
  }
  // The probability e * inv (the softmax's one rounding), rounded to fp16 as mul_mat converts
  // its F32 operand.
  __host__ __device__ static float prob(float e, float inv) { return act_round_fp16(e * inv); }

 private:
  __host__ __device__ static float value(uint16_t x) { return h2f(x); }
  __host__ __device__ static float value(float x) { return x; }
};

// KQV in tinyBLAS order (16 chains over n_att rounded up to 16) for a batch of >= 2 tokens
// when head_dim % 4 == 0 (cpu::tinyblas_takes(F32, ..) / cpu::kqv16_tiny: the same rule);
// else vec_dot (64 chains over n_past + n_tok rounded up to 64).
inline bool kqv_tiny(int hd, int n_tok) {
  return n_tok >= 2 && hd % 4 == 0;
}

// One RoPE pair (rotate_pairs as GCC compiled it): d0 = fma(x0, c, -(x1*s)),
// d1 = fma(x0, s, x1*c).
__host__ __device__ inline void rope_pair(float x0, float x1, float c, float s, float& d0,
                                          float& d1) {
  const float x1s = x1 * s;
  const float x1c = x1 * c;
  d0 = fmaf(x0, c, -x1s);
  d1 = fmaf(x0, s, x1c);
}

// softmax's inv = float(1 / sum) over `nb` block sums; certain when both ends of the tree's
// error interval round alike (tree_sum_slack), else the caller sums sequentially.
__host__ __device__ inline float softmax_inv(double sum) {
  return static_cast<float>(1.0 / sum);
}
__host__ __device__ inline bool softmax_inv_certain(double s_tree, int nb, float* inv) {
  const double e = tree_sum_slack(s_tree, nb);
  *inv = softmax_inv(s_tree);
  return softmax_inv(s_tree - e) == *inv && softmax_inv(s_tree + e) == *inv;
}

}  // namespace worker::kern::exact::math
