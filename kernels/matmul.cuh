#pragma once
// Exact matrix products of any batch: bit for bit the CPU reference's matmul
// (CpuEngine::matmul) in the order it takes for that batch. matmul_float.cu (F32 / F16 /
// BF16 weights), matmul_quant.cu (quantized weights, and matmul()), matmul_qgemm.cu (tiled
// quantized products for prompt batches). linear.cuh picks among these and matvec1.cuh.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "act_round.cuh"
#include "weights.cuh"  // WeightView

namespace worker::kern::exact {

// Which order the CPU reference's matmul (CpuEngine::matmul) uses depends on the whole batch
// it multiplies, not only on the rows a call computes: `batch_n` is that batch's token count
// and `t0` the index in it of this call's first token. Float weights: tinyBLAS order when
// cpu::tinyblas_takes(type, rows, batch_n, cols), else vec_dot. Q4_0 / Q4_K with rows % 8 == 0
// (repacked(), gguf/type_traits.h): the repack orders, and for Q4_K the gemm order for the tokens
// with index < batch_n - batch_n % 4, gemv for the rest.
struct BatchOrder {
  int batch_n = 1;
  int t0 = 0;
};

// y[t][r] = dot(W row r, a row t) (y[t][r] + that when accumulate: the residual add, one
// rounding, as the CPU's x += tmp) for t < n_tok, r < w.rows.
void matmul(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order, float* y,
            bool accumulate, cudaStream_t stream);

namespace detail {
// matmul for F32 / F16 / BF16 weights (matmul_float.cu); matmul() dispatches to it.
void matmul_float(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order,
                  float* y, bool accumulate, cudaStream_t stream);
// ys[i] = ws[i] x a for n (<= 3) float weights of one type and width in tinyBLAS order, one
// launch (Q, K, V of a prompt; gate and up); false (nothing launched) where that does not apply
// (other types or orders, a slice of a batch): the caller then runs matmul() per weight.
bool matmul_float_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a,
                        int n_tok, const BatchOrder& order, cudaStream_t stream);
}  // namespace detail

// Prompt batches of quantized weights (matmul_qgemm.cu): the same bits as matmul(), tiled
// for throughput (many tokens share each weight block; integer block dots with dp4a, or for
// big Q8_0 / Q5_0 / Q4_0-lane batches the lane integers from the tensor cores).
// qgemm_takes() says when it applies (quantized type, n_tok large enough to pay off for a
// launch of `rows` weight rows); linear() then calls qgemm instead of matmul.
bool qgemm_takes(uint32_t weight_type, int n_tok, int64_t rows);
// The tensor-core tile of Q8_0 / Q5_0 / Q4_0 weights (qgemm's default from this many tokens)
// reads its operands converted to f16 by a pass before it, into ActBuf::mma. Its bytes for
// batches of up to max_tok tokens of up to max_cols values whose launches hold up to
// max_weight_elems weight elements (the sum of qgemm_weight_elems over a launch's weights:
// Q / K / V, gate and up together). Without that scratch the dp4a tile runs instead.
constexpr int kQgemmMmaMinTokens = 512;
int64_t qgemm_weight_elems(int64_t rows, int64_t cols);
size_t qgemm_scratch_bytes(int max_tok, int max_cols, int64_t max_weight_elems);
void qgemm(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order, float* y,
           bool accumulate, cudaStream_t stream);
// ys[i] = ws[i] x a for n (<= 3) quantized weights of one type, width and order in one qgemm
// launch (Q / K / V, gate and up of a prompt: the small ones no longer run a grid of their
// own); false (nothing launched) where they differ or qgemm_takes() is false: the caller then
// runs one product per weight.
bool qgemm_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a, int n_tok,
                 const BatchOrder& order, cudaStream_t stream);

}  // namespace worker::kern::exact
