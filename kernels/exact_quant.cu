// Exact kernels for quantized weights (see exact.cuh): activation quantization and the
// quantized matmul, bit for bit the floats of the CPU reference (worker/engine/cpu/
// act_quant.cpp).
//
// quantize_act: cpu::quantize_activation row by row.
//  - F32 / F16 / BF16: elementwise copy / round to nearest even (__float2half_rn,
//    __float2bfloat16_rn: the same rounding as fp32_to_fp16 / fp32_to_bf16).
//  - Q8_0 (for Q8_0 / Q4_0 / Q5_0 weights): one warp per 32-block, amax by warp max (max is
//    exact in any order), d = amax / 127 (IEEE division) rounded through fp16,
//    q = round-half-even(x * (127 / amax)).
//  - Q8_K (Q4_K / Q6_K): one warp per 256-block; the element of largest |x|, first in index
//    order on ties (the CPU's strict >: each lane scans its 8 elements in order, lanes merge
//    with the lower lane winning ties), iscale = -127 / max, q = min(127, rint(iscale * x)),
//    bsum per 16 (integers), d = 1 / iscale.
//
// matmul (quantized): one warp per weight row and per tile of NT tokens. The reference's
// float steps are independent chains (its SIMD lanes) that each run over the blocks in
// order; what feeds a chain step is an integer (exact in any order, so computed in
// parallel with dp4a) and a float scale (one product, as the reference forms it). The warp
// walks the row in chunks: (1) every lane computes the integer slots and scales of its
// blocks (Q8_0/Q4_0/Q5_0: one 32-block per lane; Q4_K/Q6_K: one 32-element sub-block per
// lane, 8 lanes per super-block, their partial integers summed with shuffles) for each
// token, into shared memory; (2) one lane per (token, chain) runs the chain's steps over the
// chunk's blocks in order, with the reference's fma. At the end each (row, token) gathers its
// chains and combines them in the reference's fixed tree. Orders reproduced
// (exact_quant_math.cuh, Flavor):
//  - Q0Lanes (Q8_0, Q5_0, Q4_0 with rows % 8 != 0): dot_q0_lanes: 8 chains,
//    acc[i] = fma(d_w * d_a, float(int dot of elements 4i..4i+3), acc[i]); hsum_float_8.
//  - Q4_0Rep (Q4_0 repacked, rows % 8 == 0): dot_q4_0_repack: one chain,
//    acc = fma(float(block int dot), d_w * d_a, acc).
//  - Q6K: dot_q6_k: 8 chains over super-blocks, lane ints with the bsum correction of lane t,
//    acc[t] = fma(d_a * d_w, float(lane t), acc[t]); hsum_float_8.
//  - Q4KLanes (Q4_K, rows % 8 != 0): dot_q4_k: 8 lane chains (d_a * d) and 4 min chains
//    (-d_a * dmin); hsum8(acc) + ((m0 + m2) + (m1 + m3)).
//  - Q4KRep (Q4_K repacked): dot_q4_k_repack: acc / accm chains with one step per
//    super-block (gemv: tokens with batch index >= batch_n - batch_n % 4) or one per
//    64-element pair (gemm: the other tokens); result acc - accm.
// The file is compiled with -fmad=false: every fma is explicit, products and sums are
// rounded on their own as in the reference. Deterministic: no atomics, fixed orders.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_quant_math.cuh"
#include "launch.cuh"

