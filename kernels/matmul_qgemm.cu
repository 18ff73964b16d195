// Exact quantized prompt GEMM (matmul.cuh: qgemm / qgemm_takes): the same bits as
// exact::matmul for Q8_0 / Q4_0 / Q5_0 / Q4_K / Q6_K weights, i.e. as the CPU reference's
// cpu::dot_quantized with CpuEngine::matmul's order flags, tiled for prompt batches.
//
// Orders reproduced (names: exact_quant_math.cuh's Flavor; per-thread code:
// exact_qgemm_math.cuh, which the host emulation test replays thread by thread):
//  - Q0Lanes (Q8_0, Q5_0, Q4_0 with rows % 8 != 0; dot_q0_lanes): 8 chains per output,
//    acc[i] = fma(d_w * d_a, float(int dot of elements 4i..4i+3), acc[i]) block after block,
//    then hsum_float_8. Thread L of a 4-thread group owns chains L and L + 4 of 4 rows x TT
//    tokens (one scale product for both): one dp4a of 4 int8 pairs is exactly the lane
//    integer (weights unpacked to signed int8 in shared memory; Q4_0 / Q5_0 offsets applied
//    per byte: exact), converted to float exactly (the 1.5 * 2^23 bias as dp4a's
//    accumulator input, biased_i2f: |int| < 2^22) and fma'd into the chain in block order.
//  - Q6K (dot_q6_k): 8 chains over super-blocks, lane int L = sum over sub-blocks g of
//    scale * dot(elements 32g+4L..+3) minus 32 (bs[2L] sc[2L] + bs[2L+1] sc[2L+1]) (integers:
//    exact in any order), acc[L] = fma(d_a * d_w, float(lane), acc[L]); hsum_float_8.
//  - Q4KLanes (Q4_K with rows % 8 != 0; dot_q4_k): the 8 lane chains as Q6K without the
//    correction, plus 4 min chains in threads L < 4, accm[k] = fma(-d_a * dmin, float(mins x
//    bsums of pair k), accm[k]); hsum8(acc) + ((m0 + m2) + (m1 + m3)).
//  - Q4_0Rep (Q4_0, rows % 8 == 0; dot_q4_0_repack): one chain, acc = fma(float(block int
//    dot), d_w * d_a, acc). One thread per (row, token): 8 dp4a over the block's words.
//  - Q4KRep (Q4_K, rows % 8 == 0; dot_q4_k_repack): acc / accm, one step per 64-element pair
//    for tokens with batch index < batch_n - batch_n % 4 (gemm), one per super-block for the
//    others (gemv); result acc - accm.
// The 8 lane chains combine with shuffle butterflies xor 4, 2, 1 (xor 2, 1 for the 4 min
// chains; Q0Lanes: the thread's two chains added, then xor 2, 1): lane 0 gets (t0 + t2) +
// (t1 + t3) with t_i = v_i + v_(i+4), hsum_float_8's tree, since a + b == b + a bit for bit.
//
// Big batches (kQgemmMmaMinTokens tokens and grids that fill their waves) take a tensor-core tile
// instead: Q0Lanes weights mma0 (the lane integers from mma.m16n8k8 with a block-diagonal
// activation operand, the same chains, each output's 8 in one thread; its operands converted
// to f16 by a pass before it, into ActBuf::mma), Q4KRep kmma (the pair
// integers as f32 mma chains), Q6_K q6mma (the lane integers from split-scale mma chains with
// biased accumulators). Each keeps the reference's float steps and their order.
//
// Work split (the dp4a tiles): a CTA (256 threads) owns BR weight rows (32; 16 for the smallest
// token tile of small grids at <= 32 tokens) x BT tokens of one weight (up to three weights of one
// type and width share a launch: Q / K / V, gate and up, CTA columns picking theirs); per step of
// 256 elements the CTA unpacks the rows' weights (each weight block read once per tile) and copies
// the tokens' activation quants into shared memory, then each thread steps its chains, which stay
// in registers for the whole row (the next step's global loads are issued into registers
// before this step's chains run, and written to shared memory after the next barrier; for
// batches of up to kRingMaxTokens, the weights' raw bytes instead come kRing - 1 steps ahead
// through a ring of shared-memory stages filled by cp.async, where the rows are 8-byte
// aligned: Q8_0 / Q5_0 / Q4_0 / Q4_K, not Q6_K's 210-byte super-blocks). BT is
// 8..32 (lane flavours) or 16..64 (repack flavours), the largest that still gives ~2 CTAs
// per SM. The result tile goes through shared memory to coalesced stores. The file is compiled with
// -fmad=false: every fma is explicit. Weights are read before griddep_wait() (never written by a
// kernel); activations and y after. No atomics.
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "common.cuh"
#include "common/errors.h"
#include "exact_qgemm_math.cuh"
#include "launch.cuh"
#include "matmul.cuh"

