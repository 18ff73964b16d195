// Exact matmul for F32 / F16 / BF16 weights (matmul.cuh: detail::matmul_float): every output
// is bit for bit the float CpuEngine::matmul computes (worker/engine/cpu/act_quant.cpp).
//
// Orders reproduced, and why the GPU gets the same floats:
//  * vec_dot (one token, and batches tinyBLAS does not take), cpu::dot_vecdot:
//    64 FMA chains, chain c = 16a + j takes elements 64i + c, i = 0 .. n/64 - 1, starting
//    from +0; then r[j] = (acc[j] + acc[32+j]) + (acc[16+j] + acc[48+j]) and hsum16(r).
//    vecdot_kernel: 8 threads per row, thread s owns the 8 consecutive chains 8s .. 8s+7
//    (16-byte F16/BF16 loads, 32-byte F32 loads, the 8 threads read 64 consecutive elements:
//    coalesced). Each chain is one thread's register, updated with fmaf in index order, so
//    it is the CPU lane's value exactly. The reduce + hsum16 is a butterfly over the chain
//    index bits 5, 4, 3, 2, 1, 0 (exact_float_math.cuh); bits 5..3 are the thread bits
//    (shuffles xor 4, 2, 1), bits 2..0 are added in the thread. Pairs are the reference's
//    pairs, and a + b == b + a, so the sums are the reference's.
//    Leftovers (n % 64) are summed by one thread in the reference's sequential order:
//    F32 as GCC compiled ggml's tail (rounded products of 16 / 8 added one by one, the last
//    < 8 as FMAs), F16 each product added in double to the double of the tree's sum.
//  * vec_dot BF16, cpu::dot_bf16_vecdot: two 16-lane dpbf16 accumulators per 64-element
//    step, c1 over elements 0..31, c2 over 32..63, lane l taking the pair (2l, 2l+1) as
//    (c + p[2l+1]) + p[2l]. Thread s owns 4 lanes (8 elements): s < 4 lanes of c1, s >= 4
//    of c2; hsum16 of each = shuffles xor 2, 1 then (v0 + v2) + (v1 + v3) in the thread;
//    then double(h1) + double(h2) and the leftovers added in double, by one thread.
//  * tinyBLAS (prompt batches, cpu::tinyblas_takes(type, rows, batch_n, cols): the order
//    depends on the whole batch, not on this call's tokens), cpu::dot_tinyblas /
//    dot_bf16_tinyblas: 16 lanes per output, lane l takes elements 16i + l (F32/F16, FMA)
//    or the pairs (32i + 2l, 32i + 2l + 1) (BF16, dpbf16); then hsum16.
//    tinyblas_kernel: a block computes 32 rows x 32 tokens or 16 x 16; k in chunks of 128
//    staged in shared memory as floats (exact conversions; a partial last chunk padded with
//    products -0, which leave every chain unchanged); thread (group g, lane l) owns lane l
//    of 8 rows x 8 tokens or 4 x 4 (64 or 16 register chains, each in index order); hsum16
//    by shuffles over lane bits 3, 2, 1, 0 inside each 16-thread group (a transposing reduction).
// accumulate: y = y + dot, one rounding (the CPU's x += tmp).
//
// All arithmetic here goes through xf:: helpers (explicit __fmul_rn / __fadd_rn / fmaf), and
// the file is compiled with -fmad=false as well. No atomics; every output is written by one
// thread. Weights are read before griddep_wait() (they are never written by a kernel);
// activations and y after.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <algorithm>
#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact_float_math.cuh"
#include "launch.cuh"
#include "matmul.cuh"

namespace worker::kern::exact {
namespace {

// 32-bit words of 8 consecutive weights.
template <GgmlType T>
constexpr int kWords = T == GgmlType::F32 ? 8 : 4;

// 8 consecutive weights [e, e + 8) of a row, raw. kVec: 16-byte loads (the row and the
// element offset are 16-byte aligned).
template <GgmlType T, bool kVec>
__device__ __forceinline__ void load8w(const uint8_t* __restrict__ row, int e,
                                       uint32_t (&w)[kWords<T>]) {
  if constexpr (T == GgmlType::F32) {
    if constexpr (kVec) {
      const uint4* p = reinterpret_cast<const uint4*>(row + static_cast<size_t>(e) * 4);
      const uint4 a = __ldg(p), b = __ldg(p + 1);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
      w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(row) + e;
#pragma unroll
      for (int k = 0; k < 8; ++k) w[k] = __ldg(p + k);
    }
  } else {
    if constexpr (kVec) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(row + static_cast<size_t>(e) * 2));
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    } else {
      const unsigned short* p = reinterpret_cast<const unsigned short*>(row) + e;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        w[k] = static_cast<uint32_t>(__ldg(p + 2 * k)) |
               (static_cast<uint32_t>(__ldg(p + 2 * k + 1)) << 16);
      }
    }
  }
}

// Exact conversion of the raw words to 8 floats (element order: low half first).
template <GgmlType T>
__device__ __forceinline__ void unpack8(const uint32_t (&w)[kWords<T>], float (&v)[8]) {
#pragma unroll
  for (int k = 0; k < kWords<T>; ++k) {
    if constexpr (T == GgmlType::F32) {
      v[k] = __uint_as_float(w[k]);
    } else if constexpr (T == GgmlType::F16) {
      v[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xFFFFu)));
      v[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
    } else {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
  }
}

// Weight element i of a row as float (leftover loops).
template <GgmlType T>
__device__ __forceinline__ float elem(const uint8_t* __restrict__ row, int i) {
  if constexpr (T == GgmlType::F32) {
    return __ldg(reinterpret_cast<const float*>(row) + i);
  } else {
    const uint32_t h = __ldg(reinterpret_cast<const unsigned short*>(row) + i);
    if constexpr (T == GgmlType::F16) {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
    } else {
      return __uint_as_float(h << 16);
    }
  }
}

