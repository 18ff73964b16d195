// Exact one-token products of quantized weights (see exact.cuh: matvec1_quant): for n_tok 1,
// y[r] = dot (or y[r] + dot when accumulate, one rounding, as the CPU's x += tmp) bit for bit
// cpu::dot_quantized(type, row, act) with act.repacked = cpu::repacked_on_x86(type, rows) and
// act.repack_gemm = false (one token: the gemv orders).
//
// Orders reproduced (worker/engine/cpu/act_quant.cpp):
//  - Q8_0, Q5_0, Q4_0 with rows % 8 != 0: dot_q0_lanes: 8 chains, acc[i] = fma(d_w * d_a,
//    float(int dot of elements 4i..4i+3 of the block), acc[i]) over the blocks in order;
//    hsum_float_8.
//  - Q4_0 with rows % 8 == 0: dot_q4_0_repack: one chain, acc = fma(float(block int dot),
//    d_w * d_a, acc).
//  - Q6_K: dot_q6_k: 8 chains over the super-blocks, lane int t with the bsum correction;
//    hsum_float_8.
//  - Q4_K with rows % 8 != 0: dot_q4_k: 8 lane chains (d_a * d) and 4 min chains
//    (-d_a * dmin); hsum8(acc) + ((m0 + m2) + (m1 + m3)).
//  - Q4_K with rows % 8 == 0: dot_q4_k_repack gemv: acc = fma(float(isum), d * d_a, acc),
//    accm = fma(float(imin), dmin * d_a, accm) once per super-block; acc - accm.
// Why it is exact: every chain's float steps are the reference's fma with the reference's
// operands, in block order, run by one lane; what feeds a step is an integer (exact in any
// order: computed in parallel with dp4a, one lane per 32-element unit, summed in any order)
// and a scale formed as one float product as the reference forms it; the chains combine in
// the reference's tree (exact_qdecode_math.cuh has the per-thread code, shared with the
// host emulation test).
//
// Decomposition for bandwidth: a block of 4 warps takes a tile of R consecutive rows, which
// are one contiguous byte range. All its threads copy that range (16-byte aligned down) into
// shared memory with cp.async 16-byte copies, every copy in flight at once and issued BEFORE
// griddep_wait() (weights are never written by a kernel); the activation and y are read
// after it. Then warp w takes groups of G rows (w, w + 4, ..., G = 32 / chain lanes, at most
// 4): per pass of 32 units (32 blocks, or 4 super-blocks) each lane computes its unit of
// each of the G rows (integer slots and scales, from shared memory) into the warp's slot
// arrays, then lane (j, c) steps chain c of group row j over the pass. R is chosen so that
// the grid has >= 2 blocks per SM where the matrix allows, with tiles of up to 16 KB
// (~38 KB of shared memory a block: 5-6 blocks per SM keep ~80 KB of loads in flight).
// Rows longer than one pass (> 32 units, e.g. FFN down 896 x 4864) take qdecode_long_kernel
// instead: R <= 4 rows a block, all 128 threads compute the slots of all the tile's units at
// once, then warp r runs row r's chains over the whole row (same steps, same order).
// Compiled with -fmad=false; deterministic: no atomics, fixed orders.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_qdecode_math.cuh"
#include "launch.cuh"

