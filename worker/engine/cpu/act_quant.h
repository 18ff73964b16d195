#pragma once
// Matrix-vector products the way llama.cpp's CPU backend computes them: the activation
// vector is first converted to the weight type's "vec_dot_type" (F32 for F32 weights, F16
// for F16, BF16 for BF16, Q8_0 for Q4_0/Q5_0/Q8_0, Q8_K for Q4_K/Q6_K), then dotted with
// the stored blocks (integer block dots, scaled), the float steps in the order of the ggml
// kernel llama.cpp runs for that weight and batch: vec_dot lanes, llamafile tinyBLAS, or the
// x86 "repack" gemv/gemm. Matching the rounding and the order makes the logits
// bit-identical to llama.cpp's (reports/cpu-parity.md).
#include <cstdint>
#include <vector>

#include "gguf/type_traits.h"  // repacked(): whether llama.cpp repacks a weight on x86

namespace worker::cpu {

// One activation row converted for one weight type.
struct QuantizedActivation {
  GgmlType weight_type = GgmlType::F32;
  int64_t n = 0;
  std::vector<float> f;       // F32/F16/BF16 weights: the (rounded) values
  std::vector<int8_t> q;      // Q8_0 / Q8_K quants
  std::vector<float> d;       // per block scale (Q8_0: fp16-rounded; Q8_K: float)
  std::vector<int32_t> bsum;  // Q8_K: sums of 16 quants
  // The weight matrix is one llama.cpp keeps in its CPU "repack" buffer on x86 (Q4_0 and
  // Q4_K with a multiple of 8 rows): its dot products are summed in another order.
  bool repacked = false;
  // With a repacked weight, llama.cpp runs groups of 4 tokens through the gemm kernel and the
  // rest (n % 4, and single tokens) through gemv; for Q4_K they accumulate differently.
  bool repack_gemm = false;
};

void quantize_activation(GgmlType weight_type, const float* x, int64_t n, QuantizedActivation& out);

// dot(weight row of `type` (raw blocks), activation) in the order of the kernel llama.cpp
// uses: vec_dot lanes, or for a repacked weight gemv (a.repacked) / gemm (a.repack_gemm).
// F32/F16/BF16 rows take the one-token vec_dot order; `scratch` holds n floats for them.
float dot_quantized(GgmlType type, const void* row, const QuantizedActivation& a, float* scratch);

// ---------------------------------------------------------------------------------------
// Float summation orders of llama.cpp's CPU backend, reproduced in portable C++.
//
// Which order applies depends on the ggml-cpu variant that llama.cpp loads. These mirror the
// AVX-512 builds (node-llama-cpp 3.21.1's libggml-cpu-zen4.so / -skylakex / -icelake /
// -cooperlake: GGML_F32_EPR 16, no __AVX512FP16__), compiled by GCC (its
// _mm512_reduce_add_ps tree). On a CPU where llama.cpp picks an AVX2 variant the lane count
// is 8 and the results differ in the last bits (reports/cpu-parity.md).
// Every function gives the same floats whatever the host CPU: FMA instructions are used
// when present, std::fma (same rounding) otherwise.

// _mm512_reduce_add_ps of 16 lanes (GCC): halves added pairwise, 16 -> 8 -> 4 -> 2 -> 1.
float hsum16(const float* v);

// ggml_vec_dot_f32 / ggml_vec_dot_f16 (after the exact F16 -> F32 conversion): 4 x 16 lane
// accumulators (GGML_F32_STEP 64) updated with FMA, reduced 4 -> 2 -> 1 vectors, then
// hsum16; leftovers (n % 64) as GCC compiled ggml's tail loop (16- and 8-wide rounded
// products added in order, the last < 8 as FMAs; f16: each product added in double). Used by
// mul_mat for one token (decode), for k % 16 != 0, and for the attention KQ and KQV products.
float dot_vecdot(const float* x, const float* y, int64_t n, bool f16 = false);

// llamafile tinyBLAS<16, __m512> gemm_bloc: one 16-lane FMA accumulator per output over the
// k/16 chunks, then hsum16. Used by mul_mat when it has >= 2 tokens (prompt) and F32/F16
// weights: k % 16 == 0 and m % 4 == 0 (tinyblas_takes).
float dot_tinyblas(const float* a, const float* b, int64_t k);
bool tinyblas_takes(GgmlType weight_type, int64_t m, int64_t n_tokens, int64_t k);

// BF16 weights and BF16-rounded activations (both given as exact floats), summed as the
// AVX512_BF16 builds do with _mm512_dpbf16_ps (per lane: += odd product, += even product):
// ggml_vec_dot_bf16 (two 16-lane accumulators over 64-element steps, each reduced with
// hsum16 and added in double) and tinyBLAS<32, __m512, __m512bh> (one accumulator, k % 32).
float dot_bf16_vecdot(const float* x, const float* y, int64_t n);
float dot_bf16_tinyblas(const float* a, const float* b, int64_t k);

// Tests: run the portable kernels even where the FMA/AVX2 ones would be used (both must give
// the same floats).
void force_portable_kernels(bool on);

// ggml_v_expf (AVX-512 version: polynomial, _mm512_scalef_ps) for one lane.
float ggml_expf(float x);
// ggml_v_silu: x / (1 + ggml_v_expf(-x)).
float ggml_silu(float x);

}  // namespace worker::cpu