namespace worker::kern::exact {

namespace {

constexpr unsigned kFull = 0xffffffffu;

size_t align256(size_t n) {
  return (n + 255) & ~size_t{255};
}

// ---------------------------------------------------------------------------------------
// quantize_act

template <int R>  // 0 copy, 1 fp16, 2 bf16
__global__ void act_float_kernel(const float* __restrict__ x, float* __restrict__ f, size_t n) {
  griddep_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    if constexpr (R == 0)
      f[i] = v;
    else if constexpr (R == 1)
      f[i] = __half2float(__float2half_rn(v));
    else
      f[i] = __bfloat162float(__float2bfloat16_rn(v));
  }
}

constexpr int kActThreads = 256;

// One warp per 32-block; blocks are numbered over the whole [n_tok][cols] array (a row's
// blocks are contiguous and rows follow each other, in x as in a.q / a.d).
__global__ void __launch_bounds__(kActThreads)
    act_q8_0_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ d,
                    size_t n_blocks) {
  griddep_wait();
  const int lane = threadIdx.x % kWarp;
  const size_t warps = static_cast<size_t>(gridDim.x) * (kActThreads / kWarp);
  for (size_t k = blockIdx.x * static_cast<size_t>(kActThreads / kWarp) + threadIdx.x / kWarp;
       k < n_blocks; k += warps) {
    const float v = x[k * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float id = qm::q8_0_id(amax);
    q[k * 32 + lane] = qm::q8_0_quant(v, id);
    if (lane == 0) d[k] = __half2float(__float2half_rn(amax / 127.f));
  }
}

// One warp per 256-block, lane l holding elements 8l..8l+7.
__global__ void __launch_bounds__(kActThreads)
    act_q8_k_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ d,
                    int32_t* __restrict__ bsum, size_t n_blocks) {
  griddep_wait();
  const int lane = threadIdx.x % kWarp;
  const size_t warps = static_cast<size_t>(gridDim.x) * (kActThreads / kWarp);
  for (size_t k = blockIdx.x * static_cast<size_t>(kActThreads / kWarp) + threadIdx.x / kWarp;
       k < n_blocks; k += warps) {
    const float4* xp = reinterpret_cast<const float4*>(x + k * 256 + 8 * lane);
    const float4 a = xp[0], b = xp[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    float amax = 0.0f, mx = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // the CPU's scan: strict >, first in index order wins
      const float ax = fabsf(v[i]);
      if (ax > amax) {
        amax = ax;
        mx = v[i];
      }
    }
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const float oa = __shfl_xor_sync(kFull, amax, o);
      const float om = __shfl_xor_sync(kFull, mx, o);
      // aligned groups: the partner holds lower indices iff its lane is lower
      if (oa > amax || (oa == amax && (lane ^ o) < lane)) {
        amax = oa;
        mx = om;
      }
    }
    int8_t qv[8];
    int s = 0;
    if (amax != 0.0f) {
      const float iscale = -127.f / mx;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        qv[i] = qm::q8_k_quant(v[i], iscale);
        s += qv[i];
      }
      if (lane == 0) d[k] = 1 / iscale;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) qv[i] = 0;
      if (lane == 0) d[k] = 0.0f;
    }
    uint2 packed;
    packed.x = (static_cast<uint32_t>(static_cast<uint8_t>(qv[0]))) |
               (static_cast<uint32_t>(static_cast<uint8_t>(qv[1])) << 8) |
               (static_cast<uint32_t>(static_cast<uint8_t>(qv[2])) << 16) |
               (static_cast<uint32_t>(static_cast<uint8_t>(qv[3])) << 24);
    packed.y = (static_cast<uint32_t>(static_cast<uint8_t>(qv[4]))) |
               (static_cast<uint32_t>(static_cast<uint8_t>(qv[5])) << 8) |
               (static_cast<uint32_t>(static_cast<uint8_t>(qv[6])) << 16) |
               (static_cast<uint32_t>(static_cast<uint8_t>(qv[7])) << 24);
    *reinterpret_cast<uint2*>(q + k * 256 + 8 * lane) = packed;
    s += __shfl_xor_sync(kFull, s, 1);  // sums of 16: lanes 2j and 2j+1
    if ((lane & 1) == 0) bsum[k * 16 + lane / 2] = s;
  }
}

int grid_for(size_t work_items, int per_block) {
  const size_t b =
      (work_items + static_cast<size_t>(per_block) - 1) / static_cast<size_t>(per_block);
  return static_cast<int>(std::min<size_t>(std::max<size_t>(b, 1), 65535));
}

// ---------------------------------------------------------------------------------------
// matmul

using qm::Flavor;
using qm::FlavorInfo;

constexpr int kMMWarps = 4;

// Blocks per chunk: Q0 types one 32-block per lane; K-quants 8 super-blocks (two passes of
// 4 super-blocks x 8 sub-block lanes).
template <GgmlType T>
__host__ __device__ constexpr bool is_k() {
  return T == GgmlType::Q4_K || T == GgmlType::Q6_K;
}
template <GgmlType T>
__host__ __device__ constexpr int chunk_blocks() {
  return is_k<T>() ? 8 : 32;
}
template <GgmlType T>
__host__ __device__ constexpr int passes() {
  return is_k<T>() ? 2 : 1;
}