template <bool kVec, int N>
__device__ __forceinline__ void load_x(const float* __restrict__ x, int e, float (&v)[N]) {
  if constexpr (kVec) {
#pragma unroll
    for (int q = 0; q < N / 4; ++q) {
      const float4 f = *reinterpret_cast<const float4*>(x + e + 4 * q);
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = x[e + k];
  }
}

// ---------------------------------------------------------------------------------------
// vec_dot order. 8 threads per row (thread s: chains 8s .. 8s+7 of every token), blockDim/8
// rows per block, NT tokens per block sharing each weight load.
// (4 or 8) rows per block: one-warp blocks for matrices of few rows, so that their blocks
// spread over all SMs (896 rows: 224 blocks).
constexpr int kVdRows = 8;
constexpr int kVdThreads = kVdRows * 8;
constexpr int kVdSmallRows = 4096;  // below: 4 rows per block

template <GgmlType T, int NT, bool kVec>
__global__ void __launch_bounds__(kVdThreads)
    vecdot_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                  const float* __restrict__ x, int n_tok, float* __restrict__ y, int accumulate) {
  constexpr bool kBf = T == GgmlType::BF16;
  constexpr int kW = kWords<T>;
  // Iterations of weights in flight per thread (the same bytes for F32 and the 16-bit
  // types): one token is the memory-bound decode, where rows can be few (K/V projections:
  // 128 rows, down projection: 896 rows of 4864) and only deep prefetch keeps enough bytes
  // in flight; with NT tokens the accumulators need the registers.
  constexpr int kU = (NT == 1 ? 16 : 8) / (T == GgmlType::F32 ? 2 : 1);
  constexpr int kC = kBf ? 4 : 8;  // chains (lanes) per thread
  const int s = threadIdx.x & 7;
  const int r = static_cast<int>(blockIdx.x * (blockDim.x >> 3) + (threadIdx.x >> 3));
  const bool live = r < rows;
  // A dead row (last block) computes row rows-1 again and stores nothing: every thread
  // takes part in the shuffles.
  const uint8_t* row = w + static_cast<size_t>(live ? r : rows - 1) * row_bytes;
  const int tb = blockIdx.y * NT;
  const int nt = min(NT, n_tok - tb);  // the same for the whole block
  const int n_it = cols / 64;
  const int e0 = 8 * s;

  uint32_t raw[kU][kW];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (u < n_it) load8w<T, kVec>(row, u * 64 + e0, raw[u]);
  }
  griddep_wait();

  float acc[NT][kC];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int k = 0; k < kC; ++k) acc[t][k] = 0.0f;
  }
  for (int i0 = 0; i0 < n_it; i0 += kU) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u;
      if (i < n_it) {
        float wv[8];
        unpack8<T>(raw[u], wv);
        // refill this slot kU iterations ahead: a rolling window of loads in flight
        if (i + kU < n_it) load8w<T, kVec>(row, (i + kU) * 64 + e0, raw[u]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < nt) {
            float xv[8];
            load_x<kVec>(x + static_cast<size_t>(tb + t) * cols, i * 64 + e0, xv);
            if constexpr (kBf) {
#pragma unroll
              for (int q = 0; q < 4; ++q)
                acc[t][q] =
                    xf::dpbf16_step(acc[t][q], wv[2 * q], xv[2 * q], wv[2 * q + 1], xv[2 * q + 1]);
            } else {
#pragma unroll
              for (int k = 0; k < 8; ++k) acc[t][k] = xf::fma_step(acc[t][k], wv[k], xv[k]);
            }
          }
        }
      }
    }
  }

  const int np = n_it * 64;
  auto we = [row](int i) { return elem<T>(row, i); };
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= nt) break;  // uniform in the block
    const float* xr = x + static_cast<size_t>(tb + t) * cols;
    float res = 0.0f;
    if constexpr (!kBf) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = acc[t][k];
#pragma unroll
      for (int m = 4; m >= 1; m >>= 1) {  // chain bits 5, 4, 3
        float o[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) o[k] = __shfl_xor_sync(0xffffffffu, v[k], m);
        xf::combine(v, o);
      }
      res = xf::local_tree8(v);  // bits 2, 1, 0
      if (s == 0 && live && np != cols) {
        if constexpr (T == GgmlType::F32) {
          res = xf::tail_f32(res, we, xr, np, cols);
        } else {
          res = static_cast<float>(xf::tail_double(static_cast<double>(res), we, xr, np, cols));
        }
      }
    } else {
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = acc[t][k];
#pragma unroll
      for (int m = 2; m >= 1; m >>= 1) {  // lane bits 3, 2
        float o[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] = __shfl_xor_sync(0xffffffffu, v[k], m);
        xf::combine(v, o);
      }
      const float h = xf::local_tree4(v);  // lane bits 1, 0: hsum16 of c1 (s < 4) or c2
      const float h2 = __shfl_xor_sync(0xffffffffu, h, 4);
      if (s == 0 && live) {
        double d = static_cast<double>(h) + static_cast<double>(h2);
        d = xf::tail_double(d, we, xr, np, cols);
        res = static_cast<float>(d);
      }
    }
    if (s == 0 && live) {
      const size_t idx = static_cast<size_t>(tb + t) * static_cast<size_t>(rows) + r;
      y[idx] = accumulate ? xf::add_rn(y[idx], res) : res;
    }
  }
}