namespace worker::kern::exact {
namespace {

using qg::Acc;
using qg::Geo;
using qg::kBR;
using qg::kThreads;
using qg::kUnits;
using qg::Smem;
using qg::Stage;
using qm::Flavor;

// CTAs per SM the register budget is sized for (__launch_bounds__): 3 for the Q0 tiles, 2
// for the K-quant and repack tiles (their chains / integer sums need up to 128 registers).
// The 16-row tiles run where the 32-row grid leaves SMs without two CTAs: up to 32 tokens
// (the ring) they want registers more than residents, Q0Lanes 2 and the others 1 (Q4KRep
// without spills); Q0Lanes' 33-64-token tiles (no ring, up to 448 CTAs) want residents, 4.
// H100, same call, prompt tok/s vs the previous 4 / 3: Q8_0 32 tokens 12.2k -> 13.1-13.3k,
// Q4_K_M 11.1k -> 12.8k; 64 tokens with 2 there: Q8_0 18.9k -> 17.3k.
template <Flavor FL, int TT, int BR, bool RING>
constexpr int min_blocks() {
  if constexpr (BR == kBR) return FL == Flavor::Q0Lanes ? 3 : 2;
  if constexpr (FL == Flavor::Q0Lanes) return RING ? 2 : 4;
  return 1;
}

// Dynamic shared memory of a tile: Smem, then (ring) kRing stages of raw weight bytes.
template <GgmlType T, Flavor FL, int TT, bool RING, int BR>
__host__ __device__ constexpr size_t smem_bytes() {
  constexpr size_t base = (sizeof(Smem<FL, TT, BR>) + 15) / 16 * 16;
  if constexpr (RING)
    return base + static_cast<size_t>(qg::kRing) * qg::ring_stage_bytes<T, BR>();
  else
    return base;
}

// Copies the raw weight bytes of `step` into ring stage `stage` (8-byte cp.async; pieces
// outside the matrix zero-filled); the caller commits the group.
template <GgmlType T, int BR>
__device__ __forceinline__ void ring_copy(int tid, int step, const uint8_t* __restrict__ w,
                                          int rows, size_t row_bytes, int row0, uint8_t* stage) {
#pragma unroll
  for (int i = 0; i < qg::ring_rounds<T, BR>(); ++i) {
    const int n = tid + kThreads * i;
    if (n < qg::ring_pieces<T, BR>()) {
      int dst = 0;
      const uint8_t* src = nullptr;
      const bool in = qg::ring_piece<T>(n, step, w, rows, row_bytes, row0, dst, src);
      cp_async8(stage + dst, in ? src : w, in ? 8 : 0);
    }
  }
}

// Up to three weights of one type, width and flavour multiplied by the same activations in
// one launch (Q / K / V, gate and up; one weight: the others empty): CTA columns
// [blk_end[i - 1], blk_end[i]) take weight i's row tiles.
// One type and width: one row_bytes. MULTI (a template parameter) is false for one weight: its
// pointers and sizes then stay kernel parameters (no registers spent on the selection).
struct QSegs {
  const uint8_t* w[3];
  float* y[3];
  int rows[3];
  int blk_end[3];
  size_t row_bytes;
};

// Segment of CTA column bx.
template <bool MULTI>
__device__ __forceinline__ int seg_of(const QSegs& sg, int bx) {
  if constexpr (!MULTI) return 0;
  return bx < sg.blk_end[0] ? 0 : (bx < sg.blk_end[1] ? 1 : 2);
}

template <GgmlType T, Flavor FL, int TT, bool PF, bool RING, bool MULTI, int BR>
__global__ void __launch_bounds__(kThreads, min_blocks<FL, TT, BR, RING>())
    qgemm_kernel(const QSegs sg, int cols, const int8_t* __restrict__ aq,
                 const float* __restrict__ ad, const int32_t* __restrict__ abs, int n_tok,
                 int gemm_end, int accumulate) {
  using G = Geo<FL, TT, BR>;
  extern __shared__ __align__(16) unsigned char qgemm_smem[];
  auto& s = *reinterpret_cast<Smem<FL, TT, BR>*>(qgemm_smem);
  [[maybe_unused]] uint8_t* const ring = qgemm_smem + smem_bytes<T, FL, TT, false, BR>();
  const int tid = static_cast<int>(threadIdx.x);
  // this CTA's weight (selects, not an indexed parameter array: that would go to local memory)
  const int bx = static_cast<int>(blockIdx.x);
  const int seg = seg_of<MULTI>(sg, bx);
  const uint8_t* __restrict__ w = seg == 0 ? sg.w[0] : (seg == 1 ? sg.w[1] : sg.w[2]);
  const size_t row_bytes = sg.row_bytes;
  const int rows = seg == 0 ? sg.rows[0] : (seg == 1 ? sg.rows[1] : sg.rows[2]);
  const int row0 = (bx - (seg == 0 ? 0 : (seg == 1 ? sg.blk_end[0] : sg.blk_end[1]))) * BR;
  const int tok0 = static_cast<int>(blockIdx.y) * G::BT;
  constexpr bool kK = qg::is_k<T>();
  const int nb = cols / (kK ? 256 : 32);
  const int steps = kK ? nb : (nb + kUnits - 1) / kUnits;
  const uint32_t gmask = qg::gemm_mask_of<FL, TT>(tid, tok0, gemm_end);

  Acc<FL, TT, BR> a;
  qg::zero_acc(a);
  Stage<T, FL, TT, BR> st;
  constexpr int kStage = RING ? qg::ring_stage_bytes<T, BR>() : 0;
  if constexpr (RING) {  // weights only: no kernel writes them
    for (int k = 0; k < qg::kRing - 1; ++k) {
      if (k < steps) ring_copy<T, BR>(tid, k, w, rows, row_bytes, row0, ring + k * kStage);
      cp_async_commit();
    }
  } else {
    qg::fetch_w(tid, 0, w, rows, row_bytes, row0, nb, st);
  }
  griddep_wait();  // activations (and y) come from earlier kernels
  qg::fetch_a(tid, 0, aq, ad, abs, cols, nb, tok0, n_tok, st);
  for (int step = 0; step < steps; ++step) {
    if constexpr (RING) {
      cp_async_wait<qg::kRing - 2>();  // this thread's copies of `step` have landed
      __syncthreads();  // everyone's have; the previous step's chains are done with s and
                        // the previous step's stage, which the next copy refills
      const int next = step + qg::kRing - 1;
      if (next < steps)
        ring_copy<T, BR>(tid, next, w, rows, row_bytes, row0, ring + (next % qg::kRing) * kStage);
      cp_async_commit();
      qg::fetch_w_ring(tid, step, ring + (step % qg::kRing) * kStage, rows, row0, nb, st);
      if (!PF && step > 0) qg::fetch_a(tid, step, aq, ad, abs, cols, nb, tok0, n_tok, st);
    } else if (step > 0) {
      __syncthreads();  // the previous step's chains are done with s
      if constexpr (!PF) {
        qg::fetch_w(tid, step, w, rows, row_bytes, row0, nb, st);
        qg::fetch_a(tid, step, aq, ad, abs, cols, nb, tok0, n_tok, st);
      }
    }
    qg::commit(tid, st, s);
    __syncthreads();
    if constexpr (PF) {  // the next step's loads fly while this step's chains run
      if (step + 1 < steps) {
        if constexpr (!RING) qg::fetch_w(tid, step + 1, w, rows, row_bytes, row0, nb, st);
        qg::fetch_a(tid, step + 1, aq, ad, abs, cols, nb, tok0, n_tok, st);
      }
    }
    const int nunits = kK ? kUnits : min(kUnits, nb - step * kUnits);
    qg::compute_step<T, FL, TT>(tid, s, nunits, gmask, a);
  }

  // Combine each (row, token)'s chains; one thread per (row, token) writes the out tile.
  const int lane = tid & 31;
#pragma unroll
  for (int i = 0; i < G::RT; ++i) {
#pragma unroll
    for (int j = 0; j < TT; ++j) {
      float v = a.acc[i][j], m = a.accm[i][j];
      bool writer = true;
      if constexpr (FL == Flavor::Q0Lanes) {  // chains L and L + 4 in this thread
        v = v + m;
        v = v + __shfl_xor_sync(0xffffffffu, v, 2);
        v = v + __shfl_xor_sync(0xffffffffu, v, 1);
        writer = (lane & 3) == 0;
      } else if constexpr (qg::lane_flavor<FL>()) {
        v = v + __shfl_xor_sync(0xffffffffu, v, 4);
        v = v + __shfl_xor_sync(0xffffffffu, v, 2);
        v = v + __shfl_xor_sync(0xffffffffu, v, 1);
        if constexpr (FL == Flavor::Q4KLanes) {
          m = m + __shfl_xor_sync(0xffffffffu, m, 2);
          m = m + __shfl_xor_sync(0xffffffffu, m, 1);
        }
        writer = (lane & 7) == 0;
      }
      if (writer) {
        s.out[qg::thread_tok<FL, TT>(tid, j) * G::OS + qg::thread_row<FL, TT>(tid, i)] =
            qg::final_value<FL>(v, m);
      }
    }
  }
  __syncthreads();
  {  // y selected here, not held through the loop
    const int sy = seg_of<MULTI>(sg, bx);
    float* __restrict__ y = sy == 0 ? sg.y[0] : (sy == 1 ? sg.y[1] : sg.y[2]);
    qg::store_tile<FL, TT>(tid, s, row0, rows, tok0, n_tok, y, accumulate);
  }
}

// ---- Q0Lanes on the tensor cores (big prompt batches: mma_fills, kQgemmMmaMinTokens) ----
//
// The reference's lane integer (4 int8 products, elements 4L..4L+3 of a block) is exact in any
// order, so an mma may form it when each of its outputs sums exactly one lane. mma.m16n8k8
// (f16 operands, f32 accumulation, C = 0) over slice s of a block (elements 8s..8s+7: lanes 2s
// and 2s + 1): A = 16 weight rows x 8 elements (natural layout, ldmatrix), B = 8 elements x 8
// columns where column n = (token n / 2 of a quad, lane 2s + n % 2) holds that token's 4
// elements of the lane and zeros elsewhere (B is block-diagonal: each thread's B word is the
// token's activation word, masked). Every product and partial sum is an integer below 2^17
// (int8 values are exact in f16): the f32 result is exactly float(lane integer), the
// reference's int -> float conversion included. Thread (g, t) of a warp (g = lane / 4, t =
// lane % 4) gets, per 16-row group, token quad and slice, rows g and g + 8 of token t of the
// quad, lanes 2s and 2s + 1: over a block's four slices all 8 lane chains of its two (row,
// token) outputs, which it steps with acc = fma(d_w * d_a, lane, acc) block after block (one
// scale product per output and block) and combines with hsum_float_8 in the thread. The
// threads whose B words are the zeros of the block-diagonal operand load them from a zero
// region laid out like the activations (no mask instruction), 16 banks away from the real words.
//
// The operands come converted: prep_kernel, launched before the tile, writes the launch's
// weights and activation quants as f16 (quant minus the type's offset: exact) with their scales
// into ActBuf::mma in the tile's own layout (PrepLayout), once per launch instead of once per
// CTA (a weight row is read by every token tile: 16 CTAs at 512 tokens). The tile then only
// copies: 64 weight rows x 32 tokens a CTA (warps 2 x 4, each 32 rows x 8 tokens), steps of 128
// elements (four blocks) through a ring of kRing f16 stages filled by 16-byte cp.async kRing - 1
// steps ahead, one barrier a step. (Before, each CTA converted the raw bytes itself: 191 of the
// ~836 PTX instructions of a thread's step, tools/ptxcount.py; perf-notes v38.)
namespace mma0 {
constexpr int kWQ = 2;         // token quads a warp
constexpr int kMR = 64;        // weight rows a CTA
constexpr int kMT = 16 * kWQ;  // tokens a CTA (4 warp columns of 4 kWQ tokens)
constexpr int kKB = 4;         // blocks a step
constexpr int kKS = 32 * kKB;  // elements a step
// halves a weight row of an f16 stage (272 bytes: ldmatrix's 8 rows hit 8 distinct bank quads)
constexpr int kWS = kKS + 8;
constexpr int kXS = kKS + 16;  // halves a token row (a warp's B loads: distinct banks)
constexpr int kRing = 3;       // f16 stages in flight

// The thread index passed through an empty volatile asm, so that the compiler cannot prove it
// unchanged: the per-step copy and conversion addresses are recomputed from it each step
// instead of living through the loop, where the 64 chain registers leave no room for them
// (ptxas spilled them; ncu: the reloads were 20% of the tile's stall samples).
__device__ __forceinline__ int step_tid(int tid) {
  asm volatile("" : "+r"(tid));
  return tid;
}

struct F16Stage {
  alignas(16) uint16_t w[kMR * kWS];  // f16 weights, element order
  // f16 activation quants; in each block's 16 words, word 4s + t (elements 8s + 2t, + 1) at 4t + s
  alignas(16) uint16_t x[kMT * kXS];
  // d_w, [block][dw_slot(row)]: a thread's four rows g, g + 8, g + 16, g + 24 of its warp's 32
  // are one 16-byte load
  alignas(16) float dw[kMR * kKB];
  // d_a, [block][da_slot(token)]: a thread's tokens t, t + 4 of its warp's 8 are one 8-byte load
  alignas(16) float da[kMT * kKB];
};
__host__ __device__ constexpr int dw_slot(int row) {
  return (row >> 5) * 32 + (row & 7) * 4 + ((row >> 3) & 3);
}
__host__ __device__ constexpr int da_slot(int tok) {
  return (tok >> 3) * 8 + (tok & 3) * 2 + ((tok >> 2) & 1);
}
struct Smem {
  union {
    F16Stage st[kRing];
    float out[kMT * (kMR + 1)];  // the result tile [token][row], after the last step
  };
  // Zeros laid out as an f16 stage's activations (+ 128 bytes to place them): the B words of
  // the threads whose column takes none of their k (compute_block) come from here.
  alignas(128) uint8_t zx[kMT * kXS * 2 + 128];
};
static_assert(sizeof(F16Stage) % 128 == 0, "every stage's activations at one offset mod 128");

// The zeros' base: 64 bytes (16 banks) away from the stages' activations mod 128, so that a
// quarter warp's zero words and real words (same offsets) fall in different banks.
__device__ __forceinline__ const uint32_t* zero_words(const Smem& sm) {
  const auto xa = static_cast<uint32_t>(__cvta_generic_to_shared(sm.st[0].x));
  const auto za = static_cast<uint32_t>(__cvta_generic_to_shared(sm.zx));
  return reinterpret_cast<const uint32_t*>(sm.zx + ((xa + 64u - za) & 127u));
}

// A launch's operands as the tile reads them (byte offsets into ActBuf::mma, 256-aligned; CTA
// column bx = row tile bx of the launch's weights, the segments' tiles in order):
//   w:  [bx][kMR][cols] f16 weight quants minus the type's offset; rows past a weight's end 0;
//   dw: [bx][block][dw_slot(row % kMR)] the weight scales (fp16 d as float);
//   x:  [token][cols] f16 activation quants, each block's word 4s + t at 4t + s; tokens up to a
//       multiple of kMT (0 past n_tok);
//   da: [token / kMT][block][da_slot(token % kMT)] the activation scales.
struct PrepLayout {
  size_t w, dw, x, da, bytes;
};
constexpr size_t al256(size_t n) {
  return (n + 255) / 256 * 256;
}
// A batch's token tiles (kMT tokens a CTA row); the prepared activations hold their tokens, the
// ones past n_tok zero.
__host__ __device__ constexpr int token_tiles(int n_tok) {
  return (n_tok + kMT - 1) / kMT;
}
// The layout of a launch whose weights hold w_elems elements (tiles x kMR rows x cols) and whose
// batch has n_tok tokens of cols values; with the largest of each, qgemm_scratch_bytes.
constexpr PrepLayout prep_layout(int64_t w_elems, int cols, int n_tok) {
  const auto e = static_cast<size_t>(w_elems), c = static_cast<size_t>(cols),
             tp = static_cast<size_t>(token_tiles(n_tok)) * kMT;
  PrepLayout l{};
  l.w = 0;
  l.dw = l.w + al256(e * 2);
  l.x = l.dw + al256(e / 32 * 4);
  l.da = l.x + al256(tp * c * 2);
  l.bytes = l.da + al256(tp * (c / 32) * 4);
  return l;
}
// The tile's kernel arguments: the regions of a PrepLayout.
struct Prep {
  const uint16_t* w;
  const float* dw;
  const uint16_t* x;
  const float* da;
};

// The activation quants of step `step` (kKS of each of the tile's kMT tokens) into x: one
// 16-byte piece a thread, tokens past n_tok zero-filled (kmma's and q6mma's raw stages).
__device__ __forceinline__ void issue_quants(int tid, int step, const int8_t* __restrict__ aq,
                                             int cols, int tok0, int n_tok, int8_t* x) {
  static_assert(kMT * kKS / 16 == kThreads, "one 16-byte piece a thread");
  const int t = tid >> 3;
  const bool in = tok0 + t < n_tok;
  cp_async16(x + 16 * tid,
             aq + static_cast<size_t>(in ? tok0 + t : 0) * cols + kKS * step + 16 * (tid & 7),
             in ? 16 : 0);
}

// Unsigned bytes u (value = u - off) as two f16x2 words, exactly: (0x6400 | u) - (1024 + off).
__device__ __forceinline__ void bytes_to_f16(uint32_t u, uint32_t bias2, uint32_t& lo,
                                             uint32_t& hi) {
  const uint32_t l = __byte_perm(u, 0x64646464u, 0x4140), h = __byte_perm(u, 0x64646464u, 0x4342);
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(lo) : "r"(l), "r"(bias2));
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(h), "r"(bias2));
}

// 2W activation quants (int8; 16 or 8 of them, aligned to their size) as W f16x2 words,
// exactly: word w holds quants 2w, 2w + 1 ((0x6400 | (q ^ 0x80)) - (1024 + 128)).
template <int W>
__device__ __forceinline__ void quants_to_f16(const int8_t* src, uint32_t (&v)[W]) {
  static_assert(W == 8 || W == 4, "one 16- or 8-byte load");
  constexpr uint32_t abias2 = 0x6480u * 0x10001u;
  uint32_t b[W / 2];
  if constexpr (W == 8) {
    const uint4 a = *reinterpret_cast<const uint4*>(src);
    b[0] = a.x, b[1] = a.y, b[2] = a.z, b[3] = a.w;
  } else {
    const uint2 a = *reinterpret_cast<const uint2*>(src);
    b[0] = a.x, b[1] = a.y;
  }
#pragma unroll
  for (int i = 0; i < W / 2; ++i) bytes_to_f16(b[i] ^ 0x80808080u, abias2, v[2 * i], v[2 * i + 1]);
}

// (a, b) as f16x2, exactly for |a|, |b| <= 2048: the scales and bsums of kmma and q6mma.
__device__ __forceinline__ uint32_t f16x2_ints(int a, int b) {
  return static_cast<uint32_t>(__half_as_ushort(__int2half_rn(a))) |
         (static_cast<uint32_t>(__half_as_ushort(__int2half_rn(b))) << 16);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&a)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}