template <GgmlType T, bool REP>
__host__ __device__ constexpr Flavor flavor_of() {
  if constexpr (T == GgmlType::Q6_K)
    return Flavor::Q6K;
  else if constexpr (T == GgmlType::Q4_K)
    return REP ? Flavor::Q4KRep : Flavor::Q4KLanes;
  else if constexpr (T == GgmlType::Q4_0 && REP)
    return Flavor::Q4_0Rep;
  else
    return Flavor::Q0Lanes;
}

// Weight registers of one lane's unit (a Q0 block, or one sub-block of a K super-block).
struct WRegs {
  uint32_t h = 0;      // fp16 d (Q0, Q6_K), or d | dmin << 16 (Q4_K)
  uint32_t a[8] = {};  // Q8_0 qs; Q4_0 qs[0..3]; Q5_0 qh, qs[0..3]; Q4_K qs of the pair; Q6_K ql
  uint32_t b[8] = {};  // Q4_K: the 12 scale bytes in b[0..2]; Q6_K: qh
  uint32_t sc = 0;     // Q6_K: int8 scales 2g, 2g+1
};

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}

// Loads unit `u` of lane: Q0: block u; K: super-block u, sub-block s.
template <GgmlType T>
__device__ __forceinline__ void load_unit(const uint8_t* row, int u, int s, WRegs& r) {
  if constexpr (T == GgmlType::Q8_0) {
    const uint8_t* p = row + static_cast<size_t>(u) * 34;
    r.h = ld_u16(p);
    uint32_t w[8];
    load_words(p + 2, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) r.a[i] = w[i];
  } else if constexpr (T == GgmlType::Q4_0) {
    const uint8_t* p = row + static_cast<size_t>(u) * 18;
    r.h = ld_u16(p);
    uint32_t w[4];
    load_words(p + 2, w);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.a[i] = w[i];
  } else if constexpr (T == GgmlType::Q5_0) {
    const uint8_t* p = row + static_cast<size_t>(u) * 22;
    r.h = ld_u16(p);
    uint32_t w[5];
    load_words(p + 2, w);
#pragma unroll
    for (int i = 0; i < 5; ++i) r.a[i] = w[i];
  } else if constexpr (T == GgmlType::Q4_K) {
    const uint8_t* p = row + static_cast<size_t>(u) * 144;
    uint32_t hw[4];
    load_words(p, hw);
    r.h = hw[0];
    r.b[0] = hw[1];
    r.b[1] = hw[2];
    r.b[2] = hw[3];
    uint32_t w[8];
    load_words(p + 16 + 32 * (s >> 1), w);
#pragma unroll
    for (int i = 0; i < 8; ++i) r.a[i] = w[i];
  } else {  // Q6_K
    const uint8_t* p = row + static_cast<size_t>(u) * 210;
    uint32_t ql[8], qh[8];
    load_words(p + qm::q6k_ql_off(s), ql);
    load_words(p + qm::q6k_qh_off(s), qh);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      r.a[i] = ql[i];
      r.b[i] = qh[i];
    }
    r.sc = ld_u16(p + 192 + 2 * s);
    r.h = ld_u16(p + 208);
  }
}

__device__ __forceinline__ void load_y32(const int8_t* p, uint32_t (&y)[8]) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
  const uint4 a = q[0], b = q[1];
  y[0] = a.x;
  y[1] = a.y;
  y[2] = a.z;
  y[3] = a.w;
  y[4] = b.x;
  y[5] = b.y;
  y[6] = b.z;
  y[7] = b.w;
}

// p[] summed over the 8 lanes of an aligned group; lane s of the group returns the total of
// index s (recursive halving: 4 + 2 + 1 shuffles). Integers: exact in any order.
__device__ __forceinline__ int reduce8_transpose(const int (&p)[8], int s) {
  int v4[4], v2[2];
  const bool h4 = (s & 4) != 0, h2 = (s & 2) != 0, h1 = (s & 1) != 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int send = h4 ? p[i] : p[i + 4];
    const int keep = h4 ? p[i + 4] : p[i];
    v4[i] = keep + __shfl_xor_sync(kFull, send, 4);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int send = h2 ? v4[i] : v4[i + 2];
    const int keep = h2 ? v4[i + 2] : v4[i];
    v2[i] = keep + __shfl_xor_sync(kFull, send, 2);
  }
  const int send = h1 ? v2[0] : v2[1];
  const int keep = h1 ? v2[1] : v2[0];
  return keep + __shfl_xor_sync(kFull, send, 1);
}