// ---------------------------------------------------------------------------------------
// tinyBLAS order. Block: 16 groups of 16 threads (warp w holds groups 2w and 2w + 1, thread bit
// 0 picking the group, bits 1 .. 4 the lane); group g = (gm, gn) owns rows gm*TM .. +TM and
// tokens gn, gn + 4, .., gn + 4(TN-1) of a 4TM-row x 4TN-token tile; thread lane l of the group
// holds chain l of each of those outputs. Two tiles: 8 x 8 outputs a thread (32 x 32 per block;
// per four 16-element steps, 8 LDS.128 weight slots and 8 LDS.128 activation slots for 256 FMAs),
// and 4 x 4 (16 x 16) for short batches and small grids (896-row matrices at <= 64 tokens: the
// 76-chunk K loop of a down projection then runs on four times as many SMs); launch_tinyblas
// picks.
//
// k runs in chunks of kK (128) through two rings of shared-memory stages filled by cp.async
// (16-byte copies): the raw weights, kSw stages, requested kSw - 1 chunks ahead (the first ones
// before griddep_wait(): they never depend on the previous kernel), and the activations, kSx <
// kSw stages, kSx - 1 chunks ahead; so a short batch's K loop is not one global round trip per
// chunk. Each thread converts the weight words it copied itself into a float stage (exact
// conversions) once they have landed, so one barrier per chunk orders everything.
//
// A grid no larger than the SMs is launched with its shared memory padded so that one block
// fits an SM: with room for two, the blocks of the next launch (PDL, launched early) doubled up
// on some SMs while others idled (F16 prompt tok/s against two blocks an SM: 32 tokens +17%,
// 128 tokens +19%; v18).
//
// Elements past cols (cols % kK != 0) are padded with weight +0 and activation -0: their
// product is -0, and fma(+0, -0, c) = c + (-0) = c for every c (also c = +-0, inf, NaN),
// likewise (c + (-0)) + (-0) = c for dpbf16; so the chains are the unpadded ones and the
// inner loop has no bounds checks.
constexpr int kTbThreads = 256;
template <GgmlType T, int TM, int TN>
struct TbGeom {
  static constexpr int kBM = 4 * TM, kBN = 4 * TN;  // tile rows, tokens
  // Elements a chunk, raw weight stages, activation stages (H100, F16 prompt tok/s against
  // 64 / 4 / 4 for both tiles, perf-notes v18). BF16's 8 x 8 tile keeps 64-element chunks
  // (128: 56 bytes of spills).
  static constexpr bool kBfBig = T == GgmlType::BF16 && TM == 8;
  static constexpr int kK = kBfBig ? 64 : 128;
  static constexpr int kSw = kBfBig ? 5 : (TM == 8 ? 3 : 8);
  static constexpr int kSx = kBfBig ? 3 : (TM == 8 ? 2 : 3);
  static_assert(kSx >= 2 && kSw > kSx, "the weights run ahead of the activations");
  // F32 / F16: the weights' float stage interleaved (kIlv): in each 64-element group q of a
  // row, lane l's four elements 64q + 16s + l (s = 0 .. 3, its chain's next four steps) are one
  // 16-byte slot, so a thread loads them with one LDS.128 instead of four LDS.32 (perf-notes
  // v39). Slot of (q, lane l = 8h + j): 18q + 9h + j, so that the 8 floats a thread converts
  // (one half h of one step s) go to 8 slots that no other unit of its row shares mod 8 banks
  // (the stores run without conflicts) while a quarter warp's 8 lanes still read 8 adjacent slots.
  static constexpr bool kIlv = T != GgmlType::BF16;
  static_assert(!kIlv || kK == 128, "the interleaved stage holds two 64-element groups");
  // Row strides of the float stages (floats). The two groups of a warp share gm (the same
  // weight words: broadcast) and have gn one apart: tokens one row apart, kK + 16 = 16 mod 32
  // banks, so their 16 lanes each hit disjoint banks. Interleaved weight rows take 35 slots
  // (140 floats); 144 = 16 mod 32 puts the two rows of a warp's conversion stores in disjoint
  // banks.
  static constexpr int kWLd = kIlv ? 144 : kK + 4;
  static_assert(!kIlv || (kWLd >= xf::kIlvRowFloats && kWLd % 32 == 16), "see above");
  static constexpr int kXLd = kK + 16;
  static constexpr int kEsz = T == GgmlType::F32 ? 4 : 2;
  static constexpr int kWUnitEl = 16 / kEsz;        // weights in a 16-byte copy
  static constexpr int kWUnitsRow = kK / kWUnitEl;  // copies per row and chunk
  static constexpr int kWUnits = kBM * kWUnitsRow;  // weight copies per chunk
  static constexpr int kXUnits = kBN * kK / 4;      // activation copies per chunk
  static constexpr int kRawBytes = kSw * kBM * kK * kEsz;
  static constexpr int kXFloats = kSx * kBN * kXLd;
  static constexpr int kWFloats = 2 * kBM * kWLd;
  static constexpr size_t kSmem = kRawBytes + sizeof(float) * (kXFloats + kWFloats);
  static constexpr int kMinBlocks = TM == 8 ? 2 : 3;
};

// One level of tinyblas_kernel's transposing hsum16 (xf::fold_pair): the first n
// values of v are this lane's outputs; the lane keeps the half that its bit B picks (v[0 ..
// n/2) after the call) and adds the partner's (lane ^ 2^B, the thread tid ^ 2^(B + 1): lane l
// is thread bits 1 .. 4) values of them.
template <int n, int B, int N>
__device__ __forceinline__ void fold_half(float (&v)[N], int l) {
#pragma unroll
  for (int i = 0; i < n / 2; ++i) {
    float send, keep;
    xf::fold_pair<n, B>(v, l, i, send, keep);
    v[i] = xf::add_rn(keep, __shfl_xor_sync(0xffffffffu, send, 2 << B));
  }
}