// c += a b (m16n8k8, f16 operands, f32 accumulators): the Q0 lanes (from c = 0) and q6mma's
// bsum correction.
__device__ __forceinline__ void mma8(uint32_t a0, uint32_t a1, uint32_t b, float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// c += a b (m16n8k16, f16 operands, f32 accumulators): kmma's and q6mma's chains.
__device__ __forceinline__ void mma16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                      float (&c)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// acc[r][p][j][L]: row g + 8j of row group r, token 4p + t of the warp's tokens, lane L.
struct MAcc {
  float v[2][kWQ][2][8];
};

// The chain steps of block b of an f16 stage.
// xw: the stage's activation words, or (b_zero) the zero words at the same offsets.
__device__ __forceinline__ void compute_block(int tid, const F16Stage& s, const uint32_t* xw, int b,
                                              MAcc& acc) {
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp & 1) * 32, tb = (warp >> 1) * 4 * kWQ;
  static_assert(kWQ == 2, "a thread's two tokens are one 8-byte load");
  const float4 w4 = *reinterpret_cast<const float4*>(s.dw + b * kMR + rb + 4 * g);
  const float2 a2 = *reinterpret_cast<const float2*>(s.da + b * kMT + tb + 2 * t);
  const float dw[2][2] = {{w4.x, w4.y}, {w4.z, w4.w}}, da[kWQ] = {a2.x, a2.y};
  float sc[2][kWQ][2];  // the scale products d_w * d_a of the thread's outputs
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int p = 0; p < kWQ; ++p) {
      sc[r][p][0] = dw[r][0] * da[p];
      sc[r][p][1] = dw[r][1] * da[p];
    }
  // The B words of column g (token 4p + g / 2) for the block's four slices: one 16-byte load.
  uint32_t bw[kWQ][4];
#pragma unroll
  for (int p = 0; p < kWQ; ++p) {
    const uint4 w =
        *reinterpret_cast<const uint4*>(xw + (tb + 4 * p + (g >> 1)) * (kXS / 2) + 16 * b + 4 * t);
    bw[p][0] = w.x;
    bw[p][1] = w.y;
    bw[p][2] = w.z;
    bw[p][3] = w.w;
  }
  const uint32_t abase =
      static_cast<uint32_t>(__cvta_generic_to_shared(s.w)) +
      2u * static_cast<uint32_t>((rb + (lane & 7) + 8 * ((lane >> 3) & 1)) * kWS + 8 * (lane >> 4) +
                                 32 * b);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t a[2][4];  // rows 0-7 / 8-15 of slice 2h, then of slice 2h + 1
#pragma unroll
    for (int r = 0; r < 2; ++r) ldmatrix_x4(abase + 2u * (16 * r * kWS + 16 * h), a[r]);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int sl = 2 * h + k;
#pragma unroll
      for (int p = 0; p < kWQ; ++p) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma8(a[r][2 * k], a[r][2 * k + 1], bw[p][sl], d);
          float* c0 = acc.v[r][p][0];
          float* c1 = acc.v[r][p][1];
          const float s0 = sc[r][p][0], s1 = sc[r][p][1];
          c0[2 * sl] = qm::fma_(s0, d[0], c0[2 * sl]);
          c0[2 * sl + 1] = qm::fma_(s0, d[1], c0[2 * sl + 1]);
          c1[2 * sl] = qm::fma_(s1, d[2], c1[2 * sl]);
          c1[2 * sl + 1] = qm::fma_(s1, d[3], c1[2 * sl + 1]);
        }
      }
    }
  }
}

// The result tile out ([token][row], kMR + 1 floats a token) into y (+= with accumulate): four
// rows of a token a thread and round, 16-byte stores where the rows allow them.
__device__ __forceinline__ void store_tile(const float* out, int tid, int tok0, int n_tok, int row0,
                                           int rows, float* __restrict__ y, int accumulate) {
  const bool vec = rows % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
#pragma unroll
  for (int i = 0; i < kMT * kMR / (4 * kThreads); ++i) {
    const int k = tid + i * kThreads, tt = k / (kMR / 4), r = 4 * (k % (kMR / 4));
    if (tok0 + tt >= n_tok) continue;
    const float* src = out + tt * (kMR + 1) + r;
    float* o = y + static_cast<size_t>(tok0 + tt) * static_cast<size_t>(rows) + (row0 + r);
    if (vec && row0 + r < rows) {  // rows % 4 == 0: all four rows are in
      float4 v = make_float4(src[0], src[1], src[2], src[3]);
      if (accumulate) {
        const float4 old = *reinterpret_cast<const float4*>(o);
        v = make_float4(old.x + v.x, old.y + v.y, old.z + v.z, old.w + v.w);
      }
      *reinterpret_cast<float4*>(o) = v;
    } else if (!vec) {
      for (int j = 0; j < 4 && row0 + r + j < rows; ++j) o[j] = accumulate ? o[j] + src[j] : src[j];
    }
  }
}

// The weight segment of CTA column bx of a tensor-core tile (kMR rows a tile): its data, its
// rows and the tile's first row.
struct TileSeg {
  const uint8_t* w;
  int rows, row0;
};
template <bool MULTI>
__device__ __forceinline__ TileSeg tile_seg(const QSegs& sg, int bx) {
  const int seg = seg_of<MULTI>(sg, bx);
  return TileSeg{seg == 0 ? sg.w[0] : (seg == 1 ? sg.w[1] : sg.w[2]),
                 seg == 0 ? sg.rows[0] : (seg == 1 ? sg.rows[1] : sg.rows[2]),
                 (bx - (seg == 0 ? 0 : (seg == 1 ? sg.blk_end[0] : sg.blk_end[1]))) * kMR};
}
// The finished out tile (after a barrier) to CTA column bx's y.
template <bool MULTI>
__device__ __forceinline__ void store_out(const float* out, int tid2, const QSegs& sg, int bx,
                                          int tok0, int n_tok, const TileSeg& ts, int accumulate) {
  const int sy = seg_of<MULTI>(sg, bx);
  float* __restrict__ y = sy == 0 ? sg.y[0] : (sy == 1 ? sg.y[1] : sg.y[2]);
  store_tile(out, tid2, tok0, n_tok, ts.row0, ts.rows, y, accumulate);
}
// kmma / q6mma: the thread's outputs v[r][i] (row rb + 16 r + g + 8 (i / 2), token tb + 2 t + i % 2
// of its warp's 32 rows x 8 tokens, the mma accumulator layout) through the out tile to y.
template <bool MULTI>
__device__ __forceinline__ void frag_epilogue(float* out, int tid, const float (&v)[2][4],
                                              const QSegs& sg, int bx, int tok0, int n_tok,
                                              const TileSeg& ts, int accumulate) {
  __syncthreads();  // the out tile shares the f16 stages
  const int tid2 = step_tid(tid);
  const int lane = tid2 & 31, warp = tid2 >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp & 1) * 32, tb = (warp >> 1) * 8;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      out[(tb + 2 * t + (i & 1)) * (kMR + 1) + rb + 16 * r + g + 8 * (i >> 1)] = v[r][i];
  __syncthreads();
  store_out<MULTI>(out, tid2, sg, bx, tok0, n_tok, ts, accumulate);
}

// prep_kernel: the weight unit (tile bx, row r, block) of thread u < blk_end[2] * kMR * nb
// converts one weight block, the activation units after them one token's block.
template <GgmlType T>
__device__ __forceinline__ void weight_block_f16(const uint8_t* blk, uint32_t (&v)[16], float& d) {
  static_assert(TypeTraits<T>::kBlockBytes % 2 == 0, "blocks of whole 16-bit words");
  const auto* h = reinterpret_cast<const uint16_t*>(blk);  // rows are 8-byte aligned (ring_rows)
  d = __half2float(__ushort_as_half(h[0]));
  const auto word = [h](int i) {  // 16-bit words i, i + 1 as one little-endian word
    return static_cast<uint32_t>(h[i]) | (static_cast<uint32_t>(h[i + 1]) << 16);
  };
  constexpr uint32_t off = T == GgmlType::Q8_0 ? 128 : (T == GgmlType::Q4_0 ? 8 : 16);
  constexpr uint32_t bias2 = (0x6400u | off) * 0x10001u;
  if constexpr (T == GgmlType::Q8_0) {
#pragma unroll
    for (int i = 0; i < 8; ++i)  // elements 4i .. 4i + 3
      bytes_to_f16(word(1 + 2 * i) ^ 0x80808080u, bias2, v[2 * i], v[2 * i + 1]);
  } else {
    const int q0 = T == GgmlType::Q4_0 ? 1 : 3;  // Q5_0: d, qh (2 words), qs
    const uint32_t qh = T == GgmlType::Q5_0 ? word(1) : 0u;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // elements 16 hf + 4i .. + 3: nibble hf of qs[4i .. 4i + 3]
        uint32_t x = (hf != 0 ? word(q0 + 2 * i) >> 4 : word(q0 + 2 * i)) & 0x0F0F0F0Fu;
        if constexpr (T == GgmlType::Q5_0) x |= qg::q5_high_bits((qh >> (16 * hf + 4 * i)) & 0xFu);
        bytes_to_f16(x, bias2, v[8 * hf + 2 * i], v[8 * hf + 2 * i + 1]);
      }
  }
}

template <GgmlType T, bool MULTI>
__global__ void __launch_bounds__(kThreads)
    prep_kernel(const QSegs sg, int cols, const int8_t* __restrict__ aq,
                const float* __restrict__ ad, int n_tok, uint8_t* __restrict__ scratch,
                const PrepLayout pl) {
  constexpr int BB = TypeTraits<T>::kBlockBytes;
  const int nb = cols / 32;
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t wunits = static_cast<int64_t>(sg.blk_end[2]) * kMR * nb;
  uint32_t v[16];
  float d = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = 0u;
  if (u < wunits) {
    const int blk = static_cast<int>(u % nb);
    const int64_t tr = u / nb;  // row of the launch's tiles
    const int bx = static_cast<int>(tr / kMR), r = static_cast<int>(tr % kMR);
    const TileSeg ts = tile_seg<MULTI>(sg, bx);
    const int row = ts.row0 + r;
    if (row < ts.rows) {  // weights: no kernel writes them
      weight_block_f16<T>(
          ts.w + static_cast<size_t>(row) * sg.row_bytes + static_cast<size_t>(blk) * BB, v, d);
    }
    griddep_wait();  // the previous launch's tile may still read the scratch
    auto* dst = reinterpret_cast<uint4*>(scratch + pl.w) + (tr * cols + 32 * blk) / 8;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      dst[i] = make_uint4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    reinterpret_cast<float*>(scratch +
                             pl.dw)[(static_cast<int64_t>(bx) * nb + blk) * kMR + dw_slot(r)] = d;
    return;
  }
  const int64_t au = u - wunits;
  if (au >= static_cast<int64_t>(token_tiles(n_tok)) * kMT * nb) return;
  const int blk = static_cast<int>(au % nb), tok = static_cast<int>(au / nb);
  griddep_wait();  // the activation quants come from earlier kernels
  if (tok < n_tok) {
    // block word j (elements 2j, 2j + 1) = word j % 8 of half j / 8; word 4s + t goes to 4t + s
    uint32_t q[2][8];
    const int8_t* src = aq + static_cast<size_t>(tok) * cols + 32 * blk;
    quants_to_f16<8>(src, q[0]);
    quants_to_f16<8>(src + 16, q[1]);
#pragma unroll
    for (int j = 0; j < 16; ++j) v[4 * (j & 3) + (j >> 2)] = q[j >> 3][j & 7];
    d = ad[static_cast<size_t>(tok) * nb + blk];
  }
  auto* dst =
      reinterpret_cast<uint4*>(scratch + pl.x) + (static_cast<int64_t>(tok) * cols + 32 * blk) / 8;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    dst[i] = make_uint4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
  reinterpret_cast<float*>(
      scratch + pl.da)[(static_cast<int64_t>(tok / kMT) * nb + blk) * kMT + da_slot(tok % kMT)] = d;
}

// A thread's copies: the f16 operands of a step into an f16 stage (16-byte cp.async). Weight
// row tid / 4, pieces tid % 4 + 4j of its 256 bytes; token tid / 8, pieces tid % 8 and + 8; one
// 16-byte piece of the step's scales for the first kDw + kDa threads. The sources advance by a
// step's elements; the targets are shared-memory offsets within a stage.
struct Copier {
  static constexpr int kDw = kMR * kKB / 4, kDa = kMT * kKB / 4;  // 16-byte pieces of the scales
  const uint16_t* w;
  const uint16_t* x;
  const float* sc;  // nullptr: no scale piece
  int sc_step;      // floats a step of sc
  uint32_t wd, xd, scd;

