#include "linear.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_float_math.cuh"
#include "launch.cuh"

namespace worker::kern::exact {

namespace {

// a holds x rounded for weight type `type`: rounds it there unless it already does.
void round_for(uint32_t type, const float* x, int n, int cols, ActBuf& a, cudaStream_t stream) {
  if (a.holds_for(type, x)) return;
  quantize_act(type, x, n, cols, a, stream);
  a.holds(act_type_of(type), x);
}

// Rows r.. of a buffer holding rows `cols` wide rounded to t.
ActBuf rows_from(const ActBuf& a, ActType t, int cols, int r) {
  const size_t R = static_cast<size_t>(r), C = static_cast<size_t>(cols);
  // one scale in d per Q8_0 or Q8_K block (the float roundings leave d unused)
  const size_t blk = static_cast<size_t>(act_block(t == ActType::Q8_K ? t : ActType::Q8_0));
  ActBuf o = a;
  o.src = nullptr;  // not a whole input any more
  o.f = a.f + R * C;
  // tinyBLAS's permuted rows: the same rows of fp, still valid where fp held a's
  const size_t CP = static_cast<size_t>(xf::tb_perm_cols(cols));
  o.fp = a.fp != nullptr ? a.fp + R * CP : nullptr;
  o.fp_of = a.fp_holds_f() ? o.f : nullptr;
  o.q = a.q + R * C;
  o.d = a.d + R * (C / blk);
  o.bsum = a.bsum + R * (C / 16);
  return o;
}

}  // namespace

void linear(const WeightView& w, const float* x, int n, ActBuf& a, float* y, bool accumulate,
            cudaStream_t stream) {
  round_for(w.type, x, n, static_cast<int>(w.cols), a, stream);
  if (n == 1 && matvec1_float_takes(w.type, w.cols)) {
    matvec1_float(w, a, y, accumulate, stream);
  } else if (n == 1 && matvec1_quant_takes(w.type, w.rows, w.cols)) {
    matvec1_quant(w, a, y, accumulate, stream);
  } else if (qgemm_takes(w.type, n, w.rows)) {
    qgemm(w, a, n, BatchOrder{n, 0}, y, accumulate, stream);
  } else {
    matmul(w, a, n, BatchOrder{n, 0}, y, accumulate, stream);
  }
}

void qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float* x, int n,
         ActBuf& a, float* q, float* k, float* v, cudaStream_t stream) {
  const WeightView* ws[3] = {&wq, &wk, &wv};
  float* ys[3] = {q, k, v};
  if (n == 1 && wq.type == wk.type && wq.type == wv.type && matvec1_float_takes(wq.type, wq.cols)) {
    round_for(wq.type, x, n, static_cast<int>(wq.cols), a, stream);
    matvec1_float_multi(ws, ys, 3, a, false, stream);  // one launch
  } else if (n == 1 && matvec1_quant_multi_takes(ws, 3)) {
    // one launch; the types may differ where they share the activation rounding
    round_for(wq.type, x, n, static_cast<int>(wq.cols), a, stream);
    matvec1_quant_multi(ws, ys, 3, a, false, stream);
  } else {
    round_for(wq.type, x, n, static_cast<int>(wq.cols), a, stream);
    if (detail::matmul_float_multi(ws, ys, 3, a, n, BatchOrder{n, 0}, stream)) return;
    if (qgemm_multi(ws, ys, 3, a, n, BatchOrder{n, 0}, stream)) return;
    linear(wq, x, n, a, q, false, stream);
    linear(wk, x, n, a, k, false, stream);
    linear(wv, x, n, a, v, false, stream);
  }
}

void ffn(const WeightView& gate, const WeightView& up, const WeightView& down, const float* x,
         int n, ActBuf& a, float* g, float* u, float* spare, float* y, cudaStream_t stream) {
  const int F = static_cast<int>(gate.rows);
  if (n == 1 && matvec1_swiglu_takes(gate, up)) {
    // gate, up and SwiGLU in one launch; its rounding of g for a float down weight goes
    // to a second buffer (the launch still reads a)
    round_for(gate.type, x, n, static_cast<int>(gate.cols), a, stream);
    ActBuf down_act = a;
    down_act.f = spare;
    matvec1_swiglu(gate, up, a, g, down.type, down_act, stream);
    linear(down, g, n, down_act.holds_for(down.type, g) ? down_act : a, y, true, stream);
  } else if (n == 1 && matvec1_quant_swiglu_takes(gate, up)) {
    round_for(gate.type, x, n, static_cast<int>(gate.cols), a, stream);
    matvec1_quant_swiglu(gate, up, a, g, stream);  // one launch
    linear(down, g, n, a, y, true, stream);
  } else {
    round_for(gate.type, x, n, static_cast<int>(gate.cols), a, stream);
    const WeightView* ws[2] = {&gate, &up};
    float* ys[2] = {g, u};
    // prompt batches: gate and up in one tinyBLAS or qgemm launch (twice the CTAs of each)
    if (!detail::matmul_float_multi(ws, ys, 2, a, n, BatchOrder{n, 0}, stream) &&
        !qgemm_multi(ws, ys, 2, a, n, BatchOrder{n, 0}, stream)) {
      linear(gate, x, n, a, g, false, stream);
      linear(up, x, n, a, u, false, stream);
    }
    swiglu_act(g, u, n, F, down.type, a, stream);
    linear(down, g, n, a, y, true, stream);
  }
}

