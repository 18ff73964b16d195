#pragma once
// The matrix products of a layer, one entry point per op: linear (one weight), qkv (Q, K
// and V of one input), ffn (gate / up, SwiGLU, down) and linear_rows (the LM head). Each
// picks its kernel from the weight types and the token count, as llama.cpp's
// ggml_cuda_mul_mat does; every choice gives the CPU reference's bits (exact.cuh):
//
//   one token, F32/F16/BF16 weight     matvec1_float        (matvec1_float.cu)
//   one token, quantized weight        matvec1_quant        (matvec1_quant.cu)
//   one token, Q+K+V or gate+up        the *_multi / *_swiglu launches of those files
//   >= 32 tokens, quantized weight     qgemm                (matmul_qgemm.cu)
//   otherwise                          matmul               (matmul_float.cu, matmul_quant.cu)
//
// The fast numerics (--numerics fast, namespace fast below) differ in prompt batches only:
// cuBLAS for float weights from gemm_min_tokens tokens, the exact products otherwise; their
// decode step and LM head are the exact ones.
//
// Inputs come with an ActBuf: the input rounded to the weight type's vec_dot_type. When
// the buffer already holds x rounded that way (a fused norm, SwiGLU or attention wrote it)
// it is used as is; otherwise x is rounded into it first.
#include <cuda_runtime.h>

#include "act_round.cuh"
#include "matmul.cuh"
#include "matvec1.cuh"

namespace worker::kern::exact {

// y = W x for the n rows of x (w.cols wide), as one batch of the CPU reference's matmul;
// y += W x (one rounding, the CPU's x += tmp) when accumulate.
void linear(const WeightView& w, const float* x, int n, ActBuf& a, float* y, bool accumulate,
            cudaStream_t stream);

// q = Wq x, k = Wk x, v = Wv x for the n rows of x.
void qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float* x, int n,
         ActBuf& a, float* q, float* k, float* v, cudaStream_t stream);

// The feed-forward block after its norm: g = silu(Wgate x) * (Wup x) ([n][gate.rows]),
// then y += Wdown g (the residual add). u: [n][gate.rows] scratch for Wup x; spare:
// gate.rows floats for a second rounding of g at one token.
void ffn(const WeightView& gate, const WeightView& up, const WeightView& down, const float* x,
         int n, ActBuf& a, float* g, float* u, float* spare, float* y, cudaStream_t stream);

// y = W a for rows r0 .. r0 + rows - 1 of a batch of batch_n rows that `a` holds rounded
// for W (the LM head, computed a few rows at a time): the batch's order, not the piece's.
void linear_rows(const WeightView& w, const ActBuf& a, int r0, int rows, int batch_n, float* y,
                 cudaStream_t stream);

}  // namespace worker::kern::exact

namespace worker::kern::fast {

// What the fast products share: cuBLAS for float weights from gemm_min_tokens tokens on
// (lowp: 16-bit staging of the input), the exact products otherwise (act: their rounding
// buffer).
struct Ctx {
  cublasHandle_t cublas = nullptr;
  void* lowp = nullptr;
  exact::ActBuf act;
  int gemm_min_tokens = 16;
};

// y = W x (y += W x when accumulate) for the n rows of x.
void linear(const Ctx& c, const WeightView& w, const float* x, int n, float* y, bool accumulate,
            cudaStream_t stream);
// q = Wq x, k = Wk x, v = Wv x.
void qkv(const Ctx& c, const WeightView& wq, const WeightView& wk, const WeightView& wv,
         const float* x, int n, float* q, float* k, float* v, cudaStream_t stream);
// g = silu(Wgate x) * (Wup x), then y += Wdown g. u: [n][gate.rows] scratch.
void ffn(const Ctx& c, const WeightView& gate, const WeightView& up, const WeightView& down,
         const float* x, int n, float* g, float* u, float* y, cudaStream_t stream);

}  // namespace worker::kern::fast