  __device__ __forceinline__ Copier(int tid, const Prep& p, int cols) {
    static_assert(kMR * 4 == kThreads && kMT * 8 == kThreads, "the copies' thread maps");
    const int rr = tid >> 2, q0 = tid & 3, tt = tid >> 3, p0 = tid & 7;
    w = p.w + static_cast<size_t>(rr) * cols + 8 * q0;
    x = p.x + static_cast<size_t>(tt) * cols + 8 * p0;
    wd = static_cast<uint32_t>(offsetof(F16Stage, w)) +
         2u * static_cast<uint32_t>(rr * kWS + 8 * q0);
    xd = static_cast<uint32_t>(offsetof(F16Stage, x)) +
         2u * static_cast<uint32_t>(tt * kXS + 8 * p0);
    if (tid < kDw) {
      sc = p.dw + 4 * tid;
      sc_step = kMR * kKB;
      scd = static_cast<uint32_t>(offsetof(F16Stage, dw)) + 16u * static_cast<uint32_t>(tid);
    } else if (tid < kDw + kDa) {
      sc = p.da + 4 * (tid - kDw);
      sc_step = kMT * kKB;
      scd = static_cast<uint32_t>(offsetof(F16Stage, da)) + 16u * static_cast<uint32_t>(tid - kDw);
    } else {
      sc = nullptr;
      sc_step = 0;
      scd = 0;
    }
  }
  // step `step`'s pieces into the stage at shared address `stage`
  __device__ __forceinline__ void issue(int step, uint32_t stage) const {
    const uint16_t* ws = w + kKS * step;
#pragma unroll
    for (int j = 0; j < 4; ++j) cp_async16_sa(stage + wd + 64u * j, ws + 32 * j);
    const uint16_t* xs = x + kKS * step;
    cp_async16_sa(stage + xd, xs);
    cp_async16_sa(stage + xd + 128u, xs + 64);
    if (sc != nullptr) cp_async16_sa(stage + scd, sc + sc_step * step);
  }
};

template <bool MULTI>
__global__ void __launch_bounds__(kThreads, 2)
    qmma_kernel(const QSegs sg, int cols, const Prep prep, int n_tok, int accumulate) {
  extern __shared__ __align__(16) unsigned char qmma_smem[];
  auto& sm = *reinterpret_cast<Smem*>(qmma_smem);
  const int tid = static_cast<int>(threadIdx.x);
  const int bx = static_cast<int>(blockIdx.x);
  const TileSeg ts = tile_seg<MULTI>(sg, bx);
  const int tok0 = static_cast<int>(blockIdx.y) * kMT;
  const int nb = cols / 32;
  const int steps = nb / kKB;  // the launch guarantees nb % kKB == 0
  // this CTA's regions of the converted operands
  const Prep p{prep.w + static_cast<size_t>(bx) * kMR * cols,
               prep.dw + static_cast<size_t>(bx) * nb * kMR,
               prep.x + static_cast<size_t>(tok0) * cols,
               prep.da + static_cast<size_t>(blockIdx.y) * nb * kMT};

  MAcc acc;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int q = 0; q < kWQ; ++q)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc.v[r][q][j][k] = 0.0f;

  for (int k = tid; k < static_cast<int>(sizeof(sm.zx) / 16); k += kThreads)
    reinterpret_cast<uint4*>(sm.zx)[k] = make_uint4(0u, 0u, 0u, 0u);
  // B[k][n] of a slice is nonzero where k / 4 == n % 2: thread (g, t) holds k = 2t, 2t + 1 of
  // column g, so threads with t / 2 != g % 2 give zeros (their words from zero_words).
  const bool b_zero = ((tid & 3) >> 1) != (((tid & 31) >> 2) & 1);
  const Copier cp(tid, p, cols);
  const auto st0 = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.st[0]));
  griddep_wait();  // the operands come from prep_kernel (and y from earlier kernels)
  for (int k = 0; k < kRing - 1; ++k) {
    if (k < steps) cp.issue(k, st0 + k * static_cast<uint32_t>(sizeof(F16Stage)));
    cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kRing - 2>();  // this thread's copies of `step` have landed
    __syncthreads();             // everyone's; stage (step - 1) % kRing is free
    const int next = step + kRing - 1;
    if (next < steps)
      cp.issue(next, st0 + (next % kRing) * static_cast<uint32_t>(sizeof(F16Stage)));
    cp_async_commit();
    const F16Stage& s = sm.st[step % kRing];
    const uint32_t* xw = b_zero ? zero_words(sm) : reinterpret_cast<const uint32_t*>(s.x);
#pragma unroll 1
    for (int b = 0; b < kKB; ++b) compute_block(tid, s, xw, b, acc);
  }
  cp_async_wait<0>();
  __syncthreads();  // the out tile shares the f16 stages

  // combine (hsum_float_8, in the thread) into the out tile
  const int tid2 = step_tid(tid);
  const int lane = tid2 & 31, warp = tid2 >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp & 1) * 32, tb = (warp >> 1) * 4 * kWQ;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int q = 0; q < kWQ; ++q) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sm.out[(tb + 4 * q + t) * (kMR + 1) + rb + 16 * r + 8 * j + g] = qm::hsum8(acc.v[r][q][j]);
      }
    }
  }
  __syncthreads();
  store_out<MULTI>(sm.out, tid2, sg, bx, tok0, n_tok, ts, accumulate);
}

}  // namespace mma0

// ---- Q4_K in the repacked order (Q4KRep) on the tensor cores (big prompt batches) ----
//
// dot_q4_k_repack's integers are whole 64-element pairs: isb = sc[2p] s0 + sc[2p+1] s1 (s0, s1
// the dots of the pair's two sub-blocks) and msb = m[2p] (bsums of sub-block 2p) + m[2p+1]
// (bsums of 2p+1) = the sum over the pair's 64 elements of m[sub] * y. Both are one mma
// chain each with no lane structure: A = scale * q (<= 15 * 63 = 945: exact in f16) or the
// sub-block's min (<= 63), B = the activation quants, four mma.m16n8k16 over the pair
// accumulating in f32 (every partial sum an integer below 2^23: exact in any order), so the f32
// result is float(isb) / float(msb) exactly. Gemm tokens (batch index < gemm_end) then step
// acc = fma(float(isb), d * d_a, acc), accm = fma(float(msb), dmin * d_a, accm) per pair; gemv
// tokens add the pairs' integers (exact conversions back to int) and step once per
// super-block. Result acc - accm. Two fma a pair an output against the lane flavours' eight a
// block: the tile is bound by its mma and loads, not by the float chains.
//
// CTA: 256 threads, kMR rows x kMT tokens (warps 2 x 4, each 32 rows x 8 tokens: two m16 row
// groups, one n8 token group); steps of half a super-block (two pairs). The raw bytes (each
// row's 16-byte super-block header and the half's 64 qs bytes, the activation quants, d_a) come
// kRawRing - 1 steps ahead through cp.async; each step the CTA converts the next step's raw
// bytes into one of two f16 stages while its mma run on the other.
namespace kmma {
// mma0's tile geometry and helpers (kMR, kMT, ldmatrix_x4, mma16, frag_epilogue, ...); this
// namespace's own names (kKS, convert, ...) hide mma0's.
using namespace mma0;             // NOLINT(google-build-using-namespace)
constexpr int kKS = 128;          // elements a step: two pairs
constexpr int kWS = kKS + 8;      // halves a weight row (ldmatrix's 8 rows: distinct bank quads)
constexpr int kXW = kKS / 2 + 4;  // words a token row (a quarter warp's B loads: distinct banks)
constexpr int kRawRow = 80;       // bytes a weight row a step: header (16) + the half's qs (64)
constexpr int kRawRing = 3;

struct F16Stage {
  alignas(16) uint16_t w[kMR * kWS];  // scale * q, element order
  // activations: word v of pair j (elements 64j + 2v, + 1), v = 8c + 4h + t, at 32j + 8t + 2c + h:
  // a thread's B words (k = 2t.. and 2t + 8.. of the pair's four k16 chunks) are 8 adjacent words
  alignas(16) uint32_t x[kMT * kXW];
  uint32_t mw[4 * kMR];    // [sub-block of the step][row]: the min as f16x2 (m, m)
  float dw[kMR], dm[kMR];  // f16 d and dmin of the rows' super-block
  float da[kMT];           // Q8_K d of the tokens' super-block
};
struct RawStage {
  alignas(16) uint8_t w[kMR * kRawRow];
  alignas(16) int8_t x[kMT * kKS];
  alignas(16) float d[kMT];
};
struct Smem {
  RawStage raw[kRawRing];
  union {
    F16Stage st[2];
    float out[kMT * (kMR + 1)];  // the result tile [token][row], after the last step
  };
};

// The raw bytes of step `step` (super-block step / 2, half step % 2) into r.
__device__ __forceinline__ void issue(int tid, int step, const uint8_t* __restrict__ w, int rows,
                                      size_t row_bytes, int row0, const int8_t* __restrict__ aq,
                                      const float* __restrict__ ad, int cols, int tok0, int n_tok,
                                      RawStage& r) {
  const int sb = step >> 1, hh = step & 1;
  for (int n = tid; n < kMR * 5; n += kThreads) {  // 16-byte pieces: header, then 4 of qs
    const int row = n / 5, k = n - 5 * row;
    const bool in = row0 + row < rows;
    const size_t off = static_cast<size_t>(sb) * 144 + (k == 0 ? 0 : 16 + 64 * hh + 16 * (k - 1));
    cp_async16(r.w + row * kRawRow + 16 * k,
               w + static_cast<size_t>(in ? row0 + row : 0) * row_bytes + off, in ? 16 : 0);
  }
  static_assert(kKS == mma0::kKS, "the quants of a step as mma0's");
  mma0::issue_quants(tid, step, aq, cols, tok0, n_tok, r.x);
  if (tid < kMT) {
    const bool in = tok0 + tid < n_tok;
    cp_async4(r.d + tid, ad + static_cast<size_t>(in ? tok0 + tid : 0) * (cols / 256) + sb,
              in ? 4 : 0);
  }
}

// A raw stage of half hh into an f16 stage: weight units (row, pair, nibble, 16 bytes) tid and
// tid + kThreads, the min of (row tid / 4, sub-block tid % 4), d and dmin of row tid < kMR,
// one 16-quant activation piece, d_a of token tid < kMT.
__device__ __forceinline__ void convert(int tid, int hh, const RawStage& r, F16Stage& s) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int u = tid + k * kThreads;
    const int row = u >> 3, j = (u >> 2) & 1, hs = (u >> 1) & 1, e = u & 1;
    const uint8_t* rw = r.w + row * kRawRow;
    const uint32_t hw[3] = {*reinterpret_cast<const uint32_t*>(rw + 4),
                            *reinterpret_cast<const uint32_t*>(rw + 8),
                            *reinterpret_cast<const uint32_t*>(rw + 12)};
    int sc, mn;
    qm::q4k_scale_min_w(4 * hh + 2 * j + hs, hw, sc, mn);
    const uint32_t sc2 = mma0::f16x2_ints(sc, sc);
    const uint4 q = *reinterpret_cast<const uint4*>(rw + 16 + 32 * j + 16 * e);
    const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
    uint32_t v[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = (hs != 0 ? qw[i] >> 4 : qw[i]) & 0x0F0F0F0Fu;
      uint32_t lo, hi;
      bytes_to_f16(x, 0x64006400u, lo, hi);                                  // q, exactly
      asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(v[2 * i]) : "r"(lo), "r"(sc2));  // <= 945: exact
      asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(v[2 * i + 1]) : "r"(hi), "r"(sc2));
    }
    // byte l of the 16: element 16e + l of sub-block 2j + hs, i.e. 64j + 32hs + 16e + l
    uint4* dst = reinterpret_cast<uint4*>(s.w + row * kWS + 64 * j + 32 * hs + 16 * e);
    dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
    dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
  }
  {
    static_assert(kMR * 4 == kThreads, "one (row, sub-block) a thread");
    const int row = tid >> 2, s4 = tid & 3;
    const uint8_t* rw = r.w + row * kRawRow;
    const uint32_t hw[3] = {*reinterpret_cast<const uint32_t*>(rw + 4),
                            *reinterpret_cast<const uint32_t*>(rw + 8),
                            *reinterpret_cast<const uint32_t*>(rw + 12)};
    int sc, mn;
    qm::q4k_scale_min_w(4 * hh + s4, hw, sc, mn);
    s.mw[s4 * kMR + row] = mma0::f16x2_ints(mn, mn);
  }
  // d, dmin and d_a: read by scale_products in a super-block's first step (stage 0) only
  if (hh == 0 && tid < kMR) {
    const uint32_t h = *reinterpret_cast<const uint32_t*>(r.w + tid * kRawRow);
    s.dw[tid] = __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xFFFFu)));
    s.dm[tid] = __half2float(__ushort_as_half(static_cast<unsigned short>(h >> 16)));
  }
  {  // activations: 16 quants (words 8m .. 8m + 7 of the token's step) a thread
    const int tok = tid >> 3, m = tid & 7, j = m >> 2, c = m & 3;
    uint32_t v[8];                              // word 8c + i of pair j
    mma0::quants_to_f16<8>(r.x + 16 * tid, v);  // == tok * kKS + 16 m
    // word 8c + 4h + t at 32j + 8t + 2c + h: (v[t], v[t + 4]) at 32j + 8t + 2c
    uint2* dst = reinterpret_cast<uint2*>(s.x + tok * kXW + 32 * j + 2 * c);
#pragma unroll
    for (int t = 0; t < 4; ++t) dst[4 * t] = make_uint2(v[t], v[t + 4]);
  }
  if (hh == 0 && tid < kMT) s.da[tid] = r.d[tid];
}

