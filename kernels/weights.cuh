#pragma once
// A weight matrix in VRAM as the kernels see it, and the fast numerics' cuBLAS product.
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

// True when gemm_cublas handles this weight type (F32, F16, BF16).
bool gemm_supported(uint32_t type);
// y = W x (y += W x when accumulate) for prompt batches of the fast numerics (linear.cuh's
// fast::linear): cuBLAS, FP32 accumulation, pedantic math mode; the activations rounded to
// the weight type first (as the CPU reference and llama.cpp do). x: [n_tok, cols] FP32;
// x_lowp: scratch of n_tok * cols 16-bit elements (unused for F32).
void gemm_cublas(cublasHandle_t handle, const WeightView& w, const float* x, void* x_lowp, float* y,
                 int n_tok, bool accumulate, cudaStream_t stream);

}  // namespace worker::kern
