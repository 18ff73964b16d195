// Exact one-token products of quantized weights (see matvec1.cuh: matvec1_quant): for n_tok 1,
// y[r] = dot (or y[r] + dot when accumulate, one rounding, as the CPU's x += tmp) bit for bit
// cpu::dot_quantized(type, row, act) with act.repacked = repacked(type, rows) and
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
// Fused decode launches (tile_dots is the per-tile row loop of qdecode_kernel, shared by all):
//  - matvec1_quant_multi: Q, K, V (1..3 weights, one row length, one activation
//    quantization; the types may differ within the Q8_0 family or within the Q8_K family) in
//    one grid: segment s owns a range of blocks, each block loads its tile of R rows of its
//    weight and switches (block-uniform) to its (type, repack) body. Same rows, same steps.
//  - matvec1_quant_swiglu: a block loads R gate rows and the R up rows of the same indices
//    (two cp.async tiles), runs the 2R row dots as one tile into shared memory, then writes
//    g[r] = math::swiglu_one(gate dot, up dot, r, F & ~15): the element swiglu() writes.
// Compiled with -fmad=false; deterministic: no atomics, fixed orders.
#include <algorithm>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact_ops_math.cuh"
#include "exact_qdecode_math.cuh"
#include "launch.cuh"
#include "matvec1.cuh"

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

// The dots of the nr rows of a tile held in shared memory (row i at rowp(i)), written by
// out(i, dot). Warp w takes groups of G rows (g0 = w, w + kQdWarps * G, ...; rows g0 +
// kQdWarps * i); per pass each lane computes its unit of each of the G rows into the warp's
// slot arrays (S, F: this warp's), then lane (j, c) steps chain c of group row j. Every row's
// chains are the same steps in the same order whatever the tile or the grid, so any kernel
// built on this gives matvec1_quant's bits.
template <GgmlType T, bool REP, class RowPtr, class Out>
__device__ __forceinline__ void tile_dots(RowPtr rowp, int nr, int units,
                                          const int8_t* __restrict__ aq,
                                          const float* __restrict__ ad,
                                          const int32_t* __restrict__ abs, int* S, float* F,
                                          Out out) {
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  constexpr int kC = qd::chains<T, REP>();
  constexpr int kCL = qd::chain_lanes<T, REP>();
  constexpr int G = qd::group_rows<T, REP>();
  // Chain phase role of this lane: row j of the group, chain c.
  const int j = lane / kCL, c = lane % kCL;

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
            qd::unit_slots<T, REP>(rowp(ri), u, yw, yd, abs,
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
    if (c == 0 && j < G && my_row < nr) out(my_row, qd::combine<T, REP>(v));
  }
}

// Copies the `bytes` bytes at `start` (2-byte aligned, bytes even: every block format here)
// into dst at the same offset from a 16-byte boundary; returns that offset. Whole 16-byte
// chunks go by cp.async; the partial first and last chunks by 2-byte loads of their bytes
// inside the range only (never a byte before `start` or past its end: compute-sanitizer's
// memcheck found the aligned-down/rounded-up copies reading outside the allocation).
__device__ __forceinline__ int tile_copy(int4* dst, const uint8_t* start, size_t bytes) {
  const uintptr_t s0 = reinterpret_cast<uintptr_t>(start);
  const uintptr_t base = s0 & ~uintptr_t{15};
  const uintptr_t end = s0 + bytes;
  const int off = static_cast<int>(s0 - base);
  const int n16 = static_cast<int>((end - base + 15) / 16);
  const int4* src = reinterpret_cast<const int4*>(base);
  for (int i = static_cast<int>(threadIdx.x); i < n16; i += kQdThreads) {
    const uintptr_t c0 = base + 16 * static_cast<uintptr_t>(i);
    if (c0 >= s0 && c0 + 16 <= end) {
      cp_async16(dst + i, src + i);
    } else {
      auto* d16 = reinterpret_cast<uint16_t*>(dst + i);
      for (int h = 0; h < 8; ++h) {
        const uintptr_t a = c0 + 2 * static_cast<uintptr_t>(h);
        if (a >= s0 && a + 2 <= end) d16[h] = __ldg(reinterpret_cast<const unsigned short*>(a));
      }
    }
  }
  return off;
}

__device__ __forceinline__ int tile_load(int4* dst, const uint8_t* start, size_t bytes) {
  return tile_copy(dst, start, bytes);
}