// Output i of row group r: row rb + 16r + g + 8 (i / 2), token tb + 2t + i % 2.
struct KAcc {
  float acc[2][4], accm[2][4];
  int isum[2][4], imin[2][4];
  float dd[2][4], dm[2][4];  // the super-block's f16(d) * d_a and f16(dmin) * d_a
};

// dot_q4_k_repack's scale products dd = f16(d) * d_a, dm = f16(dmin) * d_a of the thread's
// outputs, from the first step of a super-block (both steps hold the same d, dmin and d_a).
__device__ __forceinline__ void scale_products(int tid, const F16Stage& s, KAcc& k) {
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp & 1) * 32, tb = (warp >> 1) * 8;
  const float da2[2] = {s.da[tb + 2 * t], s.da[tb + 2 * t + 1]};
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k.dd[r][i] = s.dw[rb + 16 * r + g + 8 * (i >> 1)] * da2[i & 1];
      k.dm[r][i] = s.dm[rb + 16 * r + g + 8 * (i >> 1)] * da2[i & 1];
    }
}

// Pair j of an f16 stage: isb and msb of the thread's 8 outputs, then the chain steps (gemm
// tokens) or the integer sums (gemv tokens; end_sb: the super-block's last pair, their step).
__device__ __forceinline__ void compute_pair(int tid, const F16Stage& s, int j, bool end_sb,
                                             bool all_gemm, uint32_t gmask, KAcc& k) {
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp & 1) * 32, tb = (warp >> 1) * 8;
  const uint4 b0 = *reinterpret_cast<const uint4*>(s.x + (tb + g) * kXW + 32 * j + 8 * t);
  const uint4 b1 = *reinterpret_cast<const uint4*>(s.x + (tb + g) * kXW + 32 * j + 8 * t + 4);
  const uint32_t bw[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};  // chunk c: 2c, 2c+1
  const uint32_t abase =
      static_cast<uint32_t>(__cvta_generic_to_shared(s.w)) +
      2u * static_cast<uint32_t>((rb + (lane & 7) + 8 * ((lane >> 3) & 1)) * kWS + 8 * (lane >> 4) +
                                 64 * j);
  float c[2][4], m[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[r][i] = m[r][i] = 0.0f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // sub-block 2j + h: chunks 2h, 2h + 1
      const uint32_t mg = s.mw[(2 * j + h) * kMR + rb + 16 * r + g];
      const uint32_t mg8 = s.mw[(2 * j + h) * kMR + rb + 16 * r + g + 8];
      const uint32_t am[4] = {mg, mg8, mg, mg8};
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int ch = 2 * h + cc;
        uint32_t a[4];
        ldmatrix_x4(abase + 2u * static_cast<uint32_t>(16 * r * kWS + 16 * ch), a);
        mma16(a, bw[2 * ch], bw[2 * ch + 1], c[r]);
        mma16(am, bw[2 * ch], bw[2 * ch + 1], m[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float dd = k.dd[r][i], dm = k.dm[r][i];
      if (all_gemm || ((gmask >> (i & 1)) & 1u) != 0) {
        k.acc[r][i] = qm::fma_(c[r][i], dd, k.acc[r][i]);
        k.accm[r][i] = qm::fma_(m[r][i], dm, k.accm[r][i]);
      } else {
        k.isum[r][i] += __float2int_rn(c[r][i]);  // integers below 2^23: exact
        k.imin[r][i] += __float2int_rn(m[r][i]);
        if (end_sb) {
          k.acc[r][i] = qm::fma_(__int2float_rn(k.isum[r][i]), dd, k.acc[r][i]);
          k.accm[r][i] = qm::fma_(__int2float_rn(k.imin[r][i]), dm, k.accm[r][i]);
          k.isum[r][i] = k.imin[r][i] = 0;
        }
      }
    }
  }
}

template <bool MULTI>
__global__ void __launch_bounds__(kThreads, 2)
    kmma_kernel(const QSegs sg, int cols, const int8_t* __restrict__ aq,
                const float* __restrict__ ad, int n_tok, int gemm_end, int accumulate) {
  extern __shared__ __align__(16) unsigned char kmma_smem[];
  auto& sm = *reinterpret_cast<Smem*>(kmma_smem);
  const int tid = static_cast<int>(threadIdx.x);
  const int bx = static_cast<int>(blockIdx.x);
  const TileSeg ts = tile_seg<MULTI>(sg, bx);
  const uint8_t* __restrict__ w = ts.w;
  const int rows = ts.rows, row0 = ts.row0;
  const int tok0 = static_cast<int>(blockIdx.y) * kMT;
  const int steps = 2 * (cols / 256);
  const bool all_gemm = tok0 + kMT <= gemm_end;
  uint32_t gmask = 0;  // the thread's tokens tb + 2t, + 1 below gemm_end
  {
    const int warp = tid >> 5, t = tid & 3, tb = (warp >> 1) * 8;
    for (int i = 0; i < 2; ++i)
      if (tok0 + tb + 2 * t + i < gemm_end) gmask |= 1u << i;
  }
  KAcc k;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k.acc[r][i] = k.accm[r][i] = 0.0f;
      k.isum[r][i] = k.imin[r][i] = 0;
    }
  griddep_wait();  // activations (and y) come from earlier kernels
  for (int s = 0; s < kRawRing - 1; ++s) {
    if (s < steps) issue(tid, s, w, rows, sg.row_bytes, row0, aq, ad, cols, tok0, n_tok, sm.raw[s]);
    cp_async_commit();
  }
  cp_async_wait<kRawRing - 2>();
  __syncthreads();
  convert(tid, 0, sm.raw[0], sm.st[0]);
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kRawRing - 3>();  // this thread's copies of step + 1 have landed
    __syncthreads();  // everyone's; f16 stage step & 1 is converted; stage (step + 1) & 1 and raw
                      // slot (step - 1) % kRawRing are free
    const int next = step + kRawRing - 1;
    if (next < steps) {
      issue(step_tid(tid), next, w, rows, sg.row_bytes, row0, aq, ad, cols, tok0, n_tok,
            sm.raw[next % kRawRing]);
    }
    cp_async_commit();
    if (step + 1 < steps)
      convert(step_tid(tid), (step + 1) & 1, sm.raw[(step + 1) % kRawRing], sm.st[(step + 1) & 1]);
    const F16Stage& s = sm.st[step & 1];
    if ((step & 1) == 0) scale_products(tid, s, k);
    compute_pair(tid, s, 0, false, all_gemm, gmask, k);
    compute_pair(tid, s, 1, (step & 1) != 0, all_gemm, gmask, k);
  }
  float v[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      v[r][i] = qg::final_value<Flavor::Q4KRep>(k.acc[r][i], k.accm[r][i]);
  frag_epilogue<MULTI>(sm.out, tid, v, sg, bx, tok0, n_tok, ts, accumulate);
}

}  // namespace kmma

