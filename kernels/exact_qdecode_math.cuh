#pragma once
// Per-thread math of the one-token quantized products (matvec1_quant.cu), __host__ __device__
// so that the host test (exact_qdecode_test.cpp, ExactQDecodeHost.*) replays the kernel's
// decomposition with the same code: per-unit integer slots, the chains' float steps over the
// units of a pass, the combine tree. Built on the helpers in exact_quant_math.cuh.
//
// Vocabulary: a "unit" is what one lane computes in one pass: a 32-element block for Q8_0 /
// Q4_0 / Q5_0, a 32-element sub-block (1/8 of a super-block) for Q4_K / Q6_K. A pass is 32
// consecutive units of one row (32 blocks, or 4 super-blocks). Each lane writes its unit's
// integer slots (kSlotStride ints) and float scales (kScaleStride floats) to the warp's
// shared arrays; then lane c < kChains runs chain c's steps over the pass's blocks in order.
#include <stddef.h>
#include <stdint.h>

#include "exact_quant_math.cuh"

namespace worker::kern::exact::qd {

using qm::Flavor;

constexpr int kSlotStride = 9;  // odd: conflict-free shared-memory rows
constexpr int kScaleStride = 2;
constexpr int kUnitsPerPass = 32;

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

template <GgmlType T>
__host__ __device__ constexpr bool is_k() {
  return T == GgmlType::Q4_K || T == GgmlType::Q6_K;
}

// Bytes of one reference block (32 elements, or a 256-element super-block).
template <GgmlType T>
__host__ __device__ constexpr int block_bytes() {
  return T == GgmlType::Q8_0   ? 34
         : T == GgmlType::Q4_0 ? 18
         : T == GgmlType::Q5_0 ? 22
         : T == GgmlType::Q4_K ? 144
                               : 210;
}

// Little-endian 32-bit word at a 2-byte aligned address. On the GPU the address is in shared
// memory: two aligned word loads and a funnel shift (the word after may lie past the data
// but inside the allocation; its bytes are only used when they belong to the value).
EXQ_HD uint32_t rd32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  // pointer arithmetic (not an integer round trip) keeps the shared address space visible
  const uint32_t mis = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) & 3);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - mis);
  return __funnelshift_r(w[0], w[1], mis * 8u);
#else
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
#endif
}
template <int N>
EXQ_HD void rdw(const uint8_t* p, uint32_t (&out)[N]) {
#if defined(__CUDA_ARCH__)
  const uint32_t mis = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) & 3);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - mis);
  const uint32_t sh = mis * 8u;
  uint32_t raw[N + 1];
  EXQ_UNROLL
  for (int i = 0; i <= N; ++i) raw[i] = w[i];
  EXQ_UNROLL
  for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(raw[i], raw[i + 1], sh);
#else
  for (int i = 0; i < N; ++i) out[i] = rd32(p + 4 * i);
#endif
}
EXQ_HD uint32_t rd16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
#endif
}

// 32 activation quants at aq + 32 u (32-byte aligned, global memory) as 8 words.
EXQ_HD void act_words(const int8_t* aq, int u, uint32_t (&y)[8]) {
#if defined(__CUDA_ARCH__)
  const int4* p = reinterpret_cast<const int4*>(aq + 32 * static_cast<size_t>(u));
  const int4 a = p[0], b = p[1];
  y[0] = static_cast<uint32_t>(a.x);
  y[1] = static_cast<uint32_t>(a.y);
  y[2] = static_cast<uint32_t>(a.z);
  y[3] = static_cast<uint32_t>(a.w);
  y[4] = static_cast<uint32_t>(b.x);
  y[5] = static_cast<uint32_t>(b.y);
  y[6] = static_cast<uint32_t>(b.z);
  y[7] = static_cast<uint32_t>(b.w);
#else
  __builtin_memcpy(y, aq + 32 * static_cast<size_t>(u), 32);
#endif
}

// Units of a row of `cols` elements.
EXQ_HD int units_of(int cols) {
  return cols / 32;
}