// The integer slots and scales of one chunk (blocks [c0, c0 + CB)) for the nt tokens, into
// S[CB][NT][SL] and F[CB][NT][NF]. Every lane of the warp calls it (K-quants shuffle).
template <GgmlType T, bool REP, int NT>
__device__ __forceinline__ void chunk_ints(const WRegs (&wr)[passes<T>()], int c0, int nb, int cols,
                                           const int8_t* __restrict__ aq,
                                           const float* __restrict__ ad,
                                           const int32_t* __restrict__ abs, int tok0, int nt,
                                           int* S, float* F) {
  constexpr Flavor FL = flavor_of<T, REP>();
  constexpr int SL = FlavorInfo<FL>::kSlots, NF = FlavorInfo<FL>::kScales;
  const int lane = threadIdx.x % kWarp;
  if constexpr (!is_k<T>()) {
    const int b = c0 + lane;
    if (b >= nb) return;
    const WRegs& r = wr[0];
    const float dw = qm::half_bits(r.h);
#pragma unroll 2
    for (int t = 0; t < nt; ++t) {
      const size_t tok = static_cast<size_t>(tok0 + t);
      uint32_t y[8];
      load_y32(aq + tok * static_cast<size_t>(cols) + 32 * static_cast<size_t>(b), y);
      const float da = ad[tok * static_cast<size_t>(nb) + b];
      int s[8];
      if constexpr (T == GgmlType::Q8_0) {
        qm::q8_0_ints(r.a, y, s);
      } else if constexpr (T == GgmlType::Q4_0) {
        const uint32_t w[4] = {r.a[0], r.a[1], r.a[2], r.a[3]};
        qm::q4_0_ints(w, y, s);
      } else {
        const uint32_t w[4] = {r.a[1], r.a[2], r.a[3], r.a[4]};
        qm::q5_0_ints(r.a[0], w, y, s);
      }
      if constexpr (FL == Flavor::Q4_0Rep) {  // one slot: the block's integer dot
        S[lane * NT + t] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      } else {
        int4* dst = reinterpret_cast<int4*>(S + (lane * NT + t) * SL);
        dst[0] = make_int4(s[0], s[1], s[2], s[3]);
        dst[1] = make_int4(s[4], s[5], s[6], s[7]);
      }
      F[(lane * NT + t) * NF] = dw * da;
    }
  } else {
    const int s = lane & 7;
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int bl = it * 4 + (lane >> 3);  // block within the chunk
      const int sb = c0 + bl;
      const bool valid = sb < nb;
      const WRegs& r = wr[it];
      int sc = 0, mn = 0;
      if constexpr (T == GgmlType::Q4_K) {
        const uint32_t hw[3] = {r.b[0], r.b[1], r.b[2]};
        qm::q4k_scale_min_w(s, hw, sc, mn);
      }
      for (int t = 0; t < nt; ++t) {  // nt is warp-uniform: the shuffles run on every lane
        const size_t tok = static_cast<size_t>(tok0 + t);
        int p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int msub = 0;
        float yd = 0.0f;
        if (valid) {
          uint32_t y[8];
          load_y32(aq + tok * static_cast<size_t>(cols) + 256 * static_cast<size_t>(sb) + 32 * s,
                   y);
          const int2 bs = *reinterpret_cast<const int2*>(
              abs + tok * static_cast<size_t>(cols / 16) + 16 * static_cast<size_t>(sb) + 2 * s);
          yd = ad[tok * static_cast<size_t>(nb) + sb];
          if constexpr (T == GgmlType::Q4_K) {
            qm::q4k_sub_partials(s, sc, r.a, y, p);
            msub = mn * (bs.x + bs.y);
          } else {
            const int sc0 = static_cast<int8_t>(r.sc & 0xFF);
            const int sc1 = static_cast<int8_t>((r.sc >> 8) & 0xFF);
            qm::q6k_sub_partials(s, r.a, r.b, sc0, sc1, bs.x, bs.y, y, p);
          }
        }
        int* Sd = S + (bl * NT + t) * SL;
        float* Fd = F + (bl * NT + t) * NF;
        if constexpr (FL == Flavor::Q4KRep) {
          int tot = 0;
#pragma unroll
          for (int i = 0; i < 8; ++i) tot += p[i];
          tot += __shfl_xor_sync(kFull, tot, 1);  // pair j = sub-blocks 2j, 2j+1
          msub += __shfl_xor_sync(kFull, msub, 1);
          if (valid && (s & 1) == 0) {
            Sd[s >> 1] = tot;
            Sd[8 + (s >> 1)] = msub;
          }
        } else {
          const int lane_int = reduce8_transpose(p, s);
          if constexpr (FL == Flavor::Q4KLanes) {
            msub += __shfl_xor_sync(kFull, msub, 1);
            if (valid && (s & 1) == 0) Sd[8 + (s >> 1)] = msub;
          }
          if (valid) Sd[s] = lane_int;
        }
        if (valid && s == 0) {
          if constexpr (T == GgmlType::Q6_K) {
            Fd[0] = yd * qm::half_bits(r.h);
          } else if constexpr (FL == Flavor::Q4KLanes) {
            Fd[0] = yd * qm::half_bits(r.h);
            Fd[1] = -yd * qm::half_bits(r.h >> 16);
          } else {
            Fd[0] = qm::half_bits(r.h) * yd;
            Fd[1] = qm::half_bits(r.h >> 16) * yd;
          }
        }
      }
    }
  }
}