__device__ __forceinline__ int* warp_slots(uint8_t* smem, size_t slot_at) {
  return reinterpret_cast<int*>(smem + slot_at) +
         static_cast<int>(threadIdx.x) / kWarp * qd::kWarpSlotInts;
}
__device__ __forceinline__ float* warp_scales(uint8_t* smem, size_t slot_at) {
  return reinterpret_cast<float*>(smem + slot_at) + kQdWarps * qd::kWarpSlotInts +
         static_cast<int>(threadIdx.x) / kWarp * qd::kWarpScaleFloats;
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
  const int off = tile_load(s_raw, w + static_cast<size_t>(r0) * rb, static_cast<size_t>(nr) * rb);
  griddep_wait();
  cp_async_wait_all();
  __syncthreads();

  uint8_t* smem = reinterpret_cast<uint8_t*>(s_raw);
  const uint8_t* tile = smem + off;
  tile_dots<T, REP>([&](int i) { return tile + static_cast<size_t>(i) * rb; }, nr, units, aq, ad,
                    abs, warp_slots(smem, tile_alloc_bytes), warp_scales(smem, tile_alloc_bytes),
                    [&](int i, float d) {
                      float* o = y + r0 + i;
                      *o = accumulate ? *o + d : d;
                    });
}

// f(TypeTraits<T>, bool_constant<REP>) for a quantized weight: its type and whether the
// CPU reference sums it in the x86 repack order.
template <class Fn>
void with_weight(const WeightView& w, const char* what, Fn&& f) {
  dispatch_or_throw(w.type, what, [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (!quantized(Tr::kFamily)) {
      throw_unsupported_type(what, Tr::kType);
    } else if constexpr (Tr::kRepack) {
      if (repacked(Tr::kType, w.rows)) return f(tr, std::true_type{});
      f(tr, std::false_type{});
    } else {
      f(tr, std::false_type{});
    }
  });
}

// (type, repack) of a weight as one code, for the kernels that switch per block.
enum QCode : int { kQ8_0 = 0, kQ5_0, kQ4_0, kQ4_0R, kQ4_K, kQ4_KR, kQ6_K };
template <GgmlType T, bool REP>
constexpr int qcode() {
  return T == GgmlType::Q8_0   ? kQ8_0
         : T == GgmlType::Q5_0 ? kQ5_0
         : T == GgmlType::Q4_0 ? (REP ? kQ4_0R : kQ4_0)
         : T == GgmlType::Q4_K ? (REP ? kQ4_KR : kQ4_K)
                               : kQ6_K;
}
int qcode_of(const WeightView& w) {
  int code = -1;
  with_weight(w, "exact_qdecode", [&](auto tr, auto rep) {
    code = qcode<decltype(tr)::kType, decltype(rep)::value>();
  });
  return code;
}
// Q8_0-activation family (0) or Q8_K (1).
int family_of(int code) {
  return code >= kQ4_K ? 1 : 0;
}

// Calls f.template operator()<T, REP>() for the code (KF: the Q8_K family's codes, else the
// Q8_0 family's), so one kernel holds only one activation family's bodies.
template <bool KF, class Fn>
__device__ __forceinline__ void by_code(int code, Fn&& f) {
  if constexpr (!KF) {
    switch (code) {
      case kQ8_0: f(std::integral_constant<GgmlType, GgmlType::Q8_0>{}, std::false_type{}); break;
      case kQ5_0: f(std::integral_constant<GgmlType, GgmlType::Q5_0>{}, std::false_type{}); break;
      case kQ4_0: f(std::integral_constant<GgmlType, GgmlType::Q4_0>{}, std::false_type{}); break;
      default: f(std::integral_constant<GgmlType, GgmlType::Q4_0>{}, std::true_type{}); break;
    }
  } else {
    switch (code) {
      case kQ4_K: f(std::integral_constant<GgmlType, GgmlType::Q4_K>{}, std::false_type{}); break;
      case kQ4_KR: f(std::integral_constant<GgmlType, GgmlType::Q4_K>{}, std::true_type{}); break;
      default: f(std::integral_constant<GgmlType, GgmlType::Q6_K>{}, std::false_type{}); break;
    }
  }
}

// Up to 3 weights of one row length in one launch (Q, K, V): segment s owns blocks
// [block0[s], block0[s + 1]) with R rows each; each block loads its tile and runs the row
// dots of its segment's (type, repack) body: the same per-row steps as qdecode_kernel.
struct MultiSegs {
  const uint8_t* w[3] = {};
  float* y[3] = {};
  size_t rb[3] = {};
  size_t slot_at[3] = {};  // tile_alloc of the segment's tile: where the slot arrays start
  int rows[3] = {};
  int code[3] = {};
  int block0[4] = {};
  int n = 0;
  int R = 1;
};