// Unit u of `row` (the row's raw blocks): its integer slots S[0..8] and scales F[0..1].
//  - Q0Lanes: S[i] = int dot of elements 4i..4i+3 of block u; F[0] = d_w * d_a.
//  - Q4_0Rep: S[0] = the block's int dot; F[0] = d_w * d_a.
//  - Q6K: S[t] = sub-block g's part of lane int t (bsum correction of lane g included);
//    F[0] = d_a * d_w (of the super-block).
//  - Q4KLanes: S[t] = scale_g * dot(4t..4t+3 of sub-block g), S[8] = min_g * bsum32_g;
//    F[0] = d_a * d, F[1] = -d_a * dmin.
//  - Q4KRep: S[0] = scale_g * dot(sub-block g), S[8] = min_g * bsum32_g; F[0] = d * d_a,
//    F[1] = dmin * d_a.
// y: the unit's 32 activation quants (act_words), yd: its block's activation scale
// (act_scale); the warp loads them once for all the rows of a group.
template <GgmlType T>
EXQ_HD float act_scale(const float* ad, int u) {
  return ad[is_k<T>() ? (u >> 3) : u];
}
template <GgmlType T, bool REP>
EXQ_HD void unit_slots(const uint8_t* row, int u, const uint32_t (&y)[8], float yd,
                       const int32_t* abs, int* S, float* F) {
  if constexpr (!is_k<T>()) {
    const uint8_t* blk = row + static_cast<size_t>(u) * block_bytes<T>();
    const float d = qm::half_bits(rd16(blk)) * yd;
    int s[8];
    if constexpr (T == GgmlType::Q8_0) {
      uint32_t w[8];
      rdw<8>(blk + 2, w);
      qm::q8_0_ints(w, y, s);
    } else if constexpr (T == GgmlType::Q4_0) {
      uint32_t w[4];
      rdw<4>(blk + 2, w);
      qm::q4_0_ints(w, y, s);
    } else {
      uint32_t w[5];
      rdw<5>(blk + 2, w);  // qh, then qs
      const uint32_t q[4] = {w[1], w[2], w[3], w[4]};
      qm::q5_0_ints(w[0], q, y, s);
    }
    if constexpr (REP) {
      S[0] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    } else {
      EXQ_UNROLL
      for (int i = 0; i < 8; ++i) S[i] = s[i];
    }
    F[0] = d;
  } else {
    const int sb = u >> 3, g = u & 7;
    const uint8_t* blk = row + static_cast<size_t>(sb) * block_bytes<T>();
    const int32_t* bs = abs + 16 * sb;
    int p[8];
    if constexpr (T == GgmlType::Q6_K) {
      uint32_t ql[8], qh[8];
      rdw<8>(blk + qm::q6k_ql_off(g), ql);
      rdw<8>(blk + qm::q6k_qh_off(g), qh);
      const uint32_t scw = rd16(blk + 192 + 2 * g);
      const int sc0 = static_cast<int8_t>(static_cast<uint8_t>(scw & 0xFFu));
      const int sc1 = static_cast<int8_t>(static_cast<uint8_t>(scw >> 8));
      qm::q6k_sub_partials(g, ql, qh, sc0, sc1, bs[2 * g], bs[2 * g + 1], y, p);
      EXQ_UNROLL
      for (int t = 0; t < 8; ++t) S[t] = p[t];
      F[0] = yd * qm::half_bits(rd16(blk + 208));
    } else {
      uint32_t hw[3], q[8];
      rdw<3>(blk + 4, hw);
      rdw<8>(blk + 16 + 32 * (g >> 1), q);
      int sc, mn;
      qm::q4k_scale_min_w(g, hw, sc, mn);
      qm::q4k_sub_partials(g, sc, q, y, p);
      S[8] = mn * (bs[2 * g] + bs[2 * g + 1]);
      const float dw = qm::half_bits(rd16(blk)), dmw = qm::half_bits(rd16(blk + 2));
      if constexpr (REP) {
        S[0] = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
        F[0] = dw * yd;
        F[1] = dmw * yd;
      } else {
        EXQ_UNROLL
        for (int t = 0; t < 8; ++t) S[t] = p[t];
        F[0] = yd * dw;
        F[1] = -yd * dmw;
      }
    }
  }
}

// Chain c's steps over the first `cnt` units of a pass (S: [unit][kSlotStride], F:
// [unit][kScaleStride]), in block order, from `acc`. Integers (sums of slots) are exact in
// any order; each float step is the reference's fma with the reference's operands (fma's
// two factors commute exactly).
template <GgmlType T, bool REP>
EXQ_HD float chain_pass(int c, const int* S, const float* F, int cnt, float acc) {
  if constexpr (!is_k<T>()) {
    const int slot = REP ? 0 : c;
    EXQ_UNROLL
    for (int k = 0; k < kUnitsPerPass; ++k) {
      if (k < cnt)
        acc = qm::fma_(F[k * kScaleStride], static_cast<float>(S[k * kSlotStride + slot]), acc);
    }
    return acc;
  } else {
    constexpr Flavor FL = flavor_of<T, REP>();
    EXQ_UNROLL
    for (int b = 0; b < kUnitsPerPass / 8; ++b) {
      if (8 * b < cnt) {
        const int* s = S + 8 * b * kSlotStride;
        int v = 0;
        if constexpr (FL == Flavor::Q6K) {
          EXQ_UNROLL
          for (int g = 0; g < 8; ++g) v += s[g * kSlotStride + c];
        } else if constexpr (FL == Flavor::Q4KLanes) {
          if (c < 8) {
            EXQ_UNROLL
            for (int g = 0; g < 8; ++g) v += s[g * kSlotStride + c];
          } else {
            const int k = c - 8;
            v = s[(2 * k) * kSlotStride + 8] + s[(2 * k + 1) * kSlotStride + 8];
          }
        } else {  // Q4KRep gemv: c 0 = isum, c 1 = imin
          const int slot = c == 0 ? 0 : 8;
          EXQ_UNROLL
          for (int g = 0; g < 8; ++g) v += s[g * kSlotStride + slot];
        }
        const int fi = (FL == Flavor::Q4KLanes ? (c >= 8 ? 1 : 0) : (FL == Flavor::Q4KRep ? c : 0));
        acc = qm::fma_(F[8 * b * kScaleStride + fi], static_cast<float>(v), acc);
      }
    }
    return acc;
  }
}