// Lanes per token in the chain phase (a power of two >= the chain count).
template <Flavor FL>
__host__ __device__ constexpr int lanes_per_tok() {
  constexpr int c = FlavorInfo<FL>::kChains;
  return c <= 1 ? 1 : (c <= 2 ? 2 : (c <= 8 ? 8 : 16));
}

// The chain phase over blocks [0, cnt) of S / F (layout [block][NT][slots]): lane
// (token slot ts, chain ch) steps its chains of the tokens ts, ts + TPP, ... in block order.
template <Flavor FL, int NT>
__device__ __forceinline__ void run_chains(const int* S, const float* F, int cnt, int nt,
                                           const bool* gemm, float* acc) {
  constexpr int SL = FlavorInfo<FL>::kSlots, NF = FlavorInfo<FL>::kScales;
  constexpr int C = FlavorInfo<FL>::kChains;
  constexpr int LPT = lanes_per_tok<FL>();
  constexpr int TPP = kWarp / LPT;
  constexpr int NP = (NT + TPP - 1) / TPP;
  const int lane = threadIdx.x % kWarp;
  const int ch = lane % LPT, ts = lane / LPT;
  if (ch >= C) return;
#pragma unroll 4
  for (int b = 0; b < cnt; ++b) {
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      const int t = p * TPP + ts;
      if (t < nt) {
        acc[p] =
            qm::chain_step<FL>(ch, S + (b * NT + t) * SL, F + (b * NT + t) * NF, gemm[p], acc[p]);
      }
    }
  }
}

// Gathers each (row, token)'s chains into its first lane, combines them in the reference's
// tree and writes y (every lane of the warp calls it: shuffles).
template <Flavor FL, int NT>
__device__ __forceinline__ void combine_store(const float* acc, int nt, int tok0, int r, int rows,
                                              float* __restrict__ y, int accumulate) {
  constexpr int C = FlavorInfo<FL>::kChains;
  constexpr int LPT = lanes_per_tok<FL>();
  constexpr int TPP = kWarp / LPT;
  constexpr int NP = (NT + TPP - 1) / TPP;
  const int lane = threadIdx.x % kWarp;
  const int ch = lane % LPT, ts = lane / LPT;
  const int base = lane & ~(LPT - 1);
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    float v[C];
#pragma unroll
    for (int k = 0; k < C; ++k) v[k] = __shfl_sync(kFull, acc[p], base + k);
    const int t = p * TPP + ts;
    if (ch == 0 && t < nt) {
      const float res = qm::combine<FL>(v);
      float* out = y + static_cast<size_t>(tok0 + t) * static_cast<size_t>(rows) + r;
      *out = accumulate ? *out + res : res;
    }
  }
}

// Loads the weights of chunk c0 (blocks [c0, c0 + CB)) this lane computes.
template <GgmlType T>
__device__ __forceinline__ void load_chunk(const uint8_t* row, int c0, int nb,
                                           WRegs (&wr)[passes<T>()]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int it = 0; it < passes<T>(); ++it) {
    const int u = is_k<T>() ? c0 + it * 4 + (lane >> 3) : c0 + lane;
    if (u < nb) load_unit<T>(row, u, lane & 7, wr[it]);
  }
}