// Up to 3 weights of one type and width multiplied by the same input in one launch (Q, K, V):
// blocks [blk_end[s - 1], blk_end[s]) of blockIdx.x take weight s.
struct TbSegs {
  const uint8_t* w[3] = {};
  float* y[3] = {};
  size_t row_bytes[3] = {};
  int rows[3] = {};
  int blk_end[3] = {};
};

// The 16 bytes at src (weights or activations) into dst (shared): cp.async when aligned
// (kVec), else element loads and a shared store (rows or x not 16-byte aligned: rare, not
// pipelined).
template <int kEsz, bool kVec>
__device__ __forceinline__ void copy16(void* dst, const uint8_t* __restrict__ src) {
  if constexpr (kVec) {
    cp_async16(dst, src);
  } else if constexpr (kEsz == 4) {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(src);
    *reinterpret_cast<uint4*>(dst) = make_uint4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
  } else {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(src);
    uint32_t wd[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wd[k] = static_cast<uint32_t>(__ldg(p + 2 * k)) |
              (static_cast<uint32_t>(__ldg(p + 2 * k + 1)) << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
  }
}

// copy16 when `on` (a thread's unit that is in); cp.async under a predicate, no branch.
template <int kEsz, bool kVec>
__device__ __forceinline__ void copy16_if(void* dst, const uint8_t* __restrict__ src, uint32_t on) {
  if constexpr (kVec) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.u32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], "
        "16;\n}" ::"r"(s),
        "l"(src), "r"(on)
        : "memory");
  } else if (on != 0u) {
    copy16<kEsz, kVec>(dst, src);
  }
}