namespace worker::kern::exact {

namespace {

constexpr int kQdWarps = 4;
constexpr int kQdThreads = kQdWarps * kWarp;
constexpr size_t kTileTarget = 16 * 1024;   // bytes of weights per block (soft target)
constexpr size_t kMaxRowBytes = 24 * 1024;  // one row + the slot arrays fit 48 KB of smem
constexpr int kMinBlocks = 2 * 132;         // two waves' worth on an H100

constexpr size_t kSlotBytes =
    static_cast<size_t>(kQdWarps) * (qd::kWarpSlotInts + qd::kWarpScaleFloats) * 4;

size_t tile_alloc(size_t tile_bytes) {
  // + 16 for the alignment offset, + 16 for the overread of rd32 past the last byte
  return (tile_bytes + 32 + 15) & ~size_t{15};
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

template <GgmlType T, bool REP>
__global__ void __launch_bounds__(kQdThreads)
    qdecode_kernel(const uint8_t* __restrict__ w, int rows, int units, size_t rb, int R,
                   size_t tile_alloc_bytes, const int8_t* __restrict__ aq,
                   const float* __restrict__ ad, const int32_t* __restrict__ abs,
                   float* __restrict__ y, int accumulate) {
  extern __shared__ int4 s_raw[];
  const int r0 = static_cast<int>(blockIdx.x) * R;
  const int nr = min(R, rows - r0);
  const uint8_t* start = w + static_cast<size_t>(r0) * rb;
  const uintptr_t base = reinterpret_cast<uintptr_t>(start) & ~uintptr_t{15};
  const int off = static_cast<int>(reinterpret_cast<uintptr_t>(start) - base);
  const int n16 =
      static_cast<int>((static_cast<size_t>(off) + static_cast<size_t>(nr) * rb + 15) / 16);
  const int4* src = reinterpret_cast<const int4*>(base);
  for (int i = static_cast<int>(threadIdx.x); i < n16; i += kQdThreads)
    cp_async16(s_raw + i, src + i);
  griddep_wait();
  cp_async_wait_all();
  __syncthreads();

  const uint8_t* tile = reinterpret_cast<const uint8_t*>(s_raw) + off;
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  int* S = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(s_raw) + tile_alloc_bytes) +
           warp * qd::kWarpSlotInts;
  float* F = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(s_raw) + tile_alloc_bytes) +
             kQdWarps * qd::kWarpSlotInts + warp * qd::kWarpScaleFloats;
  constexpr int kC = qd::chains<T, REP>();
  constexpr int kCL = qd::chain_lanes<T, REP>();
  constexpr int G = qd::group_rows<T, REP>();
  // Chain phase role of this lane: row j of the group, chain c.
  const int j = lane / kCL, c = lane % kCL;

  // Warp w's groups: rows g0 + kQdWarps * i (i < G), g0 = w, w + kQdWarps * G, ...
  for (int g0 = warp; g0 < nr; g0 += kQdWarps * G) {  // warp-uniform
    const int my_row = g0 + kQdWarps * j;
    const bool chain_lane = j < G && c < kC && my_row < nr;
    float acc = 0.0f;
    for (int p0 = 0; p0 < units; p0 += qd::kUnitsPerPass) {
      const int u = p0 + lane;
      if (u < units) {
        uint32_t yw[8];
        qd::act_words(aq, u, yw);
        const float yd = qd::act_scale<T>(ad, u);
#pragma unroll
        for (int i = 0; i < G; ++i) {
          const int ri = g0 + kQdWarps * i;
          if (ri < nr)
            qd::unit_slots<T, REP>(tile + static_cast<size_t>(ri) * rb, u, yw, yd, abs,
                                   S + (i * qd::kUnitsPerPass + lane) * qd::kSlotStride,
                                   F + (i * qd::kUnitsPerPass + lane) * qd::kScaleStride);
        }
      }
      __syncwarp();
      if (chain_lane)
        acc = qd::chain_pass<T, REP>(c, S + j * qd::kUnitsPerPass * qd::kSlotStride,
                                     F + j * qd::kUnitsPerPass * qd::kScaleStride,
                                     min(qd::kUnitsPerPass, units - p0), acc);
      __syncwarp();
    }
    // Row j's chains sit in lanes j * kCL + 0 .. kC - 1 (in range for every lane).
    float v[kC];
#pragma unroll
    for (int k = 0; k < kC; ++k) v[k] = __shfl_sync(0xffffffffu, acc, (lane / kCL) * kCL + k);
    if (c == 0 && j < G && my_row < nr) {
      const float d = qd::combine<T, REP>(v);
      float* out = y + r0 + my_row;
      *out = accumulate ? *out + d : d;
    }
  }
}

// Rows longer than one pass (decode of e.g. FFN down: 152 units a row) with few rows: the
// passes of one warp would run one after another, so here the block's 128 threads compute
// the slots of ALL the tile's units at once (thread t: items t, t + 128, ... of
// [row][unit]) into shared arrays [R][units][slots], then warp w runs row w's chains over
// the whole row (the same chain_pass steps, 32 units at a time). R <= 4 rows a block.
template <GgmlType T, bool REP>
__global__ void __launch_bounds__(kQdThreads)
    qdecode_long_kernel(const uint8_t* __restrict__ w, int rows, int units, size_t rb, int R,
                        size_t tile_alloc_bytes, const int8_t* __restrict__ aq,
                        const float* __restrict__ ad, const int32_t* __restrict__ abs,
                        float* __restrict__ y, int accumulate) {
  extern __shared__ int4 s_raw[];
  const int r0 = static_cast<int>(blockIdx.x) * R;
  const int nr = min(R, rows - r0);
  const uint8_t* start = w + static_cast<size_t>(r0) * rb;
  const uintptr_t base = reinterpret_cast<uintptr_t>(start) & ~uintptr_t{15};
  const int off = static_cast<int>(reinterpret_cast<uintptr_t>(start) - base);
  const int n16 =
      static_cast<int>((static_cast<size_t>(off) + static_cast<size_t>(nr) * rb + 15) / 16);
  const int4* src = reinterpret_cast<const int4*>(base);
  for (int i = static_cast<int>(threadIdx.x); i < n16; i += kQdThreads)
    cp_async16(s_raw + i, src + i);
  griddep_wait();
  cp_async_wait_all();
  __syncthreads();

  const uint8_t* tile = reinterpret_cast<const uint8_t*>(s_raw) + off;
  int* S = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(s_raw) + tile_alloc_bytes);
  float* F = reinterpret_cast<float*>(S + static_cast<size_t>(R) * units * qd::kSlotStride);
  const int items = nr * units;
  for (int it = static_cast<int>(threadIdx.x); it < items; it += kQdThreads) {
    const int rr = it / units, u = it - rr * units;
    uint32_t yw[8];
    qd::act_words(aq, u, yw);
    qd::unit_slots<T, REP>(tile + static_cast<size_t>(rr) * rb, u, yw, qd::act_scale<T>(ad, u), abs,
                           S + it * qd::kSlotStride, F + it * qd::kScaleStride);
  }
  __syncthreads();

  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  constexpr int kC = qd::chains<T, REP>();
  if (warp < nr) {  // warp-uniform
    float acc = 0.0f;
    if (lane < kC) {
      for (int p0 = 0; p0 < units; p0 += qd::kUnitsPerPass)
        acc = qd::chain_pass<T, REP>(lane, S + (warp * units + p0) * qd::kSlotStride,
                                     F + (warp * units + p0) * qd::kScaleStride,
                                     min(qd::kUnitsPerPass, units - p0), acc);
    }
    float v[kC];
#pragma unroll
    for (int k = 0; k < kC; ++k) v[k] = __shfl_sync(0xffffffffu, acc, k);
    if (lane == 0) {
      const float d = qd::combine<T, REP>(v);
      float* out = y + r0 + warp;
      *out = accumulate ? *out + d : d;
    }
  }
}