// ---- Q6_K on the tensor cores (q6mma; big prompt batches) ----
//
// dot_q6_k's lane integer L (L < 8) of a super-block: sum over its 8 units g of sc[2g + L / 4]
// * dot(q[32g + 4L ..+3], y[..]) minus 32 (bs[2L] sc[2L] + bs[2L + 1] sc[2L + 1]) (q the
// unsigned 6-bit quants, sc the int8 scales, bs the Q8_K sums of 16 quants), then acc[L] =
// fma(d_a * d_w, float(lane), acc[L]) super-block after super-block, and hsum_float_8.
// The k dimension is permuted so that a lane's 32 elements are contiguous: within a step (a
// quarter super-block: lanes 2q, 2q + 1), k = 32 l + 4 g + k4 holds element 32 g + 4 (2q + l)
// + k4. sc * q (up to 128 * 63) does not fit f16's 11 bits, so the scale is split, sc = 16 a +
// b (b = sc & 15, a = sc >> 4): A_lo = b q <= 945 and A_hi = a q in [-504, 441] are exact in
// f16, and a lane is two chains of mma.m16n8k16 over its 32 k (lo, hi), the hi chain plus one
// mma.m16n8k8 whose only nonzero k are 0 and 1 (A = -2 sc[2L], -2 sc[2L + 1]; B = bs[2L],
// bs[2L + 1]): hi = sum a q y - 2 (bs sc terms), lo = sum b q y, lane = 16 hi + lo. Every
// product and partial sum is an integer of magnitude below 2^22 (hi 3.2e6, lo 3.9e6), so the
// f32 accumulation is exact in any order. The chains start from biases F_h = 2^23 + 4980736
// and F_l = 1.5 * 2^23 (every partial sum then stays in [2^23, 2^24), where f32 steps by 1),
// chosen so that 16 * bits(F_h + hi) + bits(F_l + lo) == 16 hi + lo (mod 2^32): 17 * 0x4B000000
// + 16 * 4980736 + 4194304 == 2^32. So one integer multiply-add gives the lane integer, then
// the reference's conversion and fma.
//
// CTA: as kmma (256 threads, kMR rows x kMT tokens, warps 2 x 4 of 32 rows x 8 tokens), four
// steps a super-block. Q6_K rows (210-byte super-blocks) are only 2-byte aligned: the raw
// copy of a row's super-block is the 16-byte-aligned window around it (14 pieces; in a row's
// last super-block the piece crossing the row's end is read with plain 2-byte loads, since the
// row may end the allocation, and the window's bytes past the row are never used), read at the
// row's offset in it; one raw slot a super-block, two slots (a super-block's copies are issued
// when the previous one starts: three steps of lead).
namespace q6mma {
// mma0's tile geometry and helpers (kMR, kMT, ldmatrix_x4, mma16, frag_epilogue, ...); this
// namespace's own names (kKS, convert, ...) hide mma0's.
using namespace mma0;                  // NOLINT(google-build-using-namespace)
constexpr int kBlock = 210;            // bytes a super-block
constexpr int kWin = 224;              // bytes of a row's window (14 pieces)
constexpr int kWS = 64 + 8;            // halves a weight row of a step (ldmatrix: distinct quads)
constexpr int kXW = 32 + 16;           // words a token row of a step (B loads: distinct banks)
constexpr uint32_t kFh = 0x4B4C0000u;  // bits of 2^23 + 4980736
constexpr uint32_t kFl = 0x4B400000u;  // bits of 1.5 * 2^23
static_assert(17u * 0x4B000000u + 16u * (kFh - 0x4B000000u) + (kFl - 0x4B000000u) == 0u,
              "16 * bits(hi) + bits(lo) is the lane integer");

struct F16Stage {
  alignas(16) uint16_t lo[kMR * kWS];  // b * q, k order of the step
  alignas(16) uint16_t hi[kMR * kWS];  // a * q
  // activations: word (l, c, h, t) (k = 32 l + 16 c + 8 h + 2 t, + 1) at 16 l + 4 t + 2 c + h:
  // a thread's four B words of lane l are one 16-byte load
  alignas(16) uint32_t x[kMT * kXW];
  uint32_t aw[2 * kMR];  // [l][row]: (-2 sc[2L], -2 sc[2L + 1]) as f16x2
  uint32_t bw[2 * kMT];  // [l][token]: (bs[2L], bs[2L + 1]) as f16x2
  float dw[kMR];         // f16 d of the rows' super-block
  float da[kMT];         // Q8_K d of the tokens' super-block
};
struct RawStage {
  alignas(16) uint8_t w[kMR * kWin];
  alignas(16) int8_t x[kMT * 256];
  alignas(16) int32_t bs[kMT * 16];
  alignas(16) float d[kMT];
};
struct Smem {
  RawStage raw[2];
  union {
    F16Stage st[2];
    float out[kMT * (kMR + 1)];  // the result tile [token][row], after the last step
  };
};

// The raw bytes of super-block sb into r: rows' windows, the tokens' quants, bsums and d.
__device__ __forceinline__ void issue(int tid, int sb, const uint8_t* __restrict__ w, int rows,
                                      size_t row_bytes, int row0, const int8_t* __restrict__ aq,
                                      const float* __restrict__ ad, const int32_t* __restrict__ abs,
                                      int cols, int tok0, int n_tok, RawStage& r) {
  for (int n = tid; n < kMR * (kWin / 16); n += kThreads) {
    const int row = n / (kWin / 16), k = n - (kWin / 16) * row;
    const bool in = row0 + row < rows;
    const size_t rs = static_cast<size_t>(in ? row0 + row : 0) * row_bytes;  // row start
    const size_t start = rs + static_cast<size_t>(sb) * kBlock;
    const size_t piece = (start & ~size_t{15}) + 16 * static_cast<size_t>(k);
    const size_t end = rs + row_bytes;
    const int nb = !in || piece >= end ? 0 : static_cast<int>(end - piece < 16 ? end - piece : 16);
    if (nb == 16 || nb == 0) {
      cp_async16(r.w + row * kWin + 16 * k, w + (nb > 0 ? piece : rs), nb);
    } else {  // a row's last super-block: its bytes only (the row may end the allocation)
      const auto* src = reinterpret_cast<const uint16_t*>(w + piece);
      auto* dst = reinterpret_cast<uint16_t*>(r.w + row * kWin + 16 * k);
      for (int i = 0; i < nb / 2; ++i) dst[i] = __ldg(src + i);
    }
  }
  for (int n = tid; n < kMT * 16; n += kThreads) {  // 16-byte pieces of the quants
    const int t = n >> 4;
    const bool in = tok0 + t < n_tok;
    cp_async16(r.x + 16 * n,
               aq + static_cast<size_t>(in ? tok0 + t : 0) * cols + 256 * sb + 16 * (n & 15),
               in ? 16 : 0);
  }
  if (tid < kMT * 4) {  // bsums: 4 pieces a token
    const int t = tid >> 2;
    const bool in = tok0 + t < n_tok;
    cp_async16(r.bs + 4 * tid,
               abs + static_cast<size_t>(in ? tok0 + t : 0) * (cols / 16) + 16 * sb + 4 * (tid & 3),
               in ? 16 : 0);
  } else if (tid < kMT * 5) {
    const int t = tid - kMT * 4;
    const bool in = tok0 + t < n_tok;
    cp_async4(r.d + t, ad + static_cast<size_t>(in ? tok0 + t : 0) * (cols / 256) + sb, in ? 4 : 0);
  }
}

// Where row `row` (of the tile) starts in its window of super-block sb: (its byte offset in the
// weight) mod 16 (the weight is 16-byte aligned), in 32-bit arithmetic (exact mod 16).
__device__ __forceinline__ int win_off(int row, int sb, int row0, uint32_t rb15) {
  return row * kWin +
         static_cast<int>(
             (static_cast<uint32_t>(row0 + row) * rb15 + static_cast<uint32_t>(sb) * kBlock) & 15u);
}

// Quarter q of super-block sb (raw slot r) into an f16 stage. Weights: row tid / 4, units 2j and
// 2j + 1 (j = tid % 4), 8 elements of each (32 g + 8 q ..); the activations of (token tid / 8,
// unit tid % 8); aw of (row, l) for tid < 128, bw of (token, l) for tid < 64, and at q == 0
// (the only quarter that reads them) dw / da.
__device__ __forceinline__ void convert(int tid, int q, int sb, int row0, uint32_t rb15,
                                        const RawStage& r, F16Stage& s) {
  {
    const int row = tid >> 2, j = tid & 3;
    const int o = win_off(row, sb, row0, rb15);
    uint32_t l0[2], l1[2], h[2], scw[1];
    qg::sw_words<2>(r.w, o + 64 * (j >> 1) + 8 * q, l0);       // unit 2j's ql bytes
    qg::sw_words<2>(r.w, o + 64 * (j >> 1) + 32 + 8 * q, l1);  // unit 2j + 1's
    qg::sw_words<2>(r.w, o + 128 + 32 * (j >> 1) + 8 * q, h);  // both units' qh bytes
    qg::sw_words<1>(r.w, o + 192 + 4 * j, scw);                // sc[4j .. 4j + 3]
    const int ns = 4 * (j & 1), hs = 4 * (j & 1);
    uint32_t vlo[2][4], vhi[2][4];  // [lane l][unit 2j k01, k23, unit 2j + 1 k01, k23]
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const uint32_t* ql = u == 0 ? l0 : l1;
      // sc[2g + q / 2] with g = 2j + u: byte 2u + q / 2 of scw
      const int sc = static_cast<int8_t>(static_cast<uint8_t>(scw[0] >> (8 * (2 * u + (q >> 1)))));
      const uint32_t b2 = mma0::f16x2_ints(sc & 15, sc & 15),
                     a2 = mma0::f16x2_ints(sc >> 4, sc >> 4);
#pragma unroll
      for (int l = 0; l < 2; ++l) {  // word l: elements 4l .. 4l + 3 of the 8 (lane 2q + l)
        const uint32_t x =
            ((ql[l] >> ns) & 0x0F0F0F0Fu) | (((h[l] >> (hs + 2 * u)) & 0x03030303u) << 4);
        uint32_t f01, f23;
        bytes_to_f16(x, 0x64006400u, f01, f23);  // q, exactly
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(vlo[l][2 * u]) : "r"(f01), "r"(b2));
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(vlo[l][2 * u + 1]) : "r"(f23), "r"(b2));
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(vhi[l][2 * u]) : "r"(f01), "r"(a2));
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(vhi[l][2 * u + 1]) : "r"(f23), "r"(a2));
      }
    }
#pragma unroll
    for (int l = 0; l < 2; ++l) {  // k = 32 l + 4 g + k4: units 2j, 2j + 1 are halves 32 l + 8 j ..
      *reinterpret_cast<uint4*>(s.lo + row * kWS + 32 * l + 8 * j) =
          make_uint4(vlo[l][0], vlo[l][1], vlo[l][2], vlo[l][3]);
      *reinterpret_cast<uint4*>(s.hi + row * kWS + 32 * l + 8 * j) =
          make_uint4(vhi[l][0], vhi[l][1], vhi[l][2], vhi[l][3]);
    }
  }
  {  // activations: token tid / 8, unit g = tid % 8: elements 32 g + 8 q .. + 7
    const int tok = tid >> 3, g = tid & 7;
    uint32_t v[4];  // [lane l][k pair p]
    mma0::quants_to_f16<4>(r.x + tok * 256 + 32 * g + 8 * q, v);
    // k = 32 l + 4 g + 2 p = 32 l + 16 c + 8 h + 2 t: c = g / 4, h = (g / 2) % 2, t = 2 (g % 2) + p
    uint32_t* dst = s.x + tok * kXW + 8 * (g & 1) + 2 * (g >> 2) + ((g >> 1) & 1);
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      dst[16 * l] = v[2 * l];
      dst[16 * l + 4] = v[2 * l + 1];
    }
  }
  if (tid < 2 * kMR) {  // aw: row tid / 2, lane 2q + tid % 2
    const int row = tid >> 1, L = 2 * q + (tid & 1);
    const int o = win_off(row, sb, row0, rb15);
    const uint32_t p = qg::sw16(r.w, o + 192 + 2 * L);
    s.aw[(tid & 1) * kMR + row] =
        mma0::f16x2_ints(-2 * static_cast<int8_t>(p & 0xFF), -2 * static_cast<int8_t>(p >> 8));
  } else if (tid < 2 * kMR + 2 * kMT) {  // bw: token, lane 2q + l
    const int n = tid - 2 * kMR, tok = n >> 1, L = 2 * q + (n & 1);
    s.bw[(n & 1) * kMT + tok] =
        mma0::f16x2_ints(r.bs[tok * 16 + 2 * L], r.bs[tok * 16 + 2 * L + 1]);
  } else if (q == 0 && tid < 2 * kMR + 2 * kMT + kMT) {  // d_a, d_w: read at quarter 0 only
    const int tok = tid - 2 * kMR - 2 * kMT;
    s.da[tok] = r.d[tok];
  }
  if (q == 0 && tid >= kThreads - kMR) {  // dw: the last kMR threads (others' extra work above)
    const int row = tid - (kThreads - kMR);
    const int o = win_off(row, sb, row0, rb15);
    s.dw[row] = __half2float(__ushort_as_half(static_cast<unsigned short>(qg::sw16(r.w, o + 208))));
  }
}

// acc[r][i][L]: output i of row group r (row rb + 16 r + g + 8 (i / 2), token tb + 2 t + i % 2),
// lane chain L.
struct QAcc {
  float v[2][4][8];
};

// Quarter Q of a super-block (lanes 2Q, 2Q + 1) from an f16 stage; dd: d_a * d_w of the
// thread's outputs for this super-block.
template <int Q>
__device__ __forceinline__ void compute(int tid, const F16Stage& s, const float (&dd)[2][4],
                                        QAcc& acc) {
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp & 1) * 32, tb = (warp >> 1) * 8;
  const uint32_t lo_base =
      static_cast<uint32_t>(__cvta_generic_to_shared(s.lo)) +
      2u * static_cast<uint32_t>((rb + (lane & 7) + 8 * ((lane >> 3) & 1)) * kWS + 8 * (lane >> 4));
  const uint32_t hi_base = lo_base + static_cast<uint32_t>(sizeof(s.lo));
#pragma unroll
  for (int l = 0; l < 2; ++l) {
    const uint4 b = *reinterpret_cast<const uint4*>(s.x + (tb + g) * kXW + 16 * l + 4 * t);
    const uint32_t b8 = t == 0 ? s.bw[l * kMT + tb + g] : 0u;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t off = 2u * static_cast<uint32_t>(16 * r * kWS + 32 * l);
      uint32_t a[4];
      float ch[4], cl[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ch[i] = __uint_as_float(kFh);
        cl[i] = __uint_as_float(kFl);
      }
      ldmatrix_x4(hi_base + off, a);
      mma16(a, b.x, b.y, ch);
      ldmatrix_x4(hi_base + off + 32u, a);
      mma16(a, b.z, b.w, ch);
      mma8(s.aw[l * kMR + rb + 16 * r + g], s.aw[l * kMR + rb + 16 * r + g + 8], b8, ch);
      ldmatrix_x4(lo_base + off, a);
      mma16(a, b.x, b.y, cl);
      ldmatrix_x4(lo_base + off + 32u, a);
      mma16(a, b.z, b.w, cl);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int lane_int =
            static_cast<int>(16u * __float_as_uint(ch[i]) + __float_as_uint(cl[i]));
        float& c = acc.v[r][i][2 * Q + l];
        c = qm::fma_(dd[r][i], static_cast<float>(lane_int), c);
      }
    }
  }
}

