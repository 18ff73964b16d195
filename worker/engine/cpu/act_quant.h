#pragma once
// Matrix-vector products the way llama.cpp's CPU backend computes them: the activation
// vector is first converted to the weight type's "vec_dot_type" (F32 for F32 weights, F16
// for F16, BF16 for BF16, Q8_0 for Q4_0/Q5_0/Q8_0, Q8_K for Q4_K/Q6_K), then dotted with
// the stored blocks in integer arithmetic and scaled. Matching this rounding is what makes
// the CPU reference agree with llama.cpp on quantized models to ~1e-5 instead of ~1e-1,
// and so keeps greedy continuations identical.
#include <cstdint>
#include <vector>

#include "gguf/ggml_types.h"

namespace worker::cpu {

// One activation row converted for one weight type.
struct QuantizedActivation {
  GgmlType weight_type = GgmlType::F32;
  int64_t n = 0;
  std::vector<float> f;       // F32/F16/BF16 weights: the (rounded) values
  std::vector<int8_t> q;      // Q8_0 / Q8_K quants
  std::vector<float> d;       // per block scale (Q8_0: fp16-rounded; Q8_K: float)
  std::vector<int32_t> bsum;  // Q8_K: sums of 16 quants
};

void quantize_activation(GgmlType weight_type, const float* x, int64_t n, QuantizedActivation& out);

// dot(weight row of `type` (raw blocks), activation); `scratch` holds n floats (F16/BF16).
float dot_quantized(GgmlType type, const void* row, const QuantizedActivation& a, float* scratch);

}  // namespace worker::cpu