// Shared bytes of the long-row kernel's slot arrays for R rows of `units`.
size_t long_slot_bytes(int R, int units) {
  return static_cast<size_t>(R) * static_cast<size_t>(units) *
         (qd::kSlotStride + qd::kScaleStride) * 4;
}
constexpr size_t kSmemLimit = 46 * 1024;  // under the 48 KB default

// Rows per block of the long-row kernel (1, 2 or 4: >= kMinBlocks blocks where the matrix
// allows), or 0 when one row does not fit.
int long_rows_per_block(int64_t rows, size_t rb, int units) {
  if (units <= qd::kUnitsPerPass) return 0;
  if (tile_alloc(rb) + long_slot_bytes(1, units) > kSmemLimit) return 0;
  int R = 1;
  for (int c = 2; c <= kQdWarps; c *= 2) {
    if (tile_alloc(static_cast<size_t>(c) * rb) + long_slot_bytes(c, units) > kSmemLimit) break;
    if ((rows + c - 1) / c < kMinBlocks) break;
    R = c;
  }
  return R;
}

// Rows per block: the largest power of two <= 32 whose tile is <= kTileTarget and that still
// gives >= kMinBlocks blocks; 1 when none.
int rows_per_block(int64_t rows, size_t rb) {
  int R = 1;
  for (int c = 2; c <= 32; c *= 2) {
    if (static_cast<size_t>(c) * rb > kTileTarget) break;
    if ((rows + c - 1) / c < kMinBlocks) break;
    R = c;
  }
  return R;
}