template <bool KF>
__global__ void __launch_bounds__(kQdThreads)
    qdecode_multi_kernel(MultiSegs segs, int units, const int8_t* __restrict__ aq,
                         const float* __restrict__ ad, const int32_t* __restrict__ abs,
                         int accumulate) {
  extern __shared__ int4 s_raw[];
  const int b = static_cast<int>(blockIdx.x);
  const int sg = b >= segs.block0[1] ? (b >= segs.block0[2] ? 2 : 1) : 0;
  const int R = segs.R;
  const int r0 = (b - segs.block0[sg]) * R;
  const int nr = min(R, segs.rows[sg] - r0);
  const size_t rb = segs.rb[sg];
  const int off =
      tile_load(s_raw, segs.w[sg] + static_cast<size_t>(r0) * rb, static_cast<size_t>(nr) * rb);
  griddep_wait();
  cp_async_wait_all();
  __syncthreads();

  uint8_t* smem = reinterpret_cast<uint8_t*>(s_raw);
  const uint8_t* tile = smem + off;
  float* y = segs.y[sg] + r0;
  int* S = warp_slots(smem, segs.slot_at[sg]);
  float* F = warp_scales(smem, segs.slot_at[sg]);
  by_code<KF>(segs.code[sg], [&](auto t, auto rep) {
    tile_dots<decltype(t)::value, decltype(rep)::value>(
        [&](int i) { return tile + static_cast<size_t>(i) * rb; }, nr, units, aq, ad, abs, S, F,
        [&](int i, float d) { y[i] = accumulate ? y[i] + d : d; });
  });
}

// g[r] = SwiGLU(gate row r . a, up row r . a) for the block's R rows: the block loads the R
// gate rows and the R up rows (two cp.async tiles, all in flight before griddep_wait), runs
// the 2R row dots as one tile (virtual rows 0..R-1 gate, R..2R-1 up) into shared memory, then
// thread i < nr writes swiglu_one(gate dot, up dot, r0 + i, F & ~15).
template <GgmlType T, bool REP>
__global__ void __launch_bounds__(kQdThreads)
    qdecode_swiglu_kernel(const uint8_t* __restrict__ wg, const uint8_t* __restrict__ wu, int rows,
                          int units, size_t rb, int R, size_t up_at, size_t slot_at,
                          const int8_t* __restrict__ aq, const float* __restrict__ ad,
                          const int32_t* __restrict__ abs, float* __restrict__ g) {
  extern __shared__ int4 s_raw[];
  const int r0 = static_cast<int>(blockIdx.x) * R;
  const int nr = min(R, rows - r0);
  uint8_t* smem = reinterpret_cast<uint8_t*>(s_raw);
  const size_t bytes = static_cast<size_t>(nr) * rb;
  const int off_g = tile_load(s_raw, wg + static_cast<size_t>(r0) * rb, bytes);
  const int off_u =
      tile_load(reinterpret_cast<int4*>(smem + up_at), wu + static_cast<size_t>(r0) * rb, bytes);
  griddep_wait();
  cp_async_wait_all();
  __syncthreads();

  const uint8_t* tg = smem + off_g;
  const uint8_t* tu = smem + up_at + off_u;
  float* dots = reinterpret_cast<float*>(smem + slot_at + kSlotBytes);  // [2R]
  tile_dots<T, REP>(
      [&](int i) {
        return i < nr ? tg + static_cast<size_t>(i) * rb : tu + static_cast<size_t>(i - nr) * rb;
      },
      2 * nr, units, aq, ad, abs, warp_slots(smem, slot_at), warp_scales(smem, slot_at),
      [&](int i, float d) { dots[i] = d; });
  __syncthreads();
  const int i = static_cast<int>(threadIdx.x);
  if (i < nr) g[r0 + i] = math::swiglu_one(dots[i], dots[nr + i], r0 + i, rows & ~15);
}