template <GgmlType T, bool REP>
__host__ __device__ constexpr int chains() {
  return qm::FlavorInfo<flavor_of<T, REP>()>::kChains;
}
// Lanes per row in the chain phase (chains rounded up to a power of two) and rows per warp
// group: the warp computes the slots of G rows per pass and runs their chains at once, lane
// (row j = lane / chain_lanes, chain c = lane % chain_lanes).
template <GgmlType T, bool REP>
__host__ __device__ constexpr int chain_lanes() {
  return chains<T, REP>() <= 1 ? 1 : chains<T, REP>() <= 2 ? 2 : chains<T, REP>() <= 8 ? 8 : 16;
}
constexpr int kMaxGroup = 4;
template <GgmlType T, bool REP>
__host__ __device__ constexpr int group_rows() {
  return 32 / chain_lanes<T, REP>() < kMaxGroup ? 32 / chain_lanes<T, REP>() : kMaxGroup;
}
// Shared ints (slots) and floats (scales) of one warp.
constexpr int kWarpSlotInts = kMaxGroup * kUnitsPerPass * kSlotStride;
constexpr int kWarpScaleFloats = kMaxGroup * kUnitsPerPass * kScaleStride;

// The dot from the chain values (the reference's fixed tree).
template <GgmlType T, bool REP>
EXQ_HD float combine(const float* acc) {
  return qm::combine<flavor_of<T, REP>()>(acc);
}

#if defined(__CUDACC__)
// The dots of nr rows longer than one pass (FFN down: 152 units a row), NT threads (the whole
// block, NT = blockDim.x): every thread computes the slots of items t, t + NT, ... of
// [row][unit] into S / F ([row][unit] x kSlotStride ints / kScaleStride floats) at once,
// then warp w runs the chains of rows w, w + NT / 32, ... over the whole row (chain_pass, 32
// units at a time) and lane 0 writes out(row, dot). rowp(r): row r's raw blocks (2-byte
// aligned; shared memory). aq / ad / abs: the input's Q8_K quants, scales and sums of 16 (or
// Q8_0 quants and scales). matvec1_quant's qdecode_long_kernel and the persistent decode
// step's K-quant down both run this: the same per-thread code, the same bits.
template <GgmlType T, bool REP, int NT, class RowPtr, class Out>
__device__ __forceinline__ void long_row_dots(RowPtr rowp, int nr, int units, const int8_t* aq,
                                              const float* ad, const int32_t* abs, int* S, float* F,
                                              Out&& out) {
  const int tid = static_cast<int>(threadIdx.x);
  const int items = nr * units;
  for (int it = tid; it < items; it += NT) {
    const int rr = it / units, u = it - rr * units;
    uint32_t yw[8];
    act_words(aq, u, yw);
    unit_slots<T, REP>(rowp(rr), u, yw, act_scale<T>(ad, u), abs, S + it * kSlotStride,
                       F + it * kScaleStride);
  }
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32;
  constexpr int kC = chains<T, REP>();
  for (int r = warp; r < nr; r += NT / 32) {  // warp-uniform
    float acc = 0.0f;
    if (lane < kC) {
      for (int p0 = 0; p0 < units; p0 += kUnitsPerPass)
        acc = chain_pass<T, REP>(lane, S + (r * units + p0) * kSlotStride,
                                 F + (r * units + p0) * kScaleStride,
                                 units - p0 < kUnitsPerPass ? units - p0 : kUnitsPerPass, acc);
    }
    float v[kC];
    EXQ_UNROLL
    for (int k = 0; k < kC; ++k) v[k] = __shfl_sync(0xffffffffu, acc, k);
    if (lane == 0) out(r, combine<T, REP>(v));
  }
}
// Shared bytes of long_row_dots' S and F for nr rows of `units`.
__host__ __device__ constexpr size_t long_slot_bytes(int nr, int units) {
  return static_cast<size_t>(nr) * static_cast<size_t>(units) * (kSlotStride + kScaleStride) * 4;
}
#endif

}  // namespace worker::kern::exact::qd
