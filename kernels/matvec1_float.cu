// One-token exact products for F32 / F16 / BF16 weights (matvec1.cuh: matvec1_float): the same
// bits as matmul()'s vec_dot order (cpu::dot_vecdot, cpu::dot_bf16_vecdot), laid out for
// memory bandwidth: a warp per row, so that a matrix of few rows (K/V: 128) still has
// thousands of threads, and each lane streams 4 (F16/BF16) or 8 (F32) bytes per 64-element
// step with 32 steps in flight (the loads are issued before the PDL wait: weights are never
// written by a kernel).
//
// F32 / F16: the reference has 64 FMA chains, chain c takes elements 64i + c. Lane t holds
// chains 2t and 2t + 1 (one 4-byte F16 word or 8-byte F32 pair per step), each updated with
// fmaf in index order: the CPU lane's value exactly. The reduce, (c, c^32) then (c, c^16)
// (GGML_F32x16_REDUCE), then hsum16 over c's low 4 bits from bit 3 down, is a butterfly over
// the chain index bits 5 .. 0 = lane bits 4 .. 0 (shuffles xor 16, 8, 4, 2, 1), then the two
// chains of lane 0 (bit 0). Float addition is commutative, so both partners of a pair hold
// the reference's sum. Leftovers (cols % 64) are added by lane 0 in the reference's
// sequential order (exact_float_math.cuh).
//
// BF16: per 64-element step two 16-lane dpbf16 accumulators, c1 over elements 0..31 and c2
// over 32..63, lane l taking the pair (2l, 2l+1) as (c + p[2l+1]) + p[2l]. Lane t owns
// elements 2t, 2t+1 of each step: c1 lane t for t < 16, c2 lane t - 16 otherwise. hsum16 of
// each half = shuffles xor 8, 4, 2, 1; then double(h1) + double(h2) and the leftovers in
// double, as ggml_vec_dot_bf16.
//
// Compiled with -fmad=false; every product / sum / fma goes through the xf:: helpers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "common/errors.h"
#include "exact_float_math.cuh"
#include "exact_float_rows.cuh"
#include "exact_ops_math.cuh"
#include "launch.cuh"
#include "matvec1.cuh"

