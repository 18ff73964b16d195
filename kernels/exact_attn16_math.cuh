#pragma once
// Per-thread math of the exact FP16-KV attention kernels (exact_attn16.cu), __host__ __device__
// so the host emulation test (kernels/tests/exact_attn16_test.cpp) runs the very same code in
// the kernels' thread decomposition against the CPU reference's F16-KV mode
// (cpu::attention_head_f16). Compiled with -fmad=false in exact_attn16.cu: every FMA is an
// explicit fmaf(), every product that the CPU rounds is rounded (math::mul_rn).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "exact_ops_math.cuh"  // hsum16, vecdot_reduce64, mul_rn
#include "gguf/ggml_types.h"   // fp16 conversions on the host

namespace worker::kern::exact::attn16 {

// fp16 bits -> float (exact).
__host__ __device__ inline float h2f(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_fp32(h);
#endif
}
// float -> fp16 bits, round to nearest even (ggml_cpu_fp32_to_fp16: _mm512_cvtps_ph with
// _MM_FROUND_TO_NEAREST_INT; worker's fp32_to_fp16 on the host).
__host__ __device__ inline uint16_t f2h(float x) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(x));
#else
  return fp32_to_fp16(x);
#endif
}
__host__ __device__ inline float round_f16(float x) {
  return h2f(f2h(x));
}

// n (8 or 16) consecutive fp16 values at p as floats (exact conversions). On the device, when p
// is 16-byte aligned, as 16-byte loads (the K rows are read by one thread each); the values are
// the same either way.
template <int N>
__host__ __device__ inline void load_f16(const uint16_t* p, bool aligned, float* f) {
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

__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// KQ score of one key row (head_dim fp16 values) with the fp16-rounded query q, in the order
// llama.cpp's mul_mat(K F16, q) takes for the batch:
// tinyBLAS F16 x F16 (batch >= 2 tokens, head_dim % 16 == 0): lane l = FMA chain over the
// elements i = l (mod 16), then _mm512_reduce_add_ps (hsum16) = cpu::dot_tinyblas.
__host__ __device__ inline float kq_tiny16(const uint16_t* k, const float* q, int hd) {
  float acc[16];
  EXOPS_UNROLL
  for (int l = 0; l < 16; ++l) acc[l] = 0.0f;
  const bool al = aligned16(k);  // hd % 16 == 0 here: every step stays aligned
  for (int i = 0; i < hd; i += 16) {
    float kf[16];
    load_f16<16>(k + i, al, kf);
    EXOPS_UNROLL
    for (int l = 0; l < 16; ++l) acc[l] = fmaf(kf[l], q[i + l], acc[l]);
  }
  return math::hsum16(acc);
}
// ggml_vec_dot_f16 (one token, or head_dim % 16 != 0): 64 FMA chains over head_dim & ~63,
// GGML_F32x16_REDUCE + hsum16, then each leftover product rounded to float and added in double
// = cpu::dot_vecdot(.., f16 = true).
__host__ __device__ inline float kq_vecdot16(const uint16_t* k, const float* q, int hd) {
  float acc[64];
  EXOPS_UNROLL
  for (int l = 0; l < 64; ++l) acc[l] = 0.0f;
  const int np = hd & ~63;
  const bool al = aligned16(k);
  for (int i = 0; i < np; i += 64) {
    float kf[64];
    load_f16<64>(k + i, al, kf);
    EXOPS_UNROLL
    for (int l = 0; l < 64; ++l) acc[l] = fmaf(kf[l], q[i + l], acc[l]);
  }
  double s = static_cast<double>(math::vecdot_reduce64(acc));
  for (int i = np; i < hd; ++i) s += static_cast<double>(math::mul_rn(h2f(k[i]), q[i]));
  return static_cast<float>(s);
}

// The KQV weight of key j: the probability e * inv (the softmax's one rounding), then rounded to
// fp16 as mul_mat converts its F32 operand to the F16 cache's vec_dot_type.
__host__ __device__ inline float prob16(float e, float inv) {
  return round_f16(e * inv);
}

// Test hook (exact_attn16.cu): y[i] = f2h(x[i]) on the device for i < n (x, y device memory).
void device_f16_bits_for_tests(const float* x, uint16_t* y, size_t n);

// Test hook (exact_attn16.cu): attention_f16's one-token kernel with `cluster` blocks per head
// (1, 2, 4 or 8; attention_f16 picks it from n_head), so the tests cover every cluster size.
// Shapes as attention_f16 (n_rot unused), head_dim <= 256.
void attention_f16_decode_for_tests(const float* q, const uint16_t* k_cache,
                                    const uint16_t* v_cache, float* out, int n_head, int n_head_kv,
                                    int head_dim, int n_ctx, const int32_t* d_n_past,
                                    float* scratch, int cluster);

}  // namespace worker::kern::exact::attn16