template <bool MULTI>
__global__ void __launch_bounds__(kThreads, 2)
    q6mma_kernel(const QSegs sg, int cols, const int8_t* __restrict__ aq,
                 const float* __restrict__ ad, const int32_t* __restrict__ abs, int n_tok,
                 int accumulate) {
  extern __shared__ __align__(16) unsigned char q6mma_smem[];
  auto& sm = *reinterpret_cast<Smem*>(q6mma_smem);
  const int tid = static_cast<int>(threadIdx.x);
  const int bx = static_cast<int>(blockIdx.x);
  const TileSeg ts = tile_seg<MULTI>(sg, bx);
  const uint8_t* __restrict__ w = ts.w;
  const int rows = ts.rows, row0 = ts.row0;
  const int tok0 = static_cast<int>(blockIdx.y) * kMT;
  const int nsb = cols / 256;
  QAcc acc;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int L = 0; L < 8; ++L) acc.v[r][i][L] = 0.0f;
  griddep_wait();  // activations (and y) come from earlier kernels
  issue(tid, 0, w, rows, sg.row_bytes, row0, aq, ad, abs, cols, tok0, n_tok, sm.raw[0]);
  cp_async_wait_all();
  __syncthreads();
  const uint32_t rb15 = static_cast<uint32_t>(sg.row_bytes & 15);
  convert(tid, 0, 0, row0, rb15, sm.raw[0], sm.st[0]);
  // One iteration a step (quarter Q of super-block sb, f16 stage Q % 2): wait, barrier (stage
  // Q % 2 converted; the other stage and, at Q == 0, raw slot (sb + 1) % 2 free), issue sb + 1
  // at Q == 0, convert the next step into the other stage, the mma of this one.
  const auto step = [&](auto qc, int sb, float(&dd)[2][4]) {
    constexpr int Q = decltype(qc)::value;
    cp_async_wait<2>();  // the group issued three steps ago (super-block sb's, at Q == 3)
    __syncthreads();
    if constexpr (Q == 0) {
      if (sb + 1 < nsb) {
        issue(step_tid(tid), sb + 1, w, rows, sg.row_bytes, row0, aq, ad, abs, cols, tok0, n_tok,
              sm.raw[(sb + 1) & 1]);
      }
    }
    cp_async_commit();
    if (Q < 3 || sb + 1 < nsb) {
      convert(step_tid(tid), (Q + 1) & 3, Q == 3 ? sb + 1 : sb, row0, rb15,
              sm.raw[(Q == 3 ? sb + 1 : sb) & 1], sm.st[(Q + 1) & 1]);
    }
    const F16Stage& s = sm.st[Q & 1];
    if constexpr (Q == 0) {  // d_a * d_w (dot_q6_k's d) of the thread's outputs
      const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
      const int rb = (warp & 1) * 32, tb = (warp >> 1) * 8;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          dd[r][i] = s.da[tb + 2 * t + (i & 1)] * s.dw[rb + 16 * r + g + 8 * (i >> 1)];
    }
    compute<Q>(tid, s, dd, acc);
  };
  for (int sb = 0; sb < nsb; ++sb) {
    float dd[2][4];
    step(std::integral_constant<int, 0>{}, sb, dd);
    step(std::integral_constant<int, 1>{}, sb, dd);
    step(std::integral_constant<int, 2>{}, sb, dd);
    step(std::integral_constant<int, 3>{}, sb, dd);
  }
  float v[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) v[r][i] = qm::hsum8(acc.v[r][i]);
  frag_epilogue<MULTI>(sm.out, tid, v, sg, bx, tok0, n_tok, ts, accumulate);
}

}  // namespace q6mma

// Whether a tile prefetches the next step into registers by default (PF): where the Stage
// registers fit beside the chains without dropping below 2 CTAs per SM.
template <GgmlType T, Flavor FL, int TT>
constexpr bool prefetch_default() {
  return true;  // the same register counts as without (ptxas), the loads overlap the chains
}

// The weights of one launch (rows 0 for the unused slots) and their width.
struct Launch {
  QSegs sg;  // blk_end: set by segs() for the tile height the launch takes
  int cols;
  int n;  // weights
  // The segments with blk_end set for br-row tiles (blk_end[2]: the CTA columns).
  QSegs segs(int br) const {
    QSegs s = sg;
    int t = 0;
    for (int i = 0; i < 3; ++i) {
      t += (s.rows[i] + br - 1) / br;
      s.blk_end[i] = t;
    }
    return s;
  }
  int tiles(int br) const { return segs(br).blk_end[2]; }
};

template <GgmlType T, Flavor FL, int TT, bool RING, int BR>
void launch_kernel(bool pf, const Launch& l, const ActBuf& a, int n_tok, int gemm_end,
                   bool accumulate, cudaStream_t stream) {
  using G = Geo<FL, TT, BR>;
  const QSegs sg = l.segs(BR);
  const dim3 grid(static_cast<unsigned>(sg.blk_end[2]),
                  static_cast<unsigned>((n_tok + G::BT - 1) / G::BT));
  constexpr size_t kSmem = smem_bytes<T, FL, TT, RING, BR>();
  constexpr size_t kPadded = one_block_per_sm_smem(kSmem);
  static const bool attr_set = [] {
    for (auto* k : {qgemm_kernel<T, FL, TT, true, RING, false, BR>,
                    qgemm_kernel<T, FL, TT, false, RING, false, BR>,
                    qgemm_kernel<T, FL, TT, true, RING, true, BR>,
                    qgemm_kernel<T, FL, TT, false, RING, true, BR>}) {
      CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kPadded)));
    }
    return true;
  }();
  // A grid no larger than the SMs runs one block an SM (launch.cuh; H100, prompt tok/s: Q8_0
  // 16 tokens +12%, Q4_K_M 64 tokens +6%, the other lengths alike; v18).
  (void)attr_set;
  auto* kernel = l.n > 1 ? (pf ? qgemm_kernel<T, FL, TT, true, RING, true, BR>
                               : qgemm_kernel<T, FL, TT, false, RING, true, BR>)
                         : (pf ? qgemm_kernel<T, FL, TT, true, RING, false, BR>
                               : qgemm_kernel<T, FL, TT, false, RING, false, BR>);
  launch_pdl_smem("exact_qgemm_kernel", kernel, grid, dim3(kThreads), smem_for_grid(grid, kSmem),
                  stream, sg, l.cols, static_cast<const int8_t*>(a.q),
                  static_cast<const float*>(a.d), static_cast<const int32_t*>(a.bsum), n_tok,
                  gemm_end, accumulate ? 1 : 0);
}

// Batches that take the weight ring (where its rows allow it). Short batches run few tokens
// per CTA and many steps per row, so one global round trip per step set their time; measured
// on the H100 (kernel_bench, us, one-step register prefetch -> ring): 32 tokens Q8_0 4864 x
// 896 20.0 -> 15.2, 896 x 4864 28.9 -> 28.4, Q5_0 20.9 -> 16.1 / 29.5 -> 28.3, Q4_0 15.7 ->
// 13.2 / 27.5 -> 23.7, Q4_K 896 x 4864 33.0 -> 31.4. Longer batches did not gain (512 tokens:
// 144.5 -> 152.2 for Q8_0 4864 x 896: the ring's registers and shared memory cost the big
// tiles occupancy), so they keep fetch_w.
constexpr int kRingMaxTokens = 32;

// ring_rows: every weight's rows start 8-byte aligned (row_bytes and base address).
template <GgmlType T, Flavor FL, int TT, int BR = kBR>
void launch(const Launch& l, bool ring_rows, const ActBuf& a, int n_tok, int gemm_end,
            bool accumulate, cudaStream_t stream, int prefetch) {
  const bool pf = prefetch < 0 ? prefetch_default<T, FL, TT>() : prefetch != 0;
  if constexpr (qg::ring_type<T>()) {
    if (n_tok <= kRingMaxTokens && ring_rows)
      return launch_kernel<T, FL, TT, true, BR>(pf, l, a, n_tok, gemm_end, accumulate, stream);
  }
  launch_kernel<T, FL, TT, false, BR>(pf, l, a, n_tok, gemm_end, accumulate, stream);
}

// The smallest token tile: 16-row tiles for batches of up to 32 tokens (Q0Lanes: 64) where
// 32-row ones leave SMs without two CTAs (twice the CTAs, each thread half the rows' chains).
// Measured on the H100 (kernel_bench, us, 32 -> 16 rows): Q8_0 896 x 4864 at 16 tokens 28.5
// -> 23.0, 896 x 896 5.8 -> 5.3; Q4_K (repacked) 896 x 4864 at 32 31.7 -> 25.8. Q6_K's alone is
// slower (32.5 -> 37.1 at 32 tokens) but the Q4_K_M 32-token prompt, whose down projections are
// Q4_K and Q6_K, ran 11.5k tok/s with it and 10.3k without (decode_bench; the kernel alone back
// to back is not how it runs in the model). At 64 tokens only Q0Lanes gains since its full
// steps run without per-unit tests (Q8_0 896 x 4864 45.9 -> 43.4, 896 x 896 9.5 -> 9.3; Q4_K
// 33.1 -> 56.8, Q6_K 45.4 -> 54.4, Q4_0 (rep) 27.6 -> 31.5); 128 tokens and more: 32 rows.
template <GgmlType T, Flavor FL, int TT>
void launch_small(const Launch& l, bool ring_rows, const ActBuf& a, int n_tok, int gemm_end,
                  bool accumulate, cudaStream_t stream, int prefetch) {
  const int64_t bt = Geo<FL, TT>::BT;
  constexpr int kSmallMaxTokens = FL == Flavor::Q0Lanes ? 64 : 32;
  if (n_tok <= kSmallMaxTokens &&
      static_cast<int64_t>(l.tiles(kBR)) * ((n_tok + bt - 1) / bt) < 2 * sm_count()) {
    launch<T, FL, TT, kBR / 2>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
  } else {
    launch<T, FL, TT>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
  }
}

// Tokens per thread: the largest tile (most reuse of each shared-memory word) whose grid
// still gives about two CTAs per SM; small grids (few rows or tokens) take smaller tiles.
// Q0Lanes BT = 8 TT, the other lane flavours BT = 4 TT (8 / 16 / 32 tokens per CTA), rep
// flavours BT = 16 TT (16 / 32 / 64). Q4KLanes holds two chain sets per pair: at most TT = 4;
// Q4KRep at most TT = 2 (its integer pair sums and two chains per output need ~128 registers
// there).
template <GgmlType T, Flavor FL>
void launch_tt(const Launch& l, bool ring_rows, const ActBuf& a, int n_tok, int gemm_end,
               bool accumulate, cudaStream_t stream, int prefetch) {
  const int64_t gx = l.tiles(kBR);
  const int64_t fill = 2 * static_cast<int64_t>(sm_count());
  auto enough = [&](int bt) { return gx * ((n_tok + bt - 1) / bt) >= fill; };
  if constexpr (FL == Flavor::Q0Lanes) {  // 8 token lanes a warp: BT = 8 TT
    if (n_tok > 16 && enough(32))
      launch<T, FL, 4>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
    else if (n_tok > 8 && enough(16))
      launch<T, FL, 2>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
    else
      launch_small<T, FL, 1>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
  } else if constexpr (qg::lane_flavor<FL>()) {  // 4 token lanes a warp: BT = 4 TT
    if (FL != Flavor::Q4KLanes && n_tok > 16 && enough(32))
      launch<T, FL, (FL == Flavor::Q4KLanes ? 4 : 8)>(l, ring_rows, a, n_tok, gemm_end, accumulate,
                                                      stream, prefetch);
    else if (n_tok > 8 && enough(16))
      launch<T, FL, 4>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
    else
      launch_small<T, FL, 2>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
  } else {
    if (FL != Flavor::Q4KRep && n_tok > 32 && enough(64))
      launch<T, FL, (FL == Flavor::Q4KRep ? 2 : 4)>(l, ring_rows, a, n_tok, gemm_end, accumulate,
                                                    stream, prefetch);
    else if (n_tok > 16 && enough(32))
      launch<T, FL, 2>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
    else
      launch_small<T, FL, 1>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
  }
}

// When the tensor-core tile (mma0) takes a Q0Lanes launch by default: batches of
// kQgemmMmaMinTokens tokens or more whose CTAs fill their waves (at least 3/4 of the last wave's
// slots, two CTAs an SM). Its CTAs are long (a 896-wide row is 7 steps of ~2.5 us), so it wins
// only on big, evenly filled grids. H100, kernel_bench us at 512 tokens, dp4a tile -> tensor-core
// tile: Q8_0 4864 x 896 144.5 -> 124.3, 896 x 4864 168.1 -> 131.0, 896 x 896 33.2 -> 25.6, gate
// + up 280.0 -> 232.5 (Q5_0 149.0 -> 119.2, 170.5 -> 123.2, 34.5 -> 24.6, 287.7 -> 224.1); but
// an earlier build had Q / K / V (1,152 rows: 288 CTAs, 1.09 waves) 40.3 -> 43.6 and 128 x 896
// (32 CTAs) 11.4 -> 17.7, and whole Q8_0 prompts (decode_bench, tok/s) of 256 tokens 29.6k ->
// 28.0k and 128 tokens 23.6k -> 18.0k.
bool mma_fills(int64_t ctas) {
  const int64_t slots = 2 * static_cast<int64_t>(sm_count());
  const int64_t waves = (ctas + slots - 1) / slots;
  return 4 * ctas >= 3 * waves * slots;
}

// A tensor-core tile's launch: its two instantiations (several weights a launch, one), the
// dynamic shared memory raised once for them, br x bt tiles of rows x tokens.
template <auto* kMulti, auto* kSingle, class... Args>
void launch_tile(const char* name, size_t smem, int br, int bt, const Launch& l, int n_tok,
                 cudaStream_t stream, Args... args) {
  static const bool attr_set = [smem] {
    for (auto* k : {kMulti, kSingle}) {
      CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
    }
    return true;
  }();
  (void)attr_set;
  const QSegs sg = l.segs(br);
  const dim3 grid(static_cast<unsigned>(sg.blk_end[2]),
                  static_cast<unsigned>((n_tok + bt - 1) / bt));
  launch_pdl_smem(name, l.n > 1 ? kMulti : kSingle, grid, dim3(kThreads), smem, stream, sg, l.cols,
                  args...);
}