namespace worker::kern::exact {
namespace {

using fr::prefetch;
using fr::Raw;
using fr::warp_dot;

constexpr int kRowsPerBlock = 4;  // one warp each

// Stages the block's activation row (cols floats, cols % 4 == 0) in shared memory: read from
// global memory step by step, every chain step would wait for an L2 round trip.
__device__ __forceinline__ const float2* stage_x(const float* __restrict__ x, int cols) {
  extern __shared__ float4 xs4[];
  const float4* xg = reinterpret_cast<const float4*>(x);
  for (int k = static_cast<int>(threadIdx.x); k < cols / 4; k += static_cast<int>(blockDim.x)) {
    xs4[k] = xg[k];
  }
  __syncthreads();
  return reinterpret_cast<const float2*>(xs4);
}

// Long rows (the FFN down projection: 896 rows of 4864): few warps, each with a long chain,
// cannot keep enough loads in flight (measured 47 us for 8.7 MB). Here a block copies R
// whole rows (one contiguous range) into shared memory with 16-byte cp.async copies, all
// issued before the PDL wait, then warp w runs row w's chains from shared memory: every
// byte of the matrix is requested at once.
template <GgmlType T>
__global__ void vecdot1_tile_kernel(const uint8_t* __restrict__ w, int rows, int cols,
                                    size_t row_bytes, int R, const float* __restrict__ x,
                                    float* __restrict__ y, int accumulate) {
  extern __shared__ float4 smem4[];
  const int lane = threadIdx.x & 31, wid = static_cast<int>(threadIdx.x >> 5);
  const int r0 = static_cast<int>(blockIdx.x) * R;
  const int nr = min(R, rows - r0);
  auto* tile = reinterpret_cast<uint8_t*>(smem4);
  {
    const uint8_t* src = w + static_cast<size_t>(r0) * row_bytes;
    const size_t n16 = static_cast<size_t>(nr) * row_bytes / 16;
    for (size_t k = threadIdx.x; k < n16; k += blockDim.x) cp_async16(tile + 16 * k, src + 16 * k);
    cp_async_commit();
  }
  griddep_wait();
  float4* xs4 = reinterpret_cast<float4*>(tile + static_cast<size_t>(R) * row_bytes);
  const float4* xg = reinterpret_cast<const float4*>(x);
  for (int k = static_cast<int>(threadIdx.x); k < cols / 4; k += static_cast<int>(blockDim.x)) {
    xs4[k] = xg[k];
  }
  cp_async_wait<0>();
  __syncthreads();
  if (wid >= nr) return;
  const uint8_t* row = tile + static_cast<size_t>(wid) * row_bytes;  // shared memory
  const float res = fr::smem_row_dot<T>(row, cols, reinterpret_cast<const float2*>(xs4), x, lane);
  const int r = r0 + wid;
  if (lane == 0) y[r] = accumulate ? xf::add_rn(y[r], res) : res;
}

// Up to three weights of one type and row length in one launch (Q, K, V): the rows of
// segment 0, then 1, then 2.
struct Segs {
  const uint8_t* w[3] = {nullptr, nullptr, nullptr};
  float* y[3] = {nullptr, nullptr, nullptr};
  int rows[3] = {0, 0, 0};
  int n = 0;
};

template <GgmlType T, int D>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    vecdot1_warp_kernel(Segs segs, int total_rows, int cols, size_t row_bytes,
                        const float* __restrict__ x, int accumulate) {
  const int lane = threadIdx.x & 31;
  int r = static_cast<int>(blockIdx.x) * kRowsPerBlock + static_cast<int>(threadIdx.x >> 5);
  // A warp past the last row computes the last row again and stores nothing: every warp
  // takes part in the block's barrier.
  const bool live = r < total_rows;
  if (!live) r = total_rows - 1;
  int sg = 0;
  while (sg + 1 < segs.n && r >= segs.rows[sg]) r -= segs.rows[sg++];
  const uint8_t* row = segs.w[sg] + static_cast<size_t>(r) * row_bytes;
  typename Raw<T>::type raw[D];
  prefetch<T, D>(row, cols / 64, lane, raw);
  griddep_wait();
  const float2* xp = stage_x(x, cols);
  const float res = warp_dot<T, D>(row, cols, raw, xp, x, lane);
  if (lane == 0 && live) {
    float* y = segs.y[sg];
    y[r] = accumulate ? xf::add_rn(y[r], res) : res;
  }
}

// g[r] = SwiGLU(gate row r . x, up row r . x) (cpu::swiglu_row's element r), and, when
// act_f is given, g[r] rounded to `act` (F32, F16 or BF16: a float down weight's) there.
template <GgmlType T, int D>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    vecdot1_swiglu_kernel(const uint8_t* __restrict__ wg, const uint8_t* __restrict__ wu, int rows,
                          int cols, size_t row_bytes, const float* __restrict__ x,
                          float* __restrict__ g, ActType act, float* __restrict__ act_f) {
  const int lane = threadIdx.x & 31;
  int r = static_cast<int>(blockIdx.x) * kRowsPerBlock + static_cast<int>(threadIdx.x >> 5);
  const bool live = r < rows;
  if (!live) r = rows - 1;
  const uint8_t* rg = wg + static_cast<size_t>(r) * row_bytes;
  const uint8_t* ru = wu + static_cast<size_t>(r) * row_bytes;
  typename Raw<T>::type raw_g[D], raw_u[D];
  prefetch<T, D>(rg, cols / 64, lane, raw_g);
  prefetch<T, D>(ru, cols / 64, lane, raw_u);
  griddep_wait();
  const float2* xp = stage_x(x, cols);
  const float dg = warp_dot<T, D>(rg, cols, raw_g, xp, x, lane);
  const float du = warp_dot<T, D>(ru, cols, raw_u, xp, x, lane);
  if (lane == 0 && live) {
    const float v = math::swiglu_one(dg, du, r, rows & ~15);
    g[r] = v;
    if (act_f != nullptr) {
      act_f[r] = math::act_round(act, v);
    }
  }
}

constexpr size_t kTileSmem = 48 * 1024;

// Rows per block of the tile kernel for this shape (0: the warp kernel instead).
int tile_rows(int64_t cols, size_t row_bytes) {
  if (cols < 2048 || row_bytes % 16 != 0) return 0;
  const size_t xb = static_cast<size_t>(cols) * sizeof(float);
  if (xb + row_bytes > kTileSmem) return 0;
  return static_cast<int>(std::min<size_t>(4, (kTileSmem - xb) / row_bytes));
}

template <GgmlType T>
void launch(const Segs& segs, int total_rows, int64_t cols, size_t row_bytes, const float* x,
            bool accumulate, cudaStream_t s) {
  const int R = segs.n == 1 ? tile_rows(cols, row_bytes) : 0;
  if (R > 0) {
    const dim3 grid(static_cast<unsigned>((total_rows + R - 1) / R));
    launch_pdl_smem("exact_vecdot1_tile_kernel", vecdot1_tile_kernel<T>, grid,
                    dim3(static_cast<unsigned>(R * kWarp)),
                    static_cast<size_t>(R) * row_bytes + static_cast<size_t>(cols) * sizeof(float),
                    s, segs.w[0], total_rows, static_cast<int>(cols), row_bytes, R, x, segs.y[0],
                    accumulate ? 1 : 0);
    return;
  }
  constexpr int kD = T == GgmlType::F32 ? 16 : 32;
  const dim3 grid(static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock));
  launch_pdl_smem("exact_vecdot1_warp_kernel", vecdot1_warp_kernel<T, kD>, grid,
                  dim3(kRowsPerBlock * kWarp), static_cast<size_t>(cols) * sizeof(float), s, segs,
                  total_rows, static_cast<int>(cols), row_bytes, x, accumulate ? 1 : 0);
}

template <GgmlType T>
void launch_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* g,
                   ActType act, float* act_f, cudaStream_t s) {
  constexpr int kD = T == GgmlType::F32 ? 8 : 16;
  const dim3 grid(static_cast<unsigned>((gate.rows + kRowsPerBlock - 1) / kRowsPerBlock));
  launch_pdl_smem("exact_vecdot1_swiglu_kernel", vecdot1_swiglu_kernel<T, kD>, grid,
                  dim3(kRowsPerBlock * kWarp), static_cast<size_t>(gate.cols) * sizeof(float), s,
                  static_cast<const uint8_t*>(gate.data), static_cast<const uint8_t*>(up.data),
                  static_cast<int>(gate.rows), static_cast<int>(gate.cols), gate.row_bytes, x, g,
                  act, act_f);
}