// Any token count: one warp per (row, tile of NT tokens); the warp walks the row in chunks
// (slots of chunk c + 1's weights are loaded while chunk c's chains run).
template <GgmlType T, bool REP, int NT>
__global__ void __launch_bounds__(kMMWarps* kWarp)
    qmm_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
               const int8_t* __restrict__ aq, const float* __restrict__ ad,
               const int32_t* __restrict__ abs, int n_tok, int gemm_end, float* __restrict__ y,
               int accumulate) {
  constexpr Flavor FL = flavor_of<T, REP>();
  constexpr int SL = FlavorInfo<FL>::kSlots, NF = FlavorInfo<FL>::kScales;
  constexpr int CB = chunk_blocks<T>();
  constexpr int LPT = lanes_per_tok<FL>();
  constexpr int TPP = kWarp / LPT;          // tokens per chain pass
  constexpr int NP = (NT + TPP - 1) / TPP;  // chain passes
  __shared__ __align__(16) int s_int[kMMWarps][CB * NT * SL];
  __shared__ float s_f[kMMWarps][CB * NT * NF];

  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kMMWarps + warp;
  if (r >= rows) return;  // warp-uniform; no block-wide barriers below
  const int tok0 = blockIdx.y * NT;
  const int nt = min(NT, n_tok - tok0);
  const int nb = cols / (is_k<T>() ? 256 : 32);
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  int* S = s_int[warp];
  float* F = s_f[warp];

  WRegs wr[passes<T>()];
  // Weights are never written by a kernel: the first chunk's load overlaps the previous
  // kernel (PDL); activations and y are read only after the wait.
  load_chunk<T>(row, 0, nb, wr);
  griddep_wait();

  const int ts = lane / LPT;
  float acc[NP];
  bool gemm[NP];
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    acc[p] = 0.0f;
    gemm[p] = tok0 + p * TPP + ts < gemm_end;
  }
  for (int c0 = 0; c0 < nb; c0 += CB) {
    chunk_ints<T, REP, NT>(wr, c0, nb, cols, aq, ad, abs, tok0, nt, S, F);
    if (c0 + CB < nb) load_chunk<T>(row, c0 + CB, nb, wr);  // in flight during the chains
    __syncwarp();
    run_chains<FL, NT>(S, F, min(CB, nb - c0), nt, gemm, acc);
    __syncwarp();
  }
  combine_store<FL, NT>(acc, nt, tok0, r, rows, y, accumulate);
}

// One token, rows longer than one chunk (decode; e.g. FFN down): one row per block. The
// block's warps compute the slots of all the row's chunks at once (every weight load of the
// row in flight together) into shared memory, then warp 0 runs the chains over the whole
// row. Shared memory: nb * (slots + scales) words (dynamic).
template <GgmlType T, bool REP>
__global__ void __launch_bounds__(kMMWarps* kWarp)
    qmv_row_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                   const int8_t* __restrict__ aq, const float* __restrict__ ad,
                   const int32_t* __restrict__ abs, int gemm_end, float* __restrict__ y,
                   int accumulate) {
  constexpr Flavor FL = flavor_of<T, REP>();
  constexpr int SL = FlavorInfo<FL>::kSlots, NF = FlavorInfo<FL>::kScales;
  constexpr int CB = chunk_blocks<T>();
  extern __shared__ int4 s_raw[];
  const int nb = cols / (is_k<T>() ? 256 : 32);
  int* S = reinterpret_cast<int*>(s_raw);
  float* F = reinterpret_cast<float*>(S + nb * SL);
  const int warp = threadIdx.x / kWarp;
  const int r = blockIdx.x;
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  const int nchunks = (nb + CB - 1) / CB;

  WRegs wr[passes<T>()];
  if (warp < nchunks) load_chunk<T>(row, warp * CB, nb, wr);
  griddep_wait();
  for (int c = warp; c < nchunks; c += kMMWarps) {  // warp-uniform
    chunk_ints<T, REP, 1>(wr, c * CB, nb, cols, aq, ad, abs, 0, 1, S + c * CB * SL,
                          F + c * CB * NF);
    if (c + kMMWarps < nchunks) load_chunk<T>(row, (c + kMMWarps) * CB, nb, wr);
  }
  __syncthreads();
  if (warp != 0) return;
  float acc[1] = {0.0f};
  const bool gemm[1] = {0 < gemm_end};
  run_chains<FL, 1>(S, F, nb, 1, gemm, acc);
  combine_store<FL, 1>(acc, 1, 0, r, rows, y, accumulate);
}