// Rows longer than one pass (decode of e.g. FFN down: 152 units a row) with few rows: the
// passes of one warp would run one after another, so here the block's 128 threads compute
// the slots of ALL the tile's units at once, then warp w runs row w's chains over the whole
// row (qd::long_row_dots, which the persistent decode step's K-quant down runs too). R <= 4
// rows a block.
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
  const int off = tile_copy(s_raw, start, static_cast<size_t>(nr) * rb);
  griddep_wait();
  cp_async_wait_all();
  __syncthreads();

  const uint8_t* tile = reinterpret_cast<const uint8_t*>(s_raw) + off;
  int* S = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(s_raw) + tile_alloc_bytes);
  float* F = reinterpret_cast<float*>(S + static_cast<size_t>(R) * units * qd::kSlotStride);
  qd::long_row_dots<T, REP, kQdThreads>([&](int rr) { return tile + static_cast<size_t>(rr) * rb; },
                                        nr, units, aq, ad, abs, S, F,
                                        [&](int r, float d) {
                                          float* o = y + r0 + r;
                                          *o = accumulate ? *o + d : d;
                                        });
}

constexpr size_t kSmemLimit = 46 * 1024;  // under the 48 KB default

// Rows per block of the long-row kernel (1, 2 or 4: >= kMinBlocks blocks where the matrix
// allows), or 0 when one row does not fit.
int long_rows_per_block(int64_t rows, size_t rb, int units) {
  if (units <= qd::kUnitsPerPass) return 0;
  if (tile_alloc(rb) + qd::long_slot_bytes(1, units) > kSmemLimit) return 0;
  int R = 1;
  for (int c = 2; c <= kQdWarps; c *= 2) {
    if (tile_alloc(static_cast<size_t>(c) * rb) + qd::long_slot_bytes(c, units) > kSmemLimit) break;
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
    launch_pdl_smem(
        "exact_qdecode_long_kernel", qdecode_long_kernel<T, REP>,
        dim3(static_cast<unsigned>((w.rows + RL - 1) / RL)), dim3(kQdThreads),
        ta + qd::long_slot_bytes(RL, units), stream, static_cast<const uint8_t*>(w.data),
        static_cast<int>(w.rows), units, w.row_bytes, RL, ta, static_cast<const int8_t*>(a.q),
        static_cast<const float*>(a.d), static_cast<const int32_t*>(a.bsum), y, accumulate ? 1 : 0);
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

// Rows per block shared by the segments of a multi launch: the largest power of two <= 32
// whose tiles are <= kTileTarget and that still gives >= kMinBlocks blocks in all.
int multi_rows_per_block(const WeightView* const* ws, int n) {
  int R = 1;
  for (int c = 2; c <= 32; c *= 2) {
    int64_t blocks = 0;
    bool fits = true;
    for (int i = 0; i < n; ++i) {
      fits = fits && static_cast<size_t>(c) * ws[i]->row_bytes <= kTileTarget;
      blocks += (ws[i]->rows + c - 1) / c;
    }
    if (!fits || blocks < kMinBlocks) break;
    R = c;
  }
  return R;
}

// Shared bytes of the SwiGLU kernel with R rows a block of row_bytes each.
size_t swiglu_smem(int R, size_t rb) {
  return 2 * tile_alloc(static_cast<size_t>(R) * rb) + kSlotBytes +
         2 * static_cast<size_t>(R) * sizeof(float);
}
int swiglu_rows_per_block(int64_t rows, size_t rb) {
  int R = 1;
  for (int c = 2; c <= 32; c *= 2) {
    if (2 * static_cast<size_t>(c) * rb > kTileTarget) break;
    if (swiglu_smem(c, rb) > kSmemLimit) break;
    if ((rows + c - 1) / c < kMinBlocks) break;
    R = c;
  }
  return R;
}

}  // namespace

bool matvec1_quant_takes(uint32_t weight_type, int64_t rows, int64_t cols) {
  return dispatch(weight_type, [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (!quantized(Tr::kFamily)) {
      return false;
    } else {
      if (rows <= 0 || cols <= 0 || cols % Tr::kBlock != 0) return false;
      if (rows > (int64_t{1} << 30) || cols > (int64_t{1} << 24)) return false;
      return static_cast<size_t>(cols / Tr::kBlock) * Tr::kBlockBytes <= kMaxRowBytes;
    }
  });
}

void matvec1_quant(const WeightView& w, const ActBuf& a, float* y, bool accumulate,
                   cudaStream_t stream) {
  if (!matvec1_quant_takes(w.type, w.rows, w.cols)) {
    throw WorkerError(ErrorCode::Internal,
                      "matvec1_quant: unsupported weight " + std::string(ggml_type_name(w.type)) +
                          " " + std::to_string(w.rows) + "x" + std::to_string(w.cols));
  }
  with_weight(w, "matvec1_quant", [&](auto tr, auto rep) {
    launch_qdecode<decltype(tr)::kType, decltype(rep)::value>(w, a, y, accumulate, stream);
  });
}

bool matvec1_quant_multi_takes(const WeightView* const* ws, int n) {
  if (n < 1 || n > 3) return false;
  for (int i = 0; i < n; ++i) {
    if (ws[i] == nullptr || !matvec1_quant_takes(ws[i]->type, ws[i]->rows, ws[i]->cols))
      return false;
    if (ws[i]->cols != ws[0]->cols) return false;
    // one activation quantization (Q8_0 or Q8_K) for all
    if (family_of(qcode_of(*ws[i])) != family_of(qcode_of(*ws[0]))) return false;
  }
  return true;
}

void matvec1_quant_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a,
                         bool accumulate, cudaStream_t stream) {
  if (!matvec1_quant_multi_takes(ws, n)) {
    throw WorkerError(ErrorCode::Internal,
                      "matvec1_quant_multi: unsupported weights (1..3 quantized weights of one "
                      "row length and one activation type)");
  }
  MultiSegs segs;
  segs.n = n;
  segs.R = multi_rows_per_block(ws, n);
  size_t smem = 0;
  int blocks = 0;
  for (int i = 0; i < n; ++i) {
    segs.w[i] = static_cast<const uint8_t*>(ws[i]->data);
    segs.y[i] = ys[i];
    segs.rb[i] = ws[i]->row_bytes;
    segs.rows[i] = static_cast<int>(ws[i]->rows);
    segs.code[i] = qcode_of(*ws[i]);
    segs.slot_at[i] = tile_alloc(static_cast<size_t>(segs.R) * ws[i]->row_bytes);
    smem = std::max(smem, segs.slot_at[i] + kSlotBytes);
    segs.block0[i] = blocks;
    blocks += (segs.rows[i] + segs.R - 1) / segs.R;
  }
  for (int i = n; i <= 3; ++i) segs.block0[i] = blocks;
  const int units = qd::units_of(static_cast<int>(ws[0]->cols));
  auto* kernel =
      family_of(segs.code[0]) == 1 ? qdecode_multi_kernel<true> : qdecode_multi_kernel<false>;
  launch_pdl_smem("exact_qdecode_multi_kernel", kernel, dim3(static_cast<unsigned>(blocks)),
                  dim3(kQdThreads), smem, stream, segs, units, static_cast<const int8_t*>(a.q),
                  static_cast<const float*>(a.d), static_cast<const int32_t*>(a.bsum),
                  accumulate ? 1 : 0);
}