void check_takes(const WeightView& w, const char* what) {
  if (!matvec1_float_takes(w.type, w.cols)) {
    throw WorkerError(ErrorCode::Internal, std::string(what) + ": unsupported weight (type " +
                                               std::string(ggml_type_name(w.type)) + ", " +
                                               std::to_string(w.cols) + " columns)");
  }
}

// f(traits) for a float weight type (callers have checked matvec1_float_takes).
template <typename F>
void by_type(uint32_t type, F&& f) {
  dispatch(type, [&](auto tr) {
    if constexpr (decltype(tr)::kFamily == DotFamily::Float) f(tr);
  });
}

}  // namespace

bool matvec1_float_takes(uint32_t weight_type, int64_t cols) {
  const bool float_type = dot_family_of(weight_type) == DotFamily::Float;
  // pairs of weights as one aligned word per lane: an even row length keeps every row
  // start aligned;
  // x is staged in shared memory as float4: cols % 4, and at most 48 KB
  return float_type && cols % 4 == 0 && cols > 0 && cols <= 12288;
}

void matvec1_float(const WeightView& w, const ActBuf& a, float* y, bool accumulate,
                   cudaStream_t stream) {
  const WeightView* ws[1] = {&w};
  float* ys[1] = {y};
  matvec1_float_multi(ws, ys, 1, a, accumulate, stream);
}

void matvec1_float_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a,
                         bool accumulate, cudaStream_t stream) {
  if (n < 1 || n > 3) throw WorkerError(ErrorCode::Internal, "matvec1_float_multi: 1..3 weights");
  Segs segs;
  int total = 0;
  for (int i = 0; i < n; ++i) {
    check_takes(*ws[i], "matvec1_float");
    if (ws[i]->type != ws[0]->type || ws[i]->cols != ws[0]->cols) {
      throw WorkerError(ErrorCode::Internal,
                        "matvec1_float_multi: weights differ in type or length");
    }
    segs.w[i] = static_cast<const uint8_t*>(ws[i]->data);
    segs.y[i] = ys[i];
    segs.rows[i] = static_cast<int>(ws[i]->rows);
    total += segs.rows[i];
  }
  segs.n = n;
  if (total <= 0) return;
  by_type(ws[0]->type, [&](auto t) {
    launch<decltype(t)::kType>(segs, total, ws[0]->cols, ws[0]->row_bytes, a.f, accumulate, stream);
  });
}

bool matvec1_swiglu_takes(const WeightView& gate, const WeightView& up) {
  return matvec1_float_takes(gate.type, gate.cols) && gate.type == up.type &&
         gate.cols == up.cols && gate.rows == up.rows;
}

void matvec1_swiglu(const WeightView& gate, const WeightView& up, const ActBuf& a, float* g,
                    uint32_t down_type, ActBuf& down_act, cudaStream_t stream) {
  if (!matvec1_swiglu_takes(gate, up)) {
    throw WorkerError(ErrorCode::Internal, "matvec1_swiglu: unsupported gate/up weights");
  }
  // A float down weight takes g rounded here; a quantized one needs whole blocks of g.
  const ActType act = act_type_of(down_type);
  const bool float_down = dot_family_of(down_type) == DotFamily::Float;
  float* act_f = float_down ? down_act.f : nullptr;
  by_type(gate.type,
          [&](auto t) { launch_swiglu<decltype(t)::kType>(gate, up, a.f, g, act, act_f, stream); });
  if (act_f != nullptr) down_act.holds(act, g);
}

}  // namespace worker::kern::exact