template <GgmlType T, bool REP>
size_t row_kernel_smem(int cols) {
  constexpr Flavor FL = flavor_of<T, REP>();
  const size_t nb = static_cast<size_t>(cols / (is_k<T>() ? 256 : 32));
  return nb * (FlavorInfo<FL>::kSlots + FlavorInfo<FL>::kScales) * sizeof(int);
}

template <GgmlType T, bool REP, int NT>
void launch_qmm(const WeightView& w, const ActBuf& a, int n_tok, int gemm_end, float* y,
                bool accumulate, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((w.rows + kMMWarps - 1) / kMMWarps),
                  static_cast<unsigned>((n_tok + NT - 1) / NT));
  launch_pdl("exact_qmm_kernel", qmm_kernel<T, REP, NT>, grid, dim3(kMMWarps * kWarp), stream,
             static_cast<const uint8_t*>(w.data), static_cast<int>(w.rows),
             static_cast<int>(w.cols), w.row_bytes, static_cast<const int8_t*>(a.q),
             static_cast<const float*>(a.d), static_cast<const int32_t*>(a.bsum), n_tok, gemm_end,
             y, accumulate ? 1 : 0);
}

// Shared memory the one-row kernel may take without an opt-in (48 KB), with room to spare
// so that several blocks share an SM.
constexpr size_t kRowKernelMaxSmem = 40 * 1024;

template <GgmlType T, bool REP>
void launch_qmm_nt(const WeightView& w, const ActBuf& a, int n_tok, int gemm_end, float* y,
                   bool accumulate, cudaStream_t stream) {
  if (n_tok == 1) {
    const int nb = static_cast<int>(w.cols) / (is_k<T>() ? 256 : 32);
    const size_t smem = row_kernel_smem<T, REP>(static_cast<int>(w.cols));
    if (nb > chunk_blocks<T>() && smem <= kRowKernelMaxSmem) {
      launch_pdl_smem("exact_qmv_row_kernel", qmv_row_kernel<T, REP>,
                      dim3(static_cast<unsigned>(w.rows)), dim3(kMMWarps * kWarp), smem, stream,
                      static_cast<const uint8_t*>(w.data), static_cast<int>(w.rows),
                      static_cast<int>(w.cols), w.row_bytes, static_cast<const int8_t*>(a.q),
                      static_cast<const float*>(a.d), static_cast<const int32_t*>(a.bsum), gemm_end,
                      y, accumulate ? 1 : 0);
    } else {
      launch_qmm<T, REP, 1>(w, a, n_tok, gemm_end, y, accumulate, stream);
    }
  } else {
    launch_qmm<T, REP, 8>(w, a, n_tok, gemm_end, y, accumulate, stream);
  }
}

std::string type_name(uint32_t t) {
  return std::string(ggml_type_name(t));
}

}  // namespace

size_t act_buffer_bytes(int max_tok, int max_cols) {
  const size_t n = static_cast<size_t>(max_tok) * static_cast<size_t>(max_cols);
  const size_t nt = static_cast<size_t>(max_tok);
  const size_t mc = static_cast<size_t>(max_cols);
  return align256(n * sizeof(float)) + align256(n) + align256(nt * (mc / 32) * sizeof(float)) +
         align256(nt * (mc / 16) * sizeof(int32_t));
}

ActBuf act_buffer_at(void* base, int max_tok, int max_cols) {
  const size_t n = static_cast<size_t>(max_tok) * static_cast<size_t>(max_cols);
  const size_t nt = static_cast<size_t>(max_tok);
  const size_t mc = static_cast<size_t>(max_cols);
  auto* p = static_cast<uint8_t*>(base);
  ActBuf a;
  a.f = reinterpret_cast<float*>(p);
  p += align256(n * sizeof(float));
  a.q = reinterpret_cast<int8_t*>(p);
  p += align256(n);
  a.d = reinterpret_cast<float*>(p);
  p += align256(nt * (mc / 32) * sizeof(float));
  a.bsum = reinterpret_cast<int32_t*>(p);
  return a;
}