bool matvec1_quant_swiglu_takes(const WeightView& gate, const WeightView& up) {
  return matvec1_quant_takes(gate.type, gate.rows, gate.cols) && gate.type == up.type &&
         gate.rows == up.rows && gate.cols == up.cols && gate.row_bytes == up.row_bytes &&
         swiglu_smem(1, gate.row_bytes) <= kSmemLimit;
}

void matvec1_quant_swiglu(const WeightView& gate, const WeightView& up, const ActBuf& a, float* g,
                          cudaStream_t stream) {
  if (!matvec1_quant_swiglu_takes(gate, up)) {
    throw WorkerError(ErrorCode::Internal, "matvec1_quant_swiglu: unsupported gate/up weights " +
                                               std::string(ggml_type_name(gate.type)) + " " +
                                               std::to_string(gate.rows) + "x" +
                                               std::to_string(gate.cols));
  }
  const size_t rb = gate.row_bytes;
  const int R = swiglu_rows_per_block(gate.rows, rb);
  const size_t up_at = tile_alloc(static_cast<size_t>(R) * rb);
  const size_t slot_at = 2 * up_at;
  const unsigned grid = static_cast<unsigned>((gate.rows + R - 1) / R);
  with_weight(gate, "matvec1_quant_swiglu", [&](auto tr, auto rep) {
    launch_pdl_smem("exact_qdecode_swiglu_kernel",
                    qdecode_swiglu_kernel<decltype(tr)::kType, decltype(rep)::value>, dim3(grid),
                    dim3(kQdThreads), swiglu_smem(R, rb), stream,
                    static_cast<const uint8_t*>(gate.data), static_cast<const uint8_t*>(up.data),
                    static_cast<int>(gate.rows), qd::units_of(static_cast<int>(gate.cols)), rb, R,
                    up_at, slot_at, static_cast<const int8_t*>(a.q), static_cast<const float*>(a.d),
                    static_cast<const int32_t*>(a.bsum), g);
  });
}

}  // namespace worker::kern::exact