template <GgmlType T, bool REP>
void launch_qdecode(const WeightView& w, const ActBuf& a, float* y, bool accumulate,
                    cudaStream_t stream) {
  const int units = qd::units_of(static_cast<int>(w.cols));
  const int RL = long_rows_per_block(w.rows, w.row_bytes, units);
  if (RL > 0) {
    const size_t ta = tile_alloc(static_cast<size_t>(RL) * w.row_bytes);
    launch_pdl_smem("exact_qdecode_long_kernel", qdecode_long_kernel<T, REP>,
                    dim3(static_cast<unsigned>((w.rows + RL - 1) / RL)), dim3(kQdThreads),
                    ta + long_slot_bytes(RL, units), stream, static_cast<const uint8_t*>(w.data),
                    static_cast<int>(w.rows), units, w.row_bytes, RL, ta,
                    static_cast<const int8_t*>(a.q), static_cast<const float*>(a.d),
                    static_cast<const int32_t*>(a.bsum), y, accumulate ? 1 : 0);
    return;
  }
  const int R = rows_per_block(w.rows, w.row_bytes);
  const size_t ta = tile_alloc(static_cast<size_t>(R) * w.row_bytes);
  const unsigned grid = static_cast<unsigned>((w.rows + R - 1) / R);
  launch_pdl_smem("exact_qdecode_kernel", qdecode_kernel<T, REP>, dim3(grid), dim3(kQdThreads),
                  ta + kSlotBytes, stream, static_cast<const uint8_t*>(w.data),
                  static_cast<int>(w.rows), qd::units_of(static_cast<int>(w.cols)), w.row_bytes, R,
                  ta, static_cast<const int8_t*>(a.q), static_cast<const float*>(a.d),
                  static_cast<const int32_t*>(a.bsum), y, accumulate ? 1 : 0);
}

}  // namespace

bool matvec1_quant_takes(uint32_t weight_type, int64_t rows, int64_t cols) {
  const auto t = static_cast<GgmlType>(weight_type);
  int blk = 0;
  size_t bb = 0;
  switch (t) {
    case GgmlType::Q8_0:
      blk = 32;
      bb = 34;
      break;
    case GgmlType::Q4_0:
      blk = 32;
      bb = 18;
      break;
    case GgmlType::Q5_0:
      blk = 32;
      bb = 22;
      break;
    case GgmlType::Q4_K:
      blk = 256;
      bb = 144;
      break;
    case GgmlType::Q6_K:
      blk = 256;
      bb = 210;
      break;
    default: return false;
  }
  if (rows <= 0 || cols <= 0 || cols % blk != 0) return false;
  if (rows > (int64_t{1} << 30) || cols > (int64_t{1} << 24)) return false;
  return static_cast<size_t>(cols / blk) * bb <= kMaxRowBytes;
}

void matvec1_quant(const WeightView& w, const ActBuf& a, float* y, bool accumulate,
                   cudaStream_t stream) {
  if (!matvec1_quant_takes(w.type, w.rows, w.cols)) {
    throw WorkerError(ErrorCode::Internal,
                      "matvec1_quant: unsupported weight " + std::string(ggml_type_name(w.type)) +
                          " " + std::to_string(w.rows) + "x" + std::to_string(w.cols));
  }
  const auto t = static_cast<GgmlType>(w.type);
  const bool rep = w.rows % 8 == 0;
  switch (t) {
    case GgmlType::Q8_0: launch_qdecode<GgmlType::Q8_0, false>(w, a, y, accumulate, stream); return;
    case GgmlType::Q5_0: launch_qdecode<GgmlType::Q5_0, false>(w, a, y, accumulate, stream); return;
    case GgmlType::Q4_0:
      if (rep)
        launch_qdecode<GgmlType::Q4_0, true>(w, a, y, accumulate, stream);
      else
        launch_qdecode<GgmlType::Q4_0, false>(w, a, y, accumulate, stream);
      return;
    case GgmlType::Q4_K:
      if (rep)
        launch_qdecode<GgmlType::Q4_K, true>(w, a, y, accumulate, stream);
      else
        launch_qdecode<GgmlType::Q4_K, false>(w, a, y, accumulate, stream);
      return;
    case GgmlType::Q6_K: launch_qdecode<GgmlType::Q6_K, false>(w, a, y, accumulate, stream); return;
    default: break;
  }
  throw WorkerError(ErrorCode::Internal, "matvec1_quant: unreachable");
}

}  // namespace worker::kern::exact
