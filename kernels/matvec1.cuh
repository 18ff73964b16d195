#pragma once
// Exact one-token products tuned for memory bandwidth, the same bits as matmul()
// with n_tok = 1: matvec1_float.cu (F32 / F16 / BF16 weights, a warp per row) and
// matvec1_quant.cu (quantized weights). linear.cuh picks them at decode.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "act_round.cuh"
#include "weights.cuh"  // WeightView

namespace worker::kern::exact {

// One-token (decode) products tuned for memory bandwidth (matvec1_float.cu: float weights,
// a warp per row; matvec1_quant.cu: quantized weights): the same bits as matmul() with
// n_tok = 1 (the vec_dot / gemv orders). *_takes() says whether a weight qualifies.
bool matvec1_float_takes(uint32_t weight_type, int64_t cols);
void matvec1_float(const WeightView& w, const ActBuf& a, float* y, bool accumulate,
                   cudaStream_t stream);
// Q, K and V (1..3 weights of one type and row length) in one launch.
void matvec1_float_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a,
                         bool accumulate, cudaStream_t stream);
// g = SwiGLU(gate x, up x) in one launch (swiglu()'s values), and, when down_type is F32 /
// F16 / BF16, g rounded for it into down_act.f (what quantize_act writes; for a quantized
// down weight the caller quantizes g).
bool matvec1_swiglu_takes(const WeightView& gate, const WeightView& up);
void matvec1_swiglu(const WeightView& gate, const WeightView& up, const ActBuf& a, float* g,
                    uint32_t down_type, ActBuf& down_act, cudaStream_t stream);
bool matvec1_quant_takes(uint32_t weight_type, int64_t rows, int64_t cols);
void matvec1_quant(const WeightView& w, const ActBuf& a, float* y, bool accumulate,
                   cudaStream_t stream);
// Q, K and V (1..3 quantized weights of one row length whose activation is one
// quantization: all of Q8_0 / Q5_0 / Q4_0, or all of Q4_K / Q6_K; types may differ) in one
// launch; ys[i] gets exactly what matvec1_quant(*ws[i], ...) writes.
bool matvec1_quant_multi_takes(const WeightView* const* ws, int n);
void matvec1_quant_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a,
                         bool accumulate, cudaStream_t stream);
// g = SwiGLU(gate a, up a) in one launch (gate and up: one quantized type and shape): exactly
// matvec1_quant(gate), matvec1_quant(up), then swiglu(g, u, 1, gate.rows).
bool matvec1_quant_swiglu_takes(const WeightView& gate, const WeightView& up);
void matvec1_quant_swiglu(const WeightView& gate, const WeightView& up, const ActBuf& a, float* g,
                          cudaStream_t stream);

}  // namespace worker::kern::exact
