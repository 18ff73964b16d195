#include "linear.cuh"

#include "swiglu.cuh"

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

namespace worker::kern::fast {

void linear(const Ctx& c, const WeightView& w, const float* x, int n, float* y, bool accumulate,
            cudaStream_t stream) {
  if (n >= c.gemm_min_tokens && gemm_supported(w.type)) {
    gemm_cublas(c.cublas, w, x, c.lowp, y, n, accumulate, stream);
  } else if (exact::qgemm_takes(w.type, n, w.rows)) {
    // quantized weights, many tokens: weights read in their blocks, no FP32 copy of any
    // matrix (M0-W-1201)
    exact::quantize_act(w.type, x, n, static_cast<int>(w.cols), c.act, stream);
    exact::qgemm(w, c.act, n, exact::BatchOrder{n, 0}, y, accumulate, stream);
  } else {
    matvec(w, x, y, n, accumulate, stream);
  }
}

void qkv(const Ctx& c, const WeightView& wq, const WeightView& wk, const WeightView& wv,
         const float* x, int n, float* q, float* k, float* v, cudaStream_t stream) {
  if (n == 1) {
    matvec_qkv(wq, wk, wv, x, q, k, v, stream);
  } else {
    linear(c, wq, x, n, q, false, stream);
    linear(c, wk, x, n, k, false, stream);
    linear(c, wv, x, n, v, false, stream);
  }
}

void ffn(const Ctx& c, const WeightView& gate, const WeightView& up, const WeightView& down,
         const float* x, int n, float* g, float* u, float* y, cudaStream_t stream) {
  if (n == 1) {
    matvec_swiglu(gate, up, x, g, u, stream);
  } else {
    linear(c, gate, x, n, g, false, stream);
    linear(c, up, x, n, u, false, stream);
    swiglu(g, u, static_cast<size_t>(n) * static_cast<size_t>(gate.rows), stream);
  }
  linear(c, down, g, n, y, true, stream);
}

}  // namespace worker::kern::fast