void quantize_act(uint32_t weight_type, const float* x, int n_tok, int cols, const ActBuf& a,
                  cudaStream_t stream) {
  if (n_tok <= 0 || cols <= 0) throw WorkerError(ErrorCode::Internal, "quantize_act: empty shape");
  const size_t n = static_cast<size_t>(n_tok) * static_cast<size_t>(cols);
  switch (static_cast<GgmlType>(weight_type)) {
    case GgmlType::F32:
      launch_pdl("exact_act_float_kernel", act_float_kernel<0>, dim3(grid_for(n, kActThreads)),
                 dim3(kActThreads), stream, x, a.f, n);
      return;
    case GgmlType::F16:
      launch_pdl("exact_act_float_kernel", act_float_kernel<1>, dim3(grid_for(n, kActThreads)),
                 dim3(kActThreads), stream, x, a.f, n);
      return;
    case GgmlType::BF16:
      launch_pdl("exact_act_float_kernel", act_float_kernel<2>, dim3(grid_for(n, kActThreads)),
                 dim3(kActThreads), stream, x, a.f, n);
      return;
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: {
      if (cols % 32 != 0) {
        throw WorkerError(ErrorCode::Internal, "quantize_act: row length " + std::to_string(cols) +
                                                   " is not a multiple of 32 (Q8_0 blocks)");
      }
      const size_t nb = n / 32;
      launch_pdl("exact_act_q8_0_kernel", act_q8_0_kernel, dim3(grid_for(nb, kActThreads / kWarp)),
                 dim3(kActThreads), stream, x, a.q, a.d, nb);
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q6_K: {
      if (cols % 256 != 0) {
        throw WorkerError(ErrorCode::Internal, "quantize_act: row length " + std::to_string(cols) +
                                                   " is not a multiple of 256 (Q8_K blocks)");
      }
      const size_t nb = n / 256;
      launch_pdl("exact_act_q8_k_kernel", act_q8_k_kernel, dim3(grid_for(nb, kActThreads / kWarp)),
                 dim3(kActThreads), stream, x, a.q, a.d, a.bsum, nb);
      return;
    }
    default:
      throw WorkerError(ErrorCode::Internal,
                        "quantize_act: unsupported weight type " + type_name(weight_type));
  }
}

void matmul(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order, float* y,
            bool accumulate, cudaStream_t stream) {
  const auto t = static_cast<GgmlType>(w.type);
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
    detail::matmul_float(w, a, n_tok, order, y, accumulate, stream);
    return;
  }
  if (n_tok <= 0 || w.rows <= 0 || w.cols <= 0)
    throw WorkerError(ErrorCode::Internal, "exact matmul: empty shape");
  const bool k_quant = t == GgmlType::Q4_K || t == GgmlType::Q6_K;
  if (w.cols % (k_quant ? 256 : 32) != 0) {
    throw WorkerError(ErrorCode::Internal, "exact matmul: row length " + std::to_string(w.cols) +
                                               " is not a multiple of the " + type_name(w.type) +
                                               " block");
  }
  if (w.rows > (int64_t{1} << 30) || w.cols > (int64_t{1} << 24))
    throw WorkerError(ErrorCode::Internal, "exact matmul: matrix too large");
  const bool rep = (t == GgmlType::Q4_0 || t == GgmlType::Q4_K) && w.rows % 8 == 0;
  // CpuEngine::matmul: repack_gemm for batch tokens < batch_n - batch_n % 4.
  const int gemm_end = order.batch_n - order.batch_n % 4 - order.t0;
  switch (t) {
    case GgmlType::Q8_0:
      launch_qmm_nt<GgmlType::Q8_0, false>(w, a, n_tok, gemm_end, y, accumulate, stream);
      return;
    case GgmlType::Q5_0:
      launch_qmm_nt<GgmlType::Q5_0, false>(w, a, n_tok, gemm_end, y, accumulate, stream);
      return;
    case GgmlType::Q4_0:
      if (rep)
        launch_qmm_nt<GgmlType::Q4_0, true>(w, a, n_tok, gemm_end, y, accumulate, stream);
      else
        launch_qmm_nt<GgmlType::Q4_0, false>(w, a, n_tok, gemm_end, y, accumulate, stream);
      return;
    case GgmlType::Q4_K:
      if (rep)
        launch_qmm_nt<GgmlType::Q4_K, true>(w, a, n_tok, gemm_end, y, accumulate, stream);
      else
        launch_qmm_nt<GgmlType::Q4_K, false>(w, a, n_tok, gemm_end, y, accumulate, stream);
      return;
    case GgmlType::Q6_K:
      launch_qmm_nt<GgmlType::Q6_K, false>(w, a, n_tok, gemm_end, y, accumulate, stream);
      return;
    default:
      throw WorkerError(ErrorCode::Internal,
                        "exact matmul: unsupported weight type " + type_name(w.type));
  }
}

}  // namespace worker::kern::exact