template <GgmlType T, int TM, int TN, bool kVec>
__global__ void __launch_bounds__(kTbThreads, (TbGeom<T, TM, TN>::kMinBlocks))
    tinyblas_kernel(TbSegs sg, int cols, const float* __restrict__ x, int xcols, int n_tok,
                    int accumulate) {
  using G = TbGeom<T, TM, TN>;
  constexpr bool kBf = T == GgmlType::BF16;
  constexpr int kBM = G::kBM, kBN = G::kBN, kSw = G::kSw, kSx = G::kSx, kK = G::kK;
  extern __shared__ __align__(16) unsigned char tb_smem[];
  uint8_t* const raw = tb_smem;                                        // [kSw][kBM][kK] raw
  float* const xs = reinterpret_cast<float*>(tb_smem + G::kRawBytes);  // [kSx][kBN][kXLd]
  float* const ws = xs + G::kXFloats;                                  // [2][kBM][kWLd]
  const int tid = static_cast<int>(threadIdx.x);
  const int bx = static_cast<int>(blockIdx.x);
  const int seg = bx < sg.blk_end[0] ? 0 : (bx < sg.blk_end[1] ? 1 : 2);
  const uint8_t* __restrict__ w = seg == 0 ? sg.w[0] : (seg == 1 ? sg.w[1] : sg.w[2]);
  float* __restrict__ y = seg == 0 ? sg.y[0] : (seg == 1 ? sg.y[1] : sg.y[2]);
  const size_t row_bytes =
      seg == 0 ? sg.row_bytes[0] : (seg == 1 ? sg.row_bytes[1] : sg.row_bytes[2]);
  const int rows = seg == 0 ? sg.rows[0] : (seg == 1 ? sg.rows[1] : sg.rows[2]);
  const int blk0 = seg == 0 ? 0 : (seg == 1 ? sg.blk_end[0] : sg.blk_end[1]);
  const int m0 = (bx - blk0) * kBM, n0 = static_cast<int>(blockIdx.y) * kBN;
  const int n_chunks = (cols + kK - 1) / kK;

  // This thread's copies, the same in every chunk (so their addresses are computed once, and a
  // chunk's copies are a pointer bump: perf-notes v39): weight units i < kWPer (row wr + i *
  // kWRowStep, elements we .. we + kWUnitEl of the chunk) and activation units i < kXPer (token
  // xt + i * kXTokStep, elements xe .. xe + 3). A unit past the weight's rows or the batch's
  // tokens is never copied: its slots of every stage hold the padding written before the loop.
  static_assert(G::kWUnits % kTbThreads == 0 && kTbThreads % G::kWUnitsRow == 0 &&
                    G::kXUnits % kTbThreads == 0 && kTbThreads % (kK / 4) == 0,
                "every thread copies the same number of whole units");
  constexpr int kWPer = G::kWUnits / kTbThreads, kXPer = G::kXUnits / kTbThreads;
  constexpr int kWRowStep = kTbThreads / G::kWUnitsRow, kXTokStep = kTbThreads / (kK / 4);
  constexpr int kWStage = kBM * kK * G::kEsz;  // bytes of a raw weight stage
  constexpr int kWUnitStep = kWRowStep * kK * G::kEsz;
  constexpr int kXStage = kBN * G::kXLd;  // floats of an activation stage
  const int wr = tid / G::kWUnitsRow, we = (tid % G::kWUnitsRow) * G::kWUnitEl;
  const int xt = tid / (kK / 4), xe = (tid % (kK / 4)) * 4;
  uint8_t* const wdst = raw + (wr * kK + we) * G::kEsz;  // + stage * kWStage + i * kWUnitStep
  float* const xdst = xs + xt * G::kXLd + xe;            // + stage * kXStage + i * ..
  // where the unit's first float goes (interleaved: its elements 4 floats apart)
  const int wcv = G::kIlv ? xf::ilv_pos(we) : we;
  float* const wcvt = ws + wr * G::kWLd + wcv;  // + float stage + i * kWRowStep * kWLd
  const uint8_t* const wsrc =
      w + static_cast<size_t>(m0 + wr) * row_bytes + static_cast<size_t>(we) * G::kEsz;
  const size_t wstep = static_cast<size_t>(kWRowStep) * row_bytes;
  const float* const xsrc = x + static_cast<size_t>(n0 + xt) * static_cast<size_t>(xcols) + xe;
  const size_t xstep = static_cast<size_t>(kXTokStep) * static_cast<size_t>(xcols);
  uint32_t wok = 0u, xok = 0u;
#pragma unroll
  for (int i = 0; i < kWPer; ++i) wok |= (m0 + wr + i * kWRowStep < rows ? 1u : 0u) << i;
#pragma unroll
  for (int i = 0; i < kXPer; ++i) {
    xok |= (n0 + xt + i * kXTokStep < n_tok ? 1u : 0u) << i;
  }
  // The padding of the units that are never copied: weights +0, activations -0 (see above).
#pragma unroll
  for (int s = 0; s < kSw; ++s) {
#pragma unroll
    for (int i = 0; i < kWPer; ++i) {
      if (((wok >> i) & 1u) == 0u) {
        *reinterpret_cast<uint4*>(wdst + s * kWStage + i * kWUnitStep) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSx; ++s) {
#pragma unroll
    for (int i = 0; i < kXPer; ++i) {
      if (((xok >> i) & 1u) == 0u) {
        *reinterpret_cast<float4*>(xdst + s * kXStage + i * kXTokStep * G::kXLd) =
            make_float4(-0.0f, -0.0f, -0.0f, -0.0f);
      }
    }
  }

  // Chunk c's copies into raw stage s = c % kSw and activation stage s = c % kSx. A chunk that
  // ends within cols (all but a partial last one: uniform in the block) copies every unit that
  // is in; in a partial last chunk (cols is a multiple of 16: a unit is all in or all out) the
  // units past cols get the padding.
  auto issue_w = [&](int c, int s) {
    if (c >= n_chunks) return;
    const int k0 = c * kK;
    const uint8_t* const src = wsrc + static_cast<size_t>(k0) * G::kEsz;
    uint8_t* const dst = wdst + s * kWStage;
    if (k0 + kK <= cols) {
#pragma unroll
      for (int i = 0; i < kWPer; ++i) {
        copy16_if<G::kEsz, kVec>(dst + i * kWUnitStep, src + i * wstep, (wok >> i) & 1u);
      }
    } else {
      const bool in = k0 + we < cols;
#pragma unroll
      for (int i = 0; i < kWPer; ++i) {
        if (((wok >> i) & 1u) == 0u) continue;
        if (in) {
          copy16<G::kEsz, kVec>(dst + i * kWUnitStep, src + i * wstep);
        } else {
          *reinterpret_cast<uint4*>(dst + i * kWUnitStep) = make_uint4(0u, 0u, 0u, 0u);  // +0
        }
      }
    }
  };
  auto issue_x = [&](int c, int s) {
    if (c >= n_chunks) return;
    const int k0 = c * kK;
    const float* const src = xsrc + k0;
    float* const dst = xdst + s * kXStage;
    if (k0 + kK <= xcols) {
#pragma unroll
      for (int i = 0; i < kXPer; ++i) {
        copy16_if<4, kVec>(dst + i * kXTokStep * G::kXLd,
                           reinterpret_cast<const uint8_t*>(src + i * xstep), (xok >> i) & 1u);
      }
    } else {
      const bool in = k0 + xe < xcols;
#pragma unroll
      for (int i = 0; i < kXPer; ++i) {
        if (((xok >> i) & 1u) == 0u) continue;
        float* const d = dst + i * kXTokStep * G::kXLd;
        if (in) {
          copy16<4, kVec>(d, reinterpret_cast<const uint8_t*>(src + i * xstep));
        } else {
          *reinterpret_cast<float4*>(d) = make_float4(-0.0f, -0.0f, -0.0f, -0.0f);  // -0
        }
      }
    }
  };
  // The weight words this thread copied into raw stage s, as floats, into float stage f.
  auto convert = [&](int s, int f) {
#pragma unroll
    for (int i = 0; i < kWPer; ++i) {
      const uint4 q = *reinterpret_cast<const uint4*>(wdst + s * kWStage + i * kWUnitStep);
      float* const d = wcvt + f * kBM * G::kWLd + i * kWRowStep * G::kWLd;
      if constexpr (T == GgmlType::F32) {
        const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) d[4 * j] = __uint_as_float(wd[j]);  // slots of lanes + j
      } else if constexpr (G::kIlv) {
        const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
        float v[8];
        unpack8<T>(wd, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) d[4 * j] = v[j];
      } else {
        const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
        float v[8];
        unpack8<T>(wd, v);
        reinterpret_cast<float4*>(d)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(d)[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }
  };

  // cp.async groups: W (the weights of chunks 0 .. kSw - 2, requested before the PDL wait),
  // then two a chunk j: A_j (the activations of chunk j) and B_j (the weights of chunk
  // j + kSw - kSx; empty for the first kSx - 1). A_j is group 2j after W, so chunk j has
  // landed once at most 2 kSx - 3 newer groups are pending (its weights are older: kSw > kSx).
#pragma unroll
  for (int c = 0; c < kSw - 1; ++c) issue_w(c, c);
  cp_async_commit();
  griddep_wait();
#pragma unroll
  for (int c = 0; c < kSx - 1; ++c) {
    issue_x(c, c);
    cp_async_commit();
    cp_async_commit();
  }
  cp_async_wait<2 * kSx - 3>();
  convert(0, 0);
  __syncthreads();

  // Lane l = thread bits 1 .. 4, the group's low bit = thread bit 0: threads tid and tid ^ 1
  // (groups 2w and 2w + 1 of warp w: the same gm) load the same weight slot, which halves an
  // LDS.128's wavefronts on sm_90 (4 -> 2: tools/probes/lds_probe.cu, perf-notes v39).
  const int l = (tid >> 1) & 15, g = ((tid >> 5) << 1) | (tid & 1), gm = g >> 2, gn = g & 3;
  const int wl = xf::ilv_read(0, l);  // lane l's slot in group 0 (interleaved)
  float acc[TM][TN];
#pragma unroll
  for (int mi = 0; mi < TM; ++mi) {
#pragma unroll
    for (int ni = 0; ni < TN; ++ni) acc[mi][ni] = 0.0f;
  }
  // Stages: x_in / w_in take chunk c + kSx - 1 / c + kSw - 1, x_c holds chunk c, w_next chunk c
  // + 1.
  int x_in = kSx - 1, w_in = kSw - 1, x_c = 0, w_next = 1 % kSw;
  for (int c = 0; c < n_chunks; ++c) {
    // Stages x_in and w_in were last read in chunk c - 1 (its math, its conversion), before the
    // barrier that ended it.
    issue_x(c + kSx - 1, x_in);
    cp_async_commit();
    issue_w(c + kSw - 1, w_in);
    cp_async_commit();
    const float* const wf = ws + (c & 1) * kBM * G::kWLd + gm * TM * G::kWLd;
    const float* const xf = xs + x_c * kXStage + gn * G::kXLd;
    if constexpr (!kBf) {
      // group q: each weight slot and each activation slot (x permuted: tb_permute) holds
      // steps kk = 64q + 16s, s = 0 .. 3, in order; each chain acc[mi][ni] takes them in that
      // order (the loops over ni and mi only interleave different chains)
#pragma unroll
      for (int q = 0; q < kK / 64; ++q) {
        float4 a4[TM];
#pragma unroll
        for (int mi = 0; mi < TM; ++mi)
          a4[mi] = *reinterpret_cast<const float4*>(wf + mi * G::kWLd + xf::ilv_read(q, 0) + wl);
#pragma unroll
        for (int ni = 0; ni < TN; ++ni) {
          const float4 b4 =
              *reinterpret_cast<const float4*>(xf + 4 * ni * G::kXLd + 64 * q + 4 * l);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const float b = s == 0 ? b4.x : (s == 1 ? b4.y : (s == 2 ? b4.z : b4.w));
#pragma unroll
            for (int mi = 0; mi < TM; ++mi) {
              const float a =
                  s == 0 ? a4[mi].x : (s == 1 ? a4[mi].y : (s == 2 ? a4[mi].z : a4[mi].w));
              acc[mi][ni] = xf::fma_step(acc[mi][ni], a, b);
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kK; kk += 32) {
        float2 a[TM], b[TN];
#pragma unroll
        for (int mi = 0; mi < TM; ++mi)
          a[mi] = *reinterpret_cast<const float2*>(wf + mi * G::kWLd + kk + 2 * l);
#pragma unroll
        for (int ni = 0; ni < TN; ++ni)
          b[ni] = *reinterpret_cast<const float2*>(xf + 4 * ni * G::kXLd + kk + 2 * l);
#pragma unroll
        for (int mi = 0; mi < TM; ++mi) {
#pragma unroll
          for (int ni = 0; ni < TN; ++ni)
            acc[mi][ni] = xf::dpbf16_step(acc[mi][ni], a[mi].x, b[ni].x, a[mi].y, b[ni].y);
        }
      }
    }
    if (c + 1 < n_chunks) {
      // Chunk c + 1 has landed (A_{c+1} and what is older); float stage (c + 1) & 1 was last
      // read in chunk c - 1.
      cp_async_wait<2 * kSx - 3>();
      convert(w_next, (c + 1) & 1);
      __syncthreads();
    }
    x_in = x_in + 1 == kSx ? 0 : x_in + 1;
    w_in = w_in + 1 == kSw ? 0 : w_in + 1;
    x_c = x_c + 1 == kSx ? 0 : x_c + 1;
    w_next = w_next + 1 == kSw ? 0 : w_next + 1;
  }
  // hsum16 over the 16 lanes of the group, lane bits 3, 2, 1, 0 (thread xor 16, 8, 4, 2: the pairs
  // of the reference's tree; a + b == b + a), as a transposing reduction: at each level a lane
  // keeps half of its outputs (the half picked by its lane bit) and adds the partner's value of
  // those, sending its own of the other half. Output o = mi + TM * ni (kN of them) ends in
  // lane o / kQ: lane l holds outputs kQ * l .. kQ * l + kQ - 1.
  constexpr int kN = TM * TN, kQ = kN / 16;
  float v[kN];
#pragma unroll
  for (int o = 0; o < kN; ++o) v[o] = acc[o % TM][o / TM];
  fold_half<kN, 3>(v, l);
  fold_half<kN / 2, 2>(v, l);
  fold_half<kN / 4, 1>(v, l);
  fold_half<kN / 8, 0>(v, l);
#pragma unroll
  for (int i = 0; i < kQ; ++i) {
    const int o = kQ * l + i;
    const int r = m0 + gm * TM + o % TM, t = n0 + gn + 4 * (o / TM);
    if (r < rows && t < n_tok) {
      const size_t idx = static_cast<size_t>(t) * static_cast<size_t>(rows) + r;
      y[idx] = accumulate ? xf::add_rn(y[idx], v[i]) : v[i];
    }
  }
}

// F32 / F16 weights: tinyblas_kernel's activations x [n_tok][cols] permuted into xp
// [n_tok][xcols] (xcols = xf::tb_perm_cols(cols)) so that in each 64-element group q, lane l's
// four steps are one 16-byte slot: element 64q + 16s + l goes to 64q + 4l + s
// (xf::tb_perm_pos), and the positions past cols hold the padding -0 (see above). The kernel's
// copies then move whole slots (the same 16-byte units as the raw rows: a warp's copies still
// read whole lines, perf-notes v41), and its math reads a token's four steps with one LDS.128
// instead of four LDS.32. rmsnorm_act and swiglu_act write xp themselves (ActBuf::fp_of); the
// other inputs (the attention's output for Wo) are permuted by this pass.
__global__ void tb_permute_kernel(const float* __restrict__ x, float* __restrict__ xp, int n_tok,
                                  int cols, int xcols) {
  griddep_wait();
  const size_t slots = static_cast<size_t>(xcols / 4), n = static_cast<size_t>(n_tok) * slots;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = i / slots;
    // slot j (floats 4j .. 4j + 3) holds elements e0 + 16s, s = 0 .. 3
    const int j = static_cast<int>(i % slots), e0 = 64 * (j >> 4) + (j & 15);
    static_assert(xf::tb_perm_pos(64 + 16 * 2 + 5) == 64 + 4 * 5 + 2, "slot 16 + 5, element 2");
    const float* const src = x + t * static_cast<size_t>(cols);
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = e0 + 16 * k < cols ? src[e0 + 16 * k] : -0.0f;
    reinterpret_cast<float4*>(xp + t * static_cast<size_t>(xcols))[j] =
        make_float4(v[0], v[1], v[2], v[3]);
  }
}

template <GgmlType T, int TM, int TN, bool kVec>
void launch_tb_tile(const TbSegs& sg, int blocks, int cols, const float* x, int xcols, int n_tok,
                    int acc, cudaStream_t st) {
  using G = TbGeom<T, TM, TN>;
  auto* kernel = tinyblas_kernel<T, TM, TN, kVec>;
  constexpr size_t kPadded = one_block_per_sm_smem(G::kSmem);
  static const bool attr_set = [kernel] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kPadded)));
    return true;
  }();
  (void)attr_set;
  const dim3 grid(static_cast<unsigned>(blocks),
                  static_cast<unsigned>((n_tok + G::kBN - 1) / G::kBN));
  // A grid no larger than the SMs runs one block an SM (launch.cuh).
  launch_pdl_smem("exact_float_tinyblas", kernel, grid, dim3(kTbThreads),
                  smem_for_grid(grid, G::kSmem), st, sg, cols, x, xcols, n_tok, acc);
}