void linear_rows(const WeightView& w, const ActBuf& a, int r0, int rows, int batch_n, float* y,
                 cudaStream_t stream) {
  // The LM head keeps the kernels it was validated with: its many rows suit matmul's
  // warp-per-row layout, and at decode the quantized one-token kernel.
  if (batch_n == 1 && matvec1_quant_takes(w.type, w.rows, w.cols)) {
    matvec1_quant(w, a, y, false, stream);
  } else {
    matmul(w, rows_from(a, act_type_of(w.type), static_cast<int>(w.cols), r0), rows,
           BatchOrder{batch_n, r0}, y, false, stream);
  }
}

}  // namespace worker::kern::exact

namespace worker::kern {
namespace {

template <typename T>
__device__ __forceinline__ T to_lowp(float f);
template <>
__device__ __forceinline__ __half to_lowp<__half>(float f) {
  return __float2half_rn(f);
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_lowp<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}

template <typename T>
__global__ void to_lowp_kernel(const float* __restrict__ x, T* __restrict__ out, size_t n) {
  griddep_wait();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = to_lowp<T>(x[i]);
}

}  // namespace

bool gemm_supported(uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

void gemm_cublas(cublasHandle_t handle, const WeightView& w, const float* x, void* x_lowp, float* y,
                 int n_tok, bool accumulate, cudaStream_t stream) {
  const auto t = static_cast<GgmlType>(w.type);
  if (!gemm_supported(w.type)) {
    throw WorkerError(ErrorCode::Internal, "gemm_cublas: unsupported weight type " +
                                               std::string(ggml_type_name(w.type)));
  }
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  const size_t n = static_cast<size_t>(n_tok) * static_cast<size_t>(w.cols);
  const int m = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Row-major W [rows, cols] is column-major [cols, rows]; so y^T = op_T(W) * x^T with
  // x [n_tok, cols] row-major = column-major [cols, n_tok].
  auto gemm = [&](const void* b, cudaDataType_t ty, float bt) {
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n_tok, k, &one, w.data, ty, k, b,
                              ty, k, &bt, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  };
  if (t == GgmlType::F32) {
    gemm(x, CUDA_R_32F, beta);
    return;
  }
  // The activations are rounded to the weight type (what the CPU reference and
  // llama.cpp do); products of 16-bit values are exact in the FP32 accumulation.
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  if (t == GgmlType::F16) {
    auto* xh = static_cast<__half*>(x_lowp);
    launch_pdl("to_lowp_kernel", to_lowp_kernel<__half>, dim3(blocks), dim3(256), stream, x, xh, n);
    CUDA_CHECK_LAUNCH("to_lowp_kernel<half>");
    gemm(xh, CUDA_R_16F, beta);
  } else {
    auto* xb = static_cast<__nv_bfloat16*>(x_lowp);
    launch_pdl("to_lowp_kernel", to_lowp_kernel<__nv_bfloat16>, dim3(blocks), dim3(256), stream, x,
               xb, n);
    CUDA_CHECK_LAUNCH("to_lowp_kernel<bf16>");
    gemm(xb, CUDA_R_16BF, beta);
  }
}

}  // namespace worker::kern

namespace worker::kern::fast {

void linear(const Ctx& c, const WeightView& w, const float* x, int n, float* y, bool accumulate,
            cudaStream_t stream) {
  if (n >= c.gemm_min_tokens && gemm_supported(w.type)) {
    gemm_cublas(c.cublas, w, x, c.lowp, y, n, accumulate, stream);
    return;
  }
  // Otherwise the exact products (qgemm for quantized weights from its token count on): x
  // rounded into the buffer afresh, whatever it held before.
  exact::ActBuf a = c.act;
  a.src = nullptr;
  exact::linear(w, x, n, a, y, accumulate, stream);
}

void qkv(const Ctx& c, const WeightView& wq, const WeightView& wk, const WeightView& wv,
         const float* x, int n, float* q, float* k, float* v, cudaStream_t stream) {
  linear(c, wq, x, n, q, false, stream);
  linear(c, wk, x, n, k, false, stream);
  linear(c, wv, x, n, v, false, stream);
}

void ffn(const Ctx& c, const WeightView& gate, const WeightView& up, const WeightView& down,
         const float* x, int n, float* g, float* u, float* y, cudaStream_t stream) {
  linear(c, gate, x, n, g, false, stream);
  linear(c, up, x, n, u, false, stream);
  exact::swiglu(g, u, n, static_cast<int>(gate.rows), stream);  // the exact kernel
  linear(c, down, g, n, y, true, stream);
}

}  // namespace worker::kern::fast
