#pragma once
// y[t, r] = sum_j W[r, j] * x[t, j] (+ y[t, r] when accumulate), for every weight type the
// worker supports, with the weights in their stored format (M0-W-1201, D2).
//  - matvec(): one warp per output row, weights dequantized in registers, fixed-order
//    reduction (D15). Used for decode (n_tok = 1) and for small batches and quantized
//    weights in prefill (up to 8 tokens share one read of each weight row).
//  - gemm_cublas(): prefill with F16/BF16/F32 weights through cuBLAS, FP32 accumulation,
//    pedantic math mode.
// Every path first rounds the activations to the weight type's vec_dot_type exactly as
// llama.cpp's CPU backend and the CPU reference do (F16/BF16, or Q8_0 / Q8_K blocks).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace worker::kern {

struct WeightView {
  const void* data = nullptr;  // device memory, rows of row_bytes
  uint32_t type = 0;           // GgmlType value
  int64_t rows = 0;
  int64_t cols = 0;  // elements per row (ne[0])
  size_t row_bytes = 0;
};

// Throws WorkerError for an unsupported type or a bad shape (cols must be a multiple of
// the type's block size; of 8 for F16/BF16 and 4 for F32).
void matvec(const WeightView& w, const float* x, float* y, int n_tok, bool accumulate,
            cudaStream_t stream);

// True when gemm_cublas handles this weight type.
bool gemm_supported(uint32_t type);
// x: [n_tok, cols] FP32; x_lowp: scratch of n_tok*cols 16-bit elements (unused for F32).
void gemm_cublas(cublasHandle_t handle, const WeightView& w, const float* x, void* x_lowp, float* y,
                 int n_tok, bool accumulate, cudaStream_t stream);

// Decode (one token) fusions that cut launches, the pace-setter of small-model decode:
// Q, K and V in one grid when the three share type and row length (else three matvecs),
// and y = silu(gate x) * (up x) in one grid (else two matvecs + swiglu via u_scratch).
void matvec_qkv(const WeightView& q, const WeightView& k, const WeightView& v, const float* x,
                float* yq, float* yk, float* yv, cudaStream_t stream);
void matvec_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* y,
                   float* u_scratch, cudaStream_t stream);

}  // namespace worker::kern