// One tinyBLAS launch over the n weights ws[i] (one type, one width) into ys[i]. 32 x 32 tiles
// unless the batch would leave them mostly padding (<= 16 tokens) or their grid would not give
// half the SMs a block; then 16 x 16 (H100, kernel_bench, F16 us, 32 x 32 / 16 x 16: 4864 x 896
// at 8 tokens 20.4 / 13.5, at 32 21.6 / 24.2; 896 x 4864 at 32 tokens 70.9 / 40.7, at 64 71.1 /
// 68.4, at 128 71.5 / 101.5).
// xp: x's rows permuted (ActBuf::fp: n_tok x xf::tb_perm_cols(cols) floats; F32 / F16 only),
// already written where `permuted`, else by tb_permute_kernel here.
template <GgmlType T, bool kVec>
void launch_tinyblas(const WeightView* const* ws, float* const* ys, int n, const float* x,
                     float* xp, bool permuted, int n_tok, bool accumulate, cudaStream_t st) {
  using Big = TbGeom<T, 8, 8>;
  TbSegs sg;
  for (int i = 0; i < n; ++i) {
    sg.w[i] = static_cast<const uint8_t*>(ws[i]->data);
    sg.y[i] = ys[i];
    sg.row_bytes[i] = ws[i]->row_bytes;
    sg.rows[i] = static_cast<int>(ws[i]->rows);
  }
  // The weights' block ranges for tiles of bm rows; the grid's x size.
  const auto set_blocks = [&](int bm) {
    int blocks = 0;
    for (int i = 0; i < 3; ++i) {
      blocks += (sg.rows[i] + bm - 1) / bm;  // 0 for unused slots (rows 0)
      sg.blk_end[i] = blocks;
    }
    return blocks;
  };
  const int cols = static_cast<int>(ws[0]->cols), acc = accumulate ? 1 : 0;
  int xcols = cols;
  if constexpr (Big::kIlv) {
    if (xp == nullptr) {
      throw WorkerError(ErrorCode::Internal, "exact::matmul_float: tinyBLAS without ActBuf::fp");
    }
    xcols = xf::tb_perm_cols(cols);
    if (!permuted) {
      const size_t slots = static_cast<size_t>(n_tok) * static_cast<size_t>(xcols / 4);
      const dim3 grid(static_cast<unsigned>(std::min<size_t>((slots + 255) / 256, 65535)));
      launch_pdl("exact_float_tb_permute", tb_permute_kernel, grid, dim3(256), st, x, xp, n_tok,
                 cols, xcols);
    }
    x = xp;
  }
  const int blocks_big = set_blocks(Big::kBM);
  const int64_t grid_big = static_cast<int64_t>(blocks_big) * ((n_tok + Big::kBN - 1) / Big::kBN);
  if (n_tok > 16 && 2 * grid_big >= sm_count()) {
    launch_tb_tile<T, 8, 8, kVec>(sg, blocks_big, cols, x, xcols, n_tok, acc, st);
  } else {
    const int blocks_small = set_blocks(TbGeom<T, 4, 4>::kBM);
    launch_tb_tile<T, 4, 4, kVec>(sg, blocks_small, cols, x, xcols, n_tok, acc, st);
  }
}