// The layout of launch l's converted operands in ActBuf::mma at n_tok tokens.
mma0::PrepLayout mma_layout(const Launch& l, int n_tok) {
  return mma0::prep_layout(static_cast<int64_t>(l.tiles(mma0::kMR)) * mma0::kMR * l.cols, l.cols,
                           n_tok);
}

// mma0's two launches: prep_kernel (the operands into a.mma, which the caller checked holds
// mma_layout's bytes), then the tile.
template <GgmlType T>
void launch_mma(const Launch& l, const ActBuf& a, int n_tok, bool accumulate, cudaStream_t stream) {
  const QSegs sg = l.segs(mma0::kMR);
  const mma0::PrepLayout pl = mma_layout(l, n_tok);
  const int64_t nb = l.cols / 32;
  const int64_t units = (static_cast<int64_t>(sg.blk_end[2]) * mma0::kMR +
                         static_cast<int64_t>(mma0::token_tiles(n_tok)) * mma0::kMT) *
                        nb;
  const dim3 pgrid(static_cast<unsigned>((units + kThreads - 1) / kThreads));
  const auto* aq = static_cast<const int8_t*>(a.q);
  const auto* ad = static_cast<const float*>(a.d);
  launch_pdl("exact_qmma_prep_kernel",
             l.n > 1 ? mma0::prep_kernel<T, true> : mma0::prep_kernel<T, false>, pgrid,
             dim3(kThreads), stream, sg, l.cols, aq, ad, n_tok, a.mma, pl);
  const mma0::Prep prep{reinterpret_cast<const uint16_t*>(a.mma + pl.w),
                        reinterpret_cast<const float*>(a.mma + pl.dw),
                        reinterpret_cast<const uint16_t*>(a.mma + pl.x),
                        reinterpret_cast<const float*>(a.mma + pl.da)};
  launch_tile<mma0::qmma_kernel<true>, mma0::qmma_kernel<false>>(
      "exact_qmma_kernel", sizeof(mma0::Smem), mma0::kMR, mma0::kMT, l, n_tok, stream, prep, n_tok,
      accumulate ? 1 : 0);
}

void launch_kmma(const Launch& l, const ActBuf& a, int n_tok, int gemm_end, bool accumulate,
                 cudaStream_t stream) {
  launch_tile<kmma::kmma_kernel<true>, kmma::kmma_kernel<false>>(
      "exact_kmma_kernel", sizeof(kmma::Smem), kmma::kMR, kmma::kMT, l, n_tok, stream,
      static_cast<const int8_t*>(a.q), static_cast<const float*>(a.d), n_tok, gemm_end,
      accumulate ? 1 : 0);
}

void launch_q6mma(const Launch& l, const ActBuf& a, int n_tok, bool accumulate,
                  cudaStream_t stream) {
  launch_tile<q6mma::q6mma_kernel<true>, q6mma::q6mma_kernel<false>>(
      "exact_q6mma_kernel", sizeof(q6mma::Smem), q6mma::kMR, q6mma::kMT, l, n_tok, stream,
      static_cast<const int8_t*>(a.q), static_cast<const float*>(a.d),
      static_cast<const int32_t*>(a.bsum), n_tok, accumulate ? 1 : 0);
}

bool is_quant(uint32_t t) {
  return quantized(dot_family_of(t));
}

}  // namespace

// When the tiled kernel beats matmul's warp-per-row kernel, from bench/kernel_bench (it times
// qgemm at every token count; H100, us, qgemm / matmul): Q8_0 at 16 tokens 4864 x 896 11.9 /
// 32.9, 896 x 4864 28.5 / 54.0, 896 x 896 5.8 / 10.5 (Q5_0 alike, Q6_K 896 x 4864 32.4 / 41.2);
// at 8 tokens only the tall launches (4864 x 896 8.5 / 17.8, so gate + up and Q / K / V together)
// while 896 x 4864 (28.5 / 20.2) and 896 x 896 (5.7 / 4.6) are not; Q4_K 896 x 4864 from 32
// tokens (31.8 / 38.0; at 16 31.7 / 27.0).
int64_t qgemm_weight_elems(int64_t rows, int64_t cols) {
  return (rows + mma0::kMR - 1) / mma0::kMR * mma0::kMR * cols;
}

size_t qgemm_scratch_bytes(int max_tok, int max_cols, int64_t max_weight_elems) {
  // each of prep_layout's regions grows with its argument: the largest launch's fit in these
  return mma0::prep_layout(max_weight_elems, max_cols, max_tok).bytes;
}

bool qgemm_takes(uint32_t weight_type, int n_tok, int64_t rows) {
  if (!is_quant(weight_type)) return false;
  if (weight_type == static_cast<uint32_t>(GgmlType::Q4_K)) return n_tok >= 32;
  return n_tok >= 16 || (n_tok >= 8 && rows >= 2048);
}

namespace {

// Whether w can share w0's launch: one type, width, row size and summation order.
bool shares_launch(const WeightView& w, const WeightView& w0) {
  return w.type == w0.type && w.cols == w0.cols && w.row_bytes == w0.row_bytes &&
         repacked(static_cast<GgmlType>(w.type), w.rows) ==
             repacked(static_cast<GgmlType>(w0.type), w0.rows);
}

// Products of n (1..3) weights of one type, width and flavour with the same activations, in
// one launch; throws where the weights cannot share one.
void run(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a, int n_tok,
         const BatchOrder& order, bool accumulate, cudaStream_t stream, int prefetch) {
  const WeightView& w0 = *ws[0];
  const std::string tn(ggml_type_name(w0.type));
  if (!is_quant(w0.type))
    throw WorkerError(ErrorCode::Internal, "qgemm: unsupported weight type " + tn);
  if (n < 1 || n > 3) throw WorkerError(ErrorCode::Internal, "qgemm: 1 to 3 weights a launch");
  if (n_tok <= 0) throw WorkerError(ErrorCode::Internal, "qgemm: empty shape");
  Launch l{};
  bool ring_rows = true, rows16 = true, base16 = true;
  for (int i = 0; i < n; ++i) {  // slots past n keep rows 0: no CTA column selects them
    const WeightView& w = *ws[i];
    if (w.rows <= 0 || w.cols <= 0) throw WorkerError(ErrorCode::Internal, "qgemm: empty shape");
    if (w.rows > (int64_t{1} << 30) || w.cols > (int64_t{1} << 24))
      throw WorkerError(ErrorCode::Internal, "qgemm: matrix too large");
    if (!shares_launch(w, w0)) {
      throw WorkerError(ErrorCode::Internal,
                        "qgemm: the weights of one launch differ in type, width or order");
    }
    l.sg.w[i] = static_cast<const uint8_t*>(w.data);
    l.sg.y[i] = ys[i];
    l.sg.rows[i] = static_cast<int>(w.rows);
    ring_rows = ring_rows && w.row_bytes % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 8 == 0;
    base16 = base16 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
    rows16 = rows16 && base16 && w.row_bytes % 16 == 0;
  }
  l.cols = static_cast<int>(w0.cols);
  l.n = n;
  l.sg.row_bytes = w0.row_bytes;
  if (l.tiles(kBR / 2) > 65535 * 1024)
    throw WorkerError(ErrorCode::Internal, "qgemm: matrix too large");
  // CpuEngine::matmul: repack gemm for batch tokens < batch_n - batch_n % 4.
  const int gemm_end = order.batch_n - order.batch_n % 4 - order.t0;
  dispatch(w0.type, [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (quantized(Tr::kFamily)) {
      if (w0.cols % Tr::kBlock != 0) {
        throw WorkerError(ErrorCode::Internal, "qgemm: row length " + std::to_string(w0.cols) +
                                                   " is not a multiple of the " + tn + " block");
      }
      constexpr GgmlType T = Tr::kType;
      const bool rep = repacked(T, w0.rows);
      // the kernel body's flavour: the CPU reference's summation order for this weight
      constexpr Flavor kLanes = Tr::kFamily == DotFamily::Block32 ? Flavor::Q0Lanes
                                : T == GgmlType::Q4_K             ? Flavor::Q4KLanes
                                                                  : Flavor::Q6K;
      constexpr Flavor kRep = T == GgmlType::Q4_0 ? Flavor::Q4_0Rep : Flavor::Q4KRep;
      if constexpr (kLanes == Flavor::Q0Lanes) {
        // the tensor-core tile: Q0Lanes weights whose width is a multiple of its step and whose
        // rows are 8-byte aligned (its cp.async pieces)
        const bool mma_ok = !rep && w0.cols % mma0::kKS == 0 && ring_rows;
        const bool scratch_ok = a.mma != nullptr && a.mma_bytes >= mma_layout(l, n_tok).bytes;
        if (mma_ok && !scratch_ok && prefetch == qg::kVariantMma)
          throw WorkerError(
              ErrorCode::Internal,
              "qgemm: the tensor-core tile's scratch (ActBuf::mma) is missing or too small");
        if (mma_ok && prefetch == qg::kVariantMma)
          return launch_mma<T>(l, a, n_tok, accumulate, stream);
        if (mma_ok && scratch_ok && prefetch < 0 && n_tok >= kQgemmMmaMinTokens &&
            mma_fills(static_cast<int64_t>(l.tiles(mma0::kMR)) * mma0::token_tiles(n_tok)))
          return launch_mma<T>(l, a, n_tok, accumulate, stream);
      }
      if constexpr (T == GgmlType::Q4_K) {
        // the Q4KRep tensor-core tile (kmma): repacked rows, 16-byte aligned (its cp.async
        // pieces); by default on the same batches as mma0's (not measured below 512 tokens)
        const bool kmma_ok = rep && rows16;
        if (kmma_ok && prefetch == qg::kVariantMma)
          return launch_kmma(l, a, n_tok, gemm_end, accumulate, stream);
        if (kmma_ok && prefetch < 0 && n_tok >= kQgemmMmaMinTokens &&
            mma_fills(static_cast<int64_t>(l.tiles(kmma::kMR)) *
                      ((n_tok + kmma::kMT - 1) / kmma::kMT)))
          return launch_kmma(l, a, n_tok, gemm_end, accumulate, stream);
      }
      if constexpr (T == GgmlType::Q6_K) {
        // the Q6_K tensor-core tile (q6mma): 16-byte aligned weights (its windows' pieces)
        if (base16 && prefetch == qg::kVariantMma)
          return launch_q6mma(l, a, n_tok, accumulate, stream);
        if (base16 && prefetch < 0 && n_tok >= kQgemmMmaMinTokens &&
            mma_fills(static_cast<int64_t>(l.tiles(q6mma::kMR)) *
                      ((n_tok + q6mma::kMT - 1) / q6mma::kMT)))
          return launch_q6mma(l, a, n_tok, accumulate, stream);
      }
      if (prefetch == qg::kVariantMma)
        throw WorkerError(ErrorCode::Internal, "qgemm: no tensor-core tile for this weight");
      if constexpr (Tr::kRepack) {
        if (rep)
          return launch_tt<T, kRep>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
      }
      launch_tt<T, kLanes>(l, ring_rows, a, n_tok, gemm_end, accumulate, stream, prefetch);
    }
  });
}

}  // namespace

namespace qg {
void qgemm_variant(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order,
                   float* y, bool accumulate, cudaStream_t stream, int prefetch) {
  const WeightView* ws[1] = {&w};
  float* ys[1] = {y};
  run(ws, ys, 1, a, n_tok, order, accumulate, stream, prefetch);
}
}  // namespace qg

void qgemm(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order, float* y,
           bool accumulate, cudaStream_t stream) {
  qg::qgemm_variant(w, a, n_tok, order, y, accumulate, stream, -1);
}

bool qgemm_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a, int n_tok,
                 const BatchOrder& order, cudaStream_t stream) {
  if (n < 1 || n > 3) return false;
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) rows += ws[i]->rows;
  if (!qgemm_takes(ws[0]->type, n_tok, rows)) return false;
  for (int i = 1; i < n; ++i) {
    if (!shares_launch(*ws[i], *ws[0])) return false;
  }
  run(ws, ys, n, a, n_tok, order, false, stream, -1);
  return true;
}

}  // namespace worker::kern::exact
