#pragma once
// "Exact" kernels: every op computes bit for bit the floats of the CPU reference
// (worker/engine/cpu, itself bit-identical with llama.cpp's AVX-512 CPU backend): the same
// roundings (activations to the weight type's vec_dot_type, Q8_0 / Q8_K quantization), the
// same float operations in the same order (the lane structure of ggml's vec_dot, llamafile's
// tinyBLAS, the x86 repack gemv/gemm, ggml's polynomial exp, double sums where ggml sums in
// double). Float sums are independent chains, so the GPU runs the chains in parallel and
// combines them in the reference's fixed tree; integer block dots are exact in any order.
//
// These files are compiled with -fmad=false: a multiply followed by an add is never fused
// behind our back; every fused multiply-add is an explicit fmaf() where the reference has
// one.
//
// All pointers are device memory. n_past is read from device memory so that the decode step
// can be captured in a CUDA graph and replayed.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "matvec.cuh"  // WeightView

namespace worker::kern::exact {

// ---------------------------------------------------------------------------------------
// Matrix products (exact_float.cu: F32/F16/BF16 weights; exact_quant.cu: quantized).

// A matmul input: n_tok activation rows of `cols` values rounded / quantized for one weight
// type exactly as cpu::quantize_activation does. Caller-owned device buffers sized for the
// largest n_tok * cols (act_buffer_bytes lays them out in one allocation).
struct ActBuf {
  float* f = nullptr;   // [n_tok][cols] F32 / F16- / BF16-rounded values (float weights)
  int8_t* q = nullptr;  // [n_tok][cols] Q8_0 or Q8_K quants (quantized weights)
  float* d = nullptr;   // [n_tok][cols / 32] Q8_0 scales (fp16-rounded) or [n_tok][cols/256] Q8_K
  int32_t* bsum = nullptr;  // [n_tok][cols / 16] Q8_K sums of 16 quants
};
// Bytes of one region holding an ActBuf for up to max_tok rows of up to max_cols values.
size_t act_buffer_bytes(int max_tok, int max_cols);
// Carves an ActBuf out of `base` (act_buffer_bytes(max_tok, max_cols) bytes, 256-aligned).
ActBuf act_buffer_at(void* base, int max_tok, int max_cols);

// a = x [n_tok][cols] rounded for `weight_type` (cpu::quantize_activation, row by row).
void quantize_act(uint32_t weight_type, const float* x, int n_tok, int cols, const ActBuf& a,
                  cudaStream_t stream);

// Which order the CPU reference's matmul (CpuEngine::matmul) uses depends on the whole batch
// it multiplies, not only on the rows a call computes: `batch_n` is that batch's token count
// and `t0` the index in it of this call's first token. Float weights: tinyBLAS order when
// cpu::tinyblas_takes(type, rows, batch_n, cols), else vec_dot. Q4_0 / Q4_K with rows % 8 == 0
// (cpu::repacked_on_x86): the repack orders, and for Q4_K the gemm order for the tokens with
// index < batch_n - batch_n % 4, gemv for the rest.
struct BatchOrder {
  int batch_n = 1;
  int t0 = 0;
};

// y[t][r] = dot(W row r, a row t) (y[t][r] + that when accumulate: the residual add, one
// rounding, as the CPU's x += tmp) for t < n_tok, r < w.rows.
void matmul(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order, float* y,
            bool accumulate, cudaStream_t stream);

namespace detail {
// matmul for F32 / F16 / BF16 weights (exact_float.cu); matmul() dispatches to it.
void matmul_float(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order,
                  float* y, bool accumulate, cudaStream_t stream);
}  // namespace detail

// ---------------------------------------------------------------------------------------
// The other ops (exact_ops.cu), each as CpuEngine computes it (the attention:
// attention_exact.cuh).

// ggml_rms_norm then the weight multiply: sum of float squares in double, mean = float(sum /
// n), scale = 1 / sqrtf(mean + eps), y = (x * scale) * w. w: n floats (F32, converted at load).
void rmsnorm(const float* x, const float* w, float* y, int n_rows, int n, float eps,
             cudaStream_t stream);

// g[t][i] = silu(g[t][i]) * u[t][i] for i < F: ggml_silu (ggml_expf) for the first F & ~15,
// x / (1 + expf(-x)) for the rest, where the CPU calls libm's expf: here glibc's expf
// algorithm (double arithmetic, a 32-entry 2^(i/32) table, rounded once), equal to this
// machine's glibc on every float tried but 2 in 3.3e8 (kernels/exact_ops_math.cuh).
void swiglu(float* g, const float* u, int n_tok, int F, cudaStream_t stream);

// Prompt batches of quantized weights (exact_qgemm.cu): the same bits as matmul(), tiled
// for throughput (many tokens share each weight block; integer block dots with dp4a).
// qgemm_takes() says when it applies (quantized type, n_tok large enough to pay off); the
// engine then calls qgemm instead of matmul.
bool qgemm_takes(uint32_t weight_type, int n_tok);
void qgemm(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order, float* y,
           bool accumulate, cudaStream_t stream);

// One-token (decode) products tuned for memory bandwidth (exact_decode.cu: float weights,
// a warp per row; exact_qdecode.cu: quantized weights): the same bits as matmul() with
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
                    uint32_t down_type, const ActBuf& down_act, cudaStream_t stream);
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

// ---------------------------------------------------------------------------------------
// Fusions that cut launches in the decode step (exact_fused.cu); any n_tok works. Each
// writes exactly what the unfused sequence writes.

// rmsnorm(x, w, y, ...) then quantize_act(act_type, y, n_rows, n, a): y and a both written.
void rmsnorm_act(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                 uint32_t act_type, const ActBuf& a, cudaStream_t stream);
// swiglu(g, u, n_tok, F) then quantize_act(act_type, g, n_tok, F, a): g and a both written.
void swiglu_act(float* g, const float* u, int n_tok, int F, uint32_t act_type, const ActBuf& a,
                cudaStream_t stream);

}  // namespace worker::kern::exact