template <GgmlType T, bool kVec>
void launch_typed(const WeightView& w, const float* x, float* xp, bool permuted, int n_tok,
                  bool tiny, float* y, bool accumulate, cudaStream_t st) {
  const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const int acc = accumulate ? 1 : 0;
  if (tiny) {
    const WeightView* ws[1] = {&w};
    float* ys[1] = {y};
    launch_tinyblas<T, kVec>(ws, ys, 1, x, xp, permuted, n_tok, accumulate, st);
  } else if (n_tok == 1) {
    const int rpb = rows < kVdSmallRows ? kVdRows / 2 : kVdRows;
    const dim3 grid((rows + rpb - 1) / rpb, 1);
    launch_pdl("exact_float_vecdot", vecdot_kernel<T, 1, kVec>, grid, dim3(rpb * 8), st, wp, rows,
               cols, w.row_bytes, x, n_tok, y, acc);
  } else {
    constexpr int kNT = 4;
    const dim3 grid((rows + kVdRows - 1) / kVdRows, (n_tok + kNT - 1) / kNT);
    launch_pdl("exact_float_vecdot", vecdot_kernel<T, kNT, kVec>, grid, dim3(kVdThreads), st, wp,
               rows, cols, w.row_bytes, x, n_tok, y, acc);
  }
}

// 16-byte loads need 16-byte aligned rows and activation rows.
bool vec_loads(const WeightView& w, const float* x) {
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && w.cols % 4 == 0;
}

template <GgmlType T>
void launch_type(const WeightView& w, const ActBuf& a, int n_tok, bool tiny, float* y,
                 bool accumulate, cudaStream_t st) {
  if (vec_loads(w, a.f)) {
    launch_typed<T, true>(w, a.f, a.fp, a.fp_holds_f(), n_tok, tiny, y, accumulate, st);
  } else {
    launch_typed<T, false>(w, a.f, a.fp, a.fp_holds_f(), n_tok, tiny, y, accumulate, st);
  }
}

// f(traits) for a float weight type (F32 / F16 / BF16: gguf/type_traits.h's dispatch); false
// (f not called) for the others.
template <class F>
bool with_float_type(uint32_t type, F&& f) {
  bool done = false;
  dispatch(type, [&](auto tr) {
    if constexpr (decltype(tr)::kFamily == DotFamily::Float) {
      f(tr);
      done = true;
    }
  });
  return done;
}

// A float weight the kernels take: rows, cols and row_bytes in range (int indexing).
bool float_weight_ok(const WeightView& w) {
  size_t elem = 0;
  if (!with_float_type(w.type, [&](auto tr) { elem = decltype(tr)::kBlockBytes; })) return false;
  return w.rows > 0 && w.cols > 0 && w.rows <= INT32_MAX / 2 && w.cols <= INT32_MAX / 4 &&
         w.row_bytes >= static_cast<size_t>(w.cols) * elem;
}

}  // namespace

namespace detail {

void matmul_float(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order,
                  float* y, bool accumulate, cudaStream_t stream) {
  if (!with_float_type(w.type, [](auto) {})) {
    throw WorkerError(ErrorCode::Internal, std::string("exact::matmul_float: weight type ") +
                                               std::string(ggml_type_name(w.type)) +
                                               " is not F32/F16/BF16");
  }
  if (!float_weight_ok(w) || n_tok < 0 || n_tok > 65535 * 4 || order.batch_n < n_tok ||
      order.t0 < 0 || order.t0 + n_tok > order.batch_n) {
    throw WorkerError(ErrorCode::Internal,
                      "exact::matmul_float: bad shape (rows " + std::to_string(w.rows) + ", cols " +
                          std::to_string(w.cols) + ", row_bytes " + std::to_string(w.row_bytes) +
                          ", n_tok " + std::to_string(n_tok) + ", batch_n " +
                          std::to_string(order.batch_n) + ", t0 " + std::to_string(order.t0) + ")");
  }
  if (n_tok == 0) return;
  // The CPU reference picks tinyBLAS from the whole batch's token count (matmul.cuh).
  const bool tiny = xf::tinyblas_takes(w.type, w.rows, order.batch_n, w.cols);
  with_float_type(w.type, [&](auto tr) {
    launch_type<decltype(tr)::kType>(w, a, n_tok, tiny, y, accumulate, stream);
  });
}

bool matmul_float_multi(const WeightView* const* ws, float* const* ys, int n, const ActBuf& a,
                        int n_tok, const BatchOrder& order, cudaStream_t stream) {
  if (n < 1 || n > 3 || n_tok < 1 || n_tok > 65535 * 4 || order.t0 != 0 || order.batch_n != n_tok) {
    return false;
  }
  bool vec = true;
  for (int i = 0; i < n; ++i) {
    const WeightView& w = *ws[i];
    if (w.type != ws[0]->type || w.cols != ws[0]->cols || !float_weight_ok(w) ||
        !xf::tinyblas_takes(w.type, w.rows, n_tok, w.cols)) {
      return false;
    }
    vec = vec && vec_loads(w, a.f);
  }
  return with_float_type(ws[0]->type, [&](auto tr) {
    constexpr GgmlType T = decltype(tr)::kType;
    if (vec) {
      launch_tinyblas<T, true>(ws, ys, n, a.f, a.fp, a.fp_holds_f(), n_tok, false, stream);
    } else {
      launch_tinyblas<T, false>(ws, ys, n, a.f, a.fp, a.fp_holds_f(), n_tok, false, stream);
    }
  });
}

}  // namespace detail
}  // namespace worker::kern::exact
