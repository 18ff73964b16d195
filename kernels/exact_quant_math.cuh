#pragma once
// Per-thread code of the exact quantized kernels (matmul_quant.cu), __host__ __device__ so
// that the host tests (exact_quant_test.cpp) run it too: the math helpers (integer slots,
// chain steps, combine trees) in an emulation of the decomposition, and the kernels' whole
// per-thread bodies (qmm_block, qmv_row_block, act_q8_0_from, act_q8_k_from) in a warp
// simulator; both against cpu::dot_quantized / cpu::quantize_activation bit for bit.
// Other exact kernels (fusions, the prompt GEMM) may reuse these pieces.
//
// Vocabulary (see matmul_quant.cu's header comment for the orders):
//  - a "block" is one step of the reference's float chains: 32 elements for Q8_0 / Q4_0 /
//    Q5_0, a 256-element super-block for Q4_K / Q6_K;
//  - a block contributes integers ("slots") to the chains: Q0 types 8 lane ints (lane i =
//    dot of elements 4i..4i+3); Q6_K 8 lane ints; Q4_K 8 lane ints (or, repacked, 4 pair
//    ints) in slots 0..7 and 4 min ints in slots 8..11;
//  - integers are exact in any order, so a block's slots may be summed from partial
//    integers computed by several threads (one 32-element sub-block each for K-quants).
#include <cuda_runtime.h>
#include <stdint.h>

#include <cmath>
#include <cstring>

#include "exact_ops_math.cuh"  // the per-element activation roundings (math::act_*)
#include "gguf/ggml_types.h"
#if defined(__CUDACC__)
#include "common.cuh"  // griddep_wait, load_words (device code only)
#endif

#define EXQ_HD __host__ __device__ __forceinline__
// Full unrolling of the constant-trip loops on the GPU (register arrays stay in registers);
// nothing for the host compiler.
// EXQ_NO_UNROLL keeps a loop rolled on the GPU.
#if defined(__CUDA_ARCH__)
#define EXQ_UNROLL _Pragma("unroll")
#define EXQ_NO_UNROLL _Pragma("unroll 1")
#else
#define EXQ_UNROLL
#define EXQ_NO_UNROLL
#endif

namespace worker::kern::exact::qm {

// Sum of the 4 signed byte products of a and b, plus c (the dp4a instruction: exact).
EXQ_HD int dp4a(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int k = 0; k < 4; ++k) {
    c += static_cast<int>(static_cast<int8_t>(static_cast<uint8_t>(a >> (8 * k)))) *
         static_cast<int>(static_cast<int8_t>(static_cast<uint8_t>(b >> (8 * k))));
  }
  return c;
#endif
}

// fp16 bits -> float (exact).
EXQ_HD float half_bits(uint32_t h) {
#if defined(__CUDA_ARCH__)
  // the hardware conversion (exact: HADD2.F32), branch-free: a loop of dependent steps can
  // overlap its iterations (the branches of the bit-level version below serialized them)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xFFFFu)));
#else
  h &= 0xFFFFu;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  uint32_t bits;
  if (e == 0) {
    if (m == 0) {
      bits = sign;
    } else {  // subnormal: m * 2^-24, exact in float
      const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
      uint32_t vb;
      __builtin_memcpy(&vb, &v, 4);
      bits = sign | vb;
    }
  } else if (e == 31) {
    bits = sign | 0x7F800000u | (m << 13);
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

EXQ_HD float fma_(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Sum of the 4 signed bytes of y.
EXQ_HD int bytesum(uint32_t y) {
  return dp4a(0x01010101u, y, 0);
}

// ---- integer slots of one block / sub-block (w: weight words, y: activation words) ----

// Q8_0 block: qs words w[8] (bytes 2..33 of the block); lane i's int from its word alone.
EXQ_HD int q8_0_int(uint32_t w, uint32_t y) {
  return dp4a(w, y, 0);
}
EXQ_HD void q8_0_ints(const uint32_t (&w)[8], const uint32_t (&y)[8], int (&s)[8]) {
  for (int i = 0; i < 8; ++i) s[i] = q8_0_int(w[i], y[i]);
}

// Q4_0 block: qs words w[4]; elements 0..15 low nibbles, 16..31 high nibbles; weight =
// nibble - 8, so lane i = dot(nibbles, y) - 8 * sum(y).
EXQ_HD void q4_0_ints(const uint32_t (&w)[4], const uint32_t (&y)[8], int (&s)[8]) {
  for (int i = 0; i < 8; ++i) {
    const uint32_t nib = (i < 4 ? w[i] : (w[i - 4] >> 4)) & 0x0F0F0F0Fu;
    s[i] = dp4a(nib, y[i], 0) - 8 * bytesum(y[i]);
  }
}

// Q5_0 block: qh (bytes 2..5) and qs words w[4]; fifth bit of element j is bit j of qh.
// Lane i's int: qs word w (word i % 4 of the block's qs), activation word y.
// The lane's 4 fifth bits h (bits 4i .. 4i + 3 of qh) go to bit 4 of bytes 0..3 by one
// multiply: h * 0x00204081 places bit k of h at bit 8k (the four shifted copies occupy the
// disjoint bits 0-3, 7-10, 14-17, 21-24: no carries), the mask keeps those four bits.
EXQ_HD int q5_0_int(int i, uint32_t qh, uint32_t w, uint32_t y) {
  const uint32_t h = (qh >> (4 * i)) & 0xFu;
  const uint32_t v =
      ((i < 4 ? w : (w >> 4)) & 0x0F0F0F0Fu) | (((h * 0x00204081u) & 0x01010101u) << 4);
  return dp4a(v, y, 0) - 16 * bytesum(y);
}
EXQ_HD void q5_0_ints(uint32_t qh, const uint32_t (&w)[4], const uint32_t (&y)[8], int (&s)[8]) {
  for (int i = 0; i < 8; ++i) s[i] = q5_0_int(i, qh, w[i % 4], y[i]);
}

// Q4_K: 6-bit scale and min of sub-block j (ggml's get_scale_min_k4); sc: the 12 bytes.
EXQ_HD void q4k_scale_min(int j, const uint8_t* sc, int& d, int& m) {
  if (j < 4) {
    d = sc[j] & 63;
    m = sc[j + 4] & 63;
  } else {
    d = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
}

// The same from the 12 scale bytes held as 3 little-endian words (selects, no indexing:
// a run-time index into a register array would go to local memory on the GPU).
EXQ_HD int q4k_byte(const uint32_t (&hw)[3], int i) {
  const uint32_t word = i < 4 ? hw[0] : (i < 8 ? hw[1] : hw[2]);
  return static_cast<int>((word >> (8 * (i & 3))) & 0xFFu);
}
EXQ_HD void q4k_scale_min_w(int j, const uint32_t (&hw)[3], int& d, int& m) {
  if (j < 4) {
    d = q4k_byte(hw, j) & 63;
    m = q4k_byte(hw, j + 4) & 63;
  } else {
    d = (q4k_byte(hw, j + 4) & 0xF) | ((q4k_byte(hw, j - 4) >> 6) << 4);
    m = (q4k_byte(hw, j + 4) >> 4) | ((q4k_byte(hw, j) >> 6) << 4);
  }
}

// Q4_K sub-block s (elements 32s..32s+31): q = the 32 qs bytes of pair s/2, nibble s&1.
// p[t] = scale_s * dot(elements 32s+4t..+3) (the sub-block's part of lane int t).
EXQ_HD void q4k_sub_partials(int s, int scale, const uint32_t (&q)[8], const uint32_t (&y)[8],
                             int (&p)[8]) {
  const int shift = 4 * (s & 1);
  for (int t = 0; t < 8; ++t) p[t] = scale * dp4a((q[t] >> shift) & 0x0F0F0F0Fu, y[t], 0);
}

// Q6_K sub-block g (elements 32g..32g+31): ql / qh: its 32 ql and qh bytes (see
// q6k_ql_off / q6k_qh_off), sc0 / sc1: int8 scales 2g and 2g+1 (elements 32g..+15 and
// 32g+16..+31), bs0 / bs1: the bsums of those 16-element halves. p[t] = scale *
// dot(unsigned 6-bit quants, y) over elements 32g+4t..+3, and sub-block g also carries
// lane g's bsum correction -32 * (bs[2g] sc[2g] + bs[2g+1] sc[2g+1]) (dot_q6_k's lane
// int g subtracts it).
EXQ_HD void q6k_sub_partials(int g, const uint32_t (&ql)[8], const uint32_t (&qh)[8], int sc0,
                             int sc1, int bs0, int bs1, const uint32_t (&y)[8], int (&p)[8]) {
  const int k = g & 3;
  const int nshift = (k >> 1) * 4, hshift = 2 * k;
  for (int t = 0; t < 8; ++t) {
    const uint32_t v = ((ql[t] >> nshift) & 0x0F0F0F0Fu) | (((qh[t] >> hshift) & 0x03030303u) << 4);
    p[t] = (t >= 4 ? sc1 : sc0) * dp4a(v, y[t], 0);
  }
  const int corr = 32 * (bs0 * sc0 + bs1 * sc1);
  for (int t = 0; t < 8; ++t) p[t] -= (t == g) ? corr : 0;
}
// Byte offsets in a block_q6_K of sub-block g's 32 ql and 32 qh bytes.
EXQ_HD int q6k_ql_off(int g) {
  return 64 * (g >> 2) + 32 * (g & 1);
}
EXQ_HD int q6k_qh_off(int g) {
  return 128 + 32 * (g >> 2);
}

// ---- float chains ----
// One step of a lane chain: acc = fma(d, float(s), acc) (dot_q0_lanes, dot_q6_k, dot_q4_k).
EXQ_HD float lane_step(float d, int s, float acc) {
  return fma_(d, static_cast<float>(s), acc);
}

// hsum_float_8: (v[i] + v[i+4]) for i < 4, then (t0 + t2) + (t1 + t3).
EXQ_HD float hsum8(const float* v) {
  const float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
  return (t0 + t2) + (t1 + t3);
}
// (m0 + m2) + (m1 + m3)
EXQ_HD float hsum4(const float* m) {
  return (m[0] + m[2]) + (m[1] + m[3]);
}

// Chains of each kernel flavour. The kernels keep, per block and token, the integer slots
// S[] and the float scales F[] below; chain c of a (row, token) runs over the blocks in
// order with chain_step, and the chains combine with combine().
enum class Flavor : int {
  Q0Lanes = 0,   // Q8_0, Q5_0, Q4_0 not repacked: 8 chains, F[0] = d_w * d_a
  Q4_0Rep = 1,   // Q4_0 repacked: 1 chain, acc = fma(float(S[0]), F[0], acc), S[0]: block dot
  Q6K = 2,       // 8 chains, F[0] = d_a * d_w
  Q4KLanes = 3,  // 12 chains: 8 lanes (F[0] = d_a * d), 4 mins (F[1] = -d_a * dmin)
  Q4KRep = 4,    // 2 chains: acc (S[0..3] pair ints, F[0] = d*d_a), accm (S[8..11], F[1])
};

template <Flavor FL>
struct FlavorInfo;
template <>
struct FlavorInfo<Flavor::Q0Lanes> {
  static constexpr int kChains = 8, kSlots = 8, kScales = 1;
};
template <>
struct FlavorInfo<Flavor::Q4_0Rep> {
  static constexpr int kChains = 1, kSlots = 1, kScales = 1;
};
template <>
struct FlavorInfo<Flavor::Q6K> {
  static constexpr int kChains = 8, kSlots = 8, kScales = 1;
};
template <>
struct FlavorInfo<Flavor::Q4KLanes> {
  static constexpr int kChains = 12, kSlots = 12, kScales = 2;
};
template <>
struct FlavorInfo<Flavor::Q4KRep> {
  static constexpr int kChains = 2, kSlots = 12, kScales = 2;
};

// Chain c's step for one block: S the block's slots, F its scales; gemm: the Q4_K repack
// gemm order (once per 64-element pair) instead of gemv (once per super-block).
template <Flavor FL>
EXQ_HD float chain_step(int c, const int* S, const float* F, bool gemm, float acc) {
  if constexpr (FL == Flavor::Q0Lanes || FL == Flavor::Q6K) {
    return lane_step(F[0], S[c], acc);
  } else if constexpr (FL == Flavor::Q4_0Rep) {
    return fma_(static_cast<float>(S[0]), F[0], acc);
  } else if constexpr (FL == Flavor::Q4KLanes) {
    return c < 8 ? lane_step(F[0], S[c], acc) : lane_step(F[1], S[c], acc);
  } else {  // Q4KRep: c = 0 acc (pair ints S[0..3]), c = 1 accm (S[8..11])
    const int* p = S + (c == 0 ? 0 : 8);
    const float d = F[c];
    if (gemm) {
      for (int j = 0; j < 4; ++j) acc = fma_(static_cast<float>(p[j]), d, acc);
      return acc;
    }
    return fma_(static_cast<float>((p[0] + p[1]) + (p[2] + p[3])), d, acc);
  }
}

// The dot from the kChains chain values.
template <Flavor FL>
EXQ_HD float combine(const float* acc) {
  if constexpr (FL == Flavor::Q0Lanes || FL == Flavor::Q6K) {
    return hsum8(acc);
  } else if constexpr (FL == Flavor::Q4_0Rep) {
    return acc[0];
  } else if constexpr (FL == Flavor::Q4KLanes) {
    return hsum8(acc) + hsum4(acc + 8);
  } else {
    return acc[0] - acc[1];
  }
}

// ---- activation quantization ----
// The per-element roundings (Q8_0 / Q8_K quants, the fp16 scale) are math::act_* in
// exact_ops_math.cuh, shared with the fused kernels.
using math::act_q8_0_id;
using math::act_q8_0_quant;
using math::act_q8_k_quant;
using math::act_round_fp16;

// ---------------------------------------------------------------------------------------
// Warp-level pieces of the matmul kernels. They run on the GPU (the intrinsics below) and,
// for the host tests, in a warp simulator (one host thread per lane, shuffles and barriers
// through the hooks of HostWarp), so that the tests replay the kernels' own code: lane
// indexing, shared-memory layout, shuffles, chunking, not only the math.

#if !defined(__CUDA_ARCH__)
// Set only by the host tests' warp simulator (exact_quant_test.cpp); never used otherwise.
struct HostWarp {
  int (*lane)() = nullptr;
  int (*warp)() = nullptr;
  int (*shfl_xor)(int v, int mask) = nullptr;
  float (*shfl_xor_f)(float v, int mask) = nullptr;
  float (*shfl_idx)(float v, int src) = nullptr;
  void (*sync_warp)() = nullptr;
  void (*sync_block)() = nullptr;
};
inline HostWarp host_warp;
#endif

constexpr int kLanes = 32;
constexpr int kMMWarps = 4;  // warps per block of the matmul kernels

EXQ_HD int lane_id() {
#if defined(__CUDA_ARCH__)
  return static_cast<int>(threadIdx.x) % kLanes;
#else
  return host_warp.lane();
#endif
}
EXQ_HD int warp_id() {
#if defined(__CUDA_ARCH__)
  return static_cast<int>(threadIdx.x) / kLanes;
#else
  return host_warp.warp();
#endif
}
EXQ_HD int shfl_xor(int v, int mask) {
#if defined(__CUDA_ARCH__)
  return __shfl_xor_sync(0xffffffffu, v, mask);
#else
  return host_warp.shfl_xor(v, mask);
#endif
}
EXQ_HD float shfl_xor_f(float v, int mask) {
#if defined(__CUDA_ARCH__)
  return __shfl_xor_sync(0xffffffffu, v, mask);
#else
  return host_warp.shfl_xor_f(v, mask);
#endif
}
EXQ_HD float shfl_idx(float v, int src) {
#if defined(__CUDA_ARCH__)
  return __shfl_sync(0xffffffffu, v, src);
#else
  return host_warp.shfl_idx(v, src);
#endif
}
EXQ_HD void sync_warp() {
#if defined(__CUDA_ARCH__)
  __syncwarp();
#else
  host_warp.sync_warp();
#endif
}
EXQ_HD void sync_block() {
#if defined(__CUDA_ARCH__)
  __syncthreads();
#else
  host_warp.sync_block();
#endif
}
// The PDL wait (common.cuh); nothing on the host.
EXQ_HD void pdl_wait() {
#if defined(__CUDA_ARCH__)
  griddep_wait();
#endif
}

// 4*NW bytes at a 2-byte aligned address as little-endian words (the GPU: the widest loads
// the address allows, common.cuh's load_words).
template <int NW>
EXQ_HD void ld_words(const uint8_t* p, uint32_t (&w)[NW]) {
#if defined(__CUDA_ARCH__)
  load_words(p, w);
#else
  std::memcpy(w, p, sizeof w);
#endif
}
EXQ_HD uint32_t ld_u16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}
// 32 activation quants (32-byte aligned) as 8 words: two 16-byte loads.
EXQ_HD void ld_y32(const int8_t* p, uint32_t (&y)[8]) {
#if defined(__CUDA_ARCH__)
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
#else
  std::memcpy(y, p, 32);
#endif
}
EXQ_HD int2 ld_int2(const int32_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const int2*>(p);
#else
  int2 v;
  v.x = p[0];
  v.y = p[1];
  return v;
#endif
}

template <GgmlType T>
EXQ_HD constexpr bool is_k() {
  return T == GgmlType::Q4_K || T == GgmlType::Q6_K;
}
// Blocks per chunk: Q0 types one 32-block per lane; K-quants 8 super-blocks (two passes of
// 4 super-blocks x 8 sub-block lanes).
template <GgmlType T>
EXQ_HD constexpr int chunk_blocks() {
  return is_k<T>() ? 8 : 32;
}
template <GgmlType T>
EXQ_HD constexpr int passes() {
  return is_k<T>() ? 2 : 1;
}
template <GgmlType T>
EXQ_HD constexpr int block_elems() {
  return is_k<T>() ? 256 : 32;
}

template <GgmlType T, bool REP>
EXQ_HD constexpr Flavor flavor_of() {
  if constexpr (T == GgmlType::Q6_K)
    return Flavor::Q6K;
  else if constexpr (T == GgmlType::Q4_K)
    return REP ? Flavor::Q4KRep : Flavor::Q4KLanes;
  else if constexpr (T == GgmlType::Q4_0 && REP)
    return Flavor::Q4_0Rep;
  else
    return Flavor::Q0Lanes;
}

// Lanes per token in the chain phase (a power of two >= the chain count).
template <Flavor FL>
EXQ_HD constexpr int lanes_per_tok() {
  constexpr int c = FlavorInfo<FL>::kChains;
  return c <= 1 ? 1 : (c <= 2 ? 2 : (c <= 8 ? 8 : 16));
}

// Weight registers of one lane's unit (a Q0 block, or one sub-block of a K super-block).
struct WRegs {
  uint32_t h = 0;      // fp16 d (Q0, Q6_K), or d | dmin << 16 (Q4_K)
  uint32_t a[8] = {};  // Q8_0 qs; Q4_0 qs[0..3]; Q5_0 qh, qs[0..3]; Q4_K qs of the pair; Q6_K ql
  uint32_t b[8] = {};  // Q4_K: the 12 scale bytes in b[0..2]; Q6_K: qh
  uint32_t sc = 0;     // Q6_K: int8 scales 2g, 2g+1
};

// Loads unit `u` of a lane: Q0: block u; K: super-block u, sub-block s.
template <GgmlType T>
EXQ_HD void load_unit(const uint8_t* row, int u, int s, WRegs& r) {
  if constexpr (T == GgmlType::Q8_0) {
    const uint8_t* p = row + static_cast<size_t>(u) * 34;
    r.h = ld_u16(p);
    ld_words(p + 2, r.a);
  } else if constexpr (T == GgmlType::Q4_0) {
    const uint8_t* p = row + static_cast<size_t>(u) * 18;
    r.h = ld_u16(p);
    uint32_t w[4];
    ld_words(p + 2, w);
    for (int i = 0; i < 4; ++i) r.a[i] = w[i];
  } else if constexpr (T == GgmlType::Q5_0) {
    const uint8_t* p = row + static_cast<size_t>(u) * 22;
    r.h = ld_u16(p);
    uint32_t w[5];
    ld_words(p + 2, w);
    for (int i = 0; i < 5; ++i) r.a[i] = w[i];
  } else if constexpr (T == GgmlType::Q4_K) {
    const uint8_t* p = row + static_cast<size_t>(u) * 144;
    uint32_t hw[4];
    ld_words(p, hw);
    r.h = hw[0];
    r.b[0] = hw[1];
    r.b[1] = hw[2];
    r.b[2] = hw[3];
    ld_words(p + 16 + 32 * (s >> 1), r.a);
  } else {  // Q6_K
    const uint8_t* p = row + static_cast<size_t>(u) * 210;
    ld_words(p + q6k_ql_off(s), r.a);
    ld_words(p + q6k_qh_off(s), r.b);
    r.sc = ld_u16(p + 192 + 2 * s);
    r.h = ld_u16(p + 208);
  }
}

// Loads the weights of the chunk at block c0 that this lane computes.
template <GgmlType T>
EXQ_HD void load_chunk(const uint8_t* row, int c0, int nb, WRegs (&wr)[passes<T>()]) {
  const int lane = lane_id();
  EXQ_UNROLL
  for (int it = 0; it < passes<T>(); ++it) {
    const int u = is_k<T>() ? c0 + it * 4 + (lane >> 3) : c0 + lane;
    if (u < nb) load_unit<T>(row, u, lane & 7, wr[it]);
  }
}

// p[] summed over the 8 lanes of an aligned group; lane s of the group returns the total of
// index s (recursive halving: 4 + 2 + 1 shuffles). Integers: exact in any order.
EXQ_HD int reduce8_transpose(const int (&p)[8], int s) {
  int v4[4], v2[2];
  const bool h4 = (s & 4) != 0, h2 = (s & 2) != 0, h1 = (s & 1) != 0;
  EXQ_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int send = h4 ? p[i] : p[i + 4];
    const int keep = h4 ? p[i + 4] : p[i];
    v4[i] = keep + shfl_xor(send, 4);
  }
  EXQ_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int send = h2 ? v4[i] : v4[i + 2];
    const int keep = h2 ? v4[i + 2] : v4[i];
    v2[i] = keep + shfl_xor(send, 2);
  }
  const int send = h1 ? v2[0] : v2[1];
  const int keep = h1 ? v2[1] : v2[0];
  return keep + shfl_xor(send, 1);
}

// The integer slots and scales of one chunk (blocks [c0, c0 + CB)) for the nt tokens from
// tok0, into S[CB][NT][slots] and F[CB][NT][scales]. Every lane of the warp calls it
// (K-quants shuffle).
template <GgmlType T, bool REP, int NT>
EXQ_HD void chunk_ints(const WRegs (&wr)[passes<T>()], int c0, int nb, int cols,
                       const int8_t* __restrict__ aq, const float* __restrict__ ad,
                       const int32_t* __restrict__ abs, int tok0, int nt, int* S, float* F) {
  constexpr Flavor FL = flavor_of<T, REP>();
  constexpr int SL = FlavorInfo<FL>::kSlots, NF = FlavorInfo<FL>::kScales;
  const int lane = lane_id();
  if constexpr (!is_k<T>()) {
    const int b = c0 + lane;
    if (b >= nb) return;
    const WRegs& r = wr[0];
    const float dw = half_bits(r.h);
#if defined(__CUDA_ARCH__)
#pragma unroll 2
#endif
    for (int t = 0; t < nt; ++t) {
      const size_t tok = static_cast<size_t>(tok0 + t);
      uint32_t y[8];
      ld_y32(aq + tok * static_cast<size_t>(cols) + 32 * static_cast<size_t>(b), y);
      const float da = ad[tok * static_cast<size_t>(nb) + b];
      int s[8];
      if constexpr (T == GgmlType::Q8_0) {
        q8_0_ints(r.a, y, s);
      } else if constexpr (T == GgmlType::Q4_0) {
        const uint32_t w[4] = {r.a[0], r.a[1], r.a[2], r.a[3]};
        q4_0_ints(w, y, s);
      } else {
        const uint32_t w[4] = {r.a[1], r.a[2], r.a[3], r.a[4]};
        q5_0_ints(r.a[0], w, y, s);
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
    EXQ_UNROLL
    for (int it = 0; it < 2; ++it) {
      const int bl = it * 4 + (lane >> 3);  // block within the chunk
      const int sb = c0 + bl;
      const bool valid = sb < nb;
      const WRegs& r = wr[it];
      int sc = 0, mn = 0;
      if constexpr (T == GgmlType::Q4_K) {
        const uint32_t hw[3] = {r.b[0], r.b[1], r.b[2]};
        q4k_scale_min_w(s, hw, sc, mn);
      }
      for (int t = 0; t < nt; ++t) {  // nt is warp-uniform: the shuffles run on every lane
        const size_t tok = static_cast<size_t>(tok0 + t);
        int p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int msub = 0;
        float yd = 0.0f;
        if (valid) {
          uint32_t y[8];
          ld_y32(aq + tok * static_cast<size_t>(cols) + 256 * static_cast<size_t>(sb) + 32 * s, y);
          const int2 bs = ld_int2(abs + tok * static_cast<size_t>(cols / 16) +
                                  16 * static_cast<size_t>(sb) + 2 * s);
          yd = ad[tok * static_cast<size_t>(nb) + sb];
          if constexpr (T == GgmlType::Q4_K) {
            q4k_sub_partials(s, sc, r.a, y, p);
            msub = mn * (bs.x + bs.y);
          } else {
            const int sc0 = static_cast<int8_t>(r.sc & 0xFF);
            const int sc1 = static_cast<int8_t>((r.sc >> 8) & 0xFF);
            q6k_sub_partials(s, r.a, r.b, sc0, sc1, bs.x, bs.y, y, p);
          }
        }
        int* Sd = S + (bl * NT + t) * SL;
        float* Fd = F + (bl * NT + t) * NF;
        if constexpr (FL == Flavor::Q4KRep) {
          int tot = 0;
          EXQ_UNROLL
          for (int i = 0; i < 8; ++i) tot += p[i];
          tot += shfl_xor(tot, 1);  // pair j = sub-blocks 2j, 2j+1
          msub += shfl_xor(msub, 1);
          if (valid && (s & 1) == 0) {
            Sd[s >> 1] = tot;
            Sd[8 + (s >> 1)] = msub;
          }
        } else {
          const int lane_int = reduce8_transpose(p, s);
          if constexpr (FL == Flavor::Q4KLanes) {
            msub += shfl_xor(msub, 1);
            if (valid && (s & 1) == 0) Sd[8 + (s >> 1)] = msub;
          }
          if (valid) Sd[s] = lane_int;
        }
        if (valid && s == 0) {
          if constexpr (T == GgmlType::Q6_K) {
            Fd[0] = yd * half_bits(r.h);
          } else if constexpr (FL == Flavor::Q4KLanes) {
            Fd[0] = yd * half_bits(r.h);
            Fd[1] = -yd * half_bits(r.h >> 16);
          } else {
            Fd[0] = half_bits(r.h) * yd;
            Fd[1] = half_bits(r.h >> 16) * yd;
          }
        }
      }
    }
  }
}

// The chain phase over blocks [0, cnt) of S / F (layout [block][NT][slots]): lane
// (token slot ts, chain ch) steps its chains of the tokens ts, ts + TPP, ... in block order.
template <Flavor FL, int NT>
EXQ_HD void run_chains(const int* S, const float* F, int cnt, int nt, const bool* gemm,
                       float* acc) {
  constexpr int SL = FlavorInfo<FL>::kSlots, NF = FlavorInfo<FL>::kScales;
  constexpr int C = FlavorInfo<FL>::kChains;
  constexpr int LPT = lanes_per_tok<FL>();
  constexpr int TPP = kLanes / LPT;
  constexpr int NP = (NT + TPP - 1) / TPP;
  const int lane = lane_id();
  const int ch = lane % LPT, ts = lane / LPT;
  if (ch >= C) return;
#if defined(__CUDA_ARCH__)
#pragma unroll 4
#endif
  for (int b = 0; b < cnt; ++b) {
    EXQ_UNROLL
    for (int p = 0; p < NP; ++p) {
      const int t = p * TPP + ts;
      if (t < nt) {
        acc[p] = chain_step<FL>(ch, S + (b * NT + t) * SL, F + (b * NT + t) * NF, gemm[p], acc[p]);
      }
    }
  }
}

// Gathers each (row, token)'s chains into its first lane, combines them in the reference's
// tree and writes y (every lane of the warp calls it: shuffles).
template <Flavor FL, int NT>
EXQ_HD void combine_store(const float* acc, int nt, int tok0, int r, int rows,
                          float* __restrict__ y, int accumulate) {
  constexpr int C = FlavorInfo<FL>::kChains;
  constexpr int LPT = lanes_per_tok<FL>();
  constexpr int TPP = kLanes / LPT;
  constexpr int NP = (NT + TPP - 1) / TPP;
  const int lane = lane_id();
  const int ch = lane % LPT, ts = lane / LPT;
  const int base = lane & ~(LPT - 1);
  EXQ_UNROLL
  for (int p = 0; p < NP; ++p) {
    float v[C];
    EXQ_UNROLL
    for (int k = 0; k < C; ++k) v[k] = shfl_idx(acc[p], base + k);
    const int t = p * TPP + ts;
    if (ch == 0 && t < nt) {
      const float res = combine<FL>(v);
      float* out = y + static_cast<size_t>(tok0 + t) * static_cast<size_t>(rows) + r;
      *out = accumulate ? *out + res : res;
    }
  }
}

// Shared memory of qmm_block: per warp CB * NT blocks of slots and of scales.
template <GgmlType T, bool REP, int NT>
struct QmmSmem {
  static constexpr Flavor FL = flavor_of<T, REP>();
  static constexpr int kInts = chunk_blocks<T>() * NT * FlavorInfo<FL>::kSlots;
  static constexpr int kFloats = chunk_blocks<T>() * NT * FlavorInfo<FL>::kScales;
};

// One thread of qmm_kernel (any token count): warp w of block (bx, by) takes row
// bx * kMMWarps + w and tokens [by * NT, by * NT + NT); it walks the row in chunks (chunk
// c + 1's weights are loaded while chunk c's chains run). s_int / s_f: the block's shared
// memory, kMMWarps * QmmSmem sizes.
template <GgmlType T, bool REP, int NT>
EXQ_HD void qmm_block(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                      const int8_t* __restrict__ aq, const float* __restrict__ ad,
                      const int32_t* __restrict__ abs, int n_tok, int gemm_end,
                      float* __restrict__ y, int accumulate, int bx, int by, int* s_int,
                      float* s_f) {
  constexpr Flavor FL = flavor_of<T, REP>();
  constexpr int CB = chunk_blocks<T>();
  constexpr int LPT = lanes_per_tok<FL>();
  constexpr int TPP = kLanes / LPT;         // tokens per chain pass
  constexpr int NP = (NT + TPP - 1) / TPP;  // chain passes
  const int warp = warp_id(), lane = lane_id();
  const int r = bx * kMMWarps + warp;
  if (r >= rows) return;  // warp-uniform; no block-wide barriers below
  const int tok0 = by * NT;
  const int nt = (n_tok - tok0) < NT ? (n_tok - tok0) : NT;
  const int nb = cols / block_elems<T>();
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  int* S = s_int + warp * QmmSmem<T, REP, NT>::kInts;
  float* F = s_f + warp * QmmSmem<T, REP, NT>::kFloats;

  WRegs wr[passes<T>()];
  // Weights are never written by a kernel: the first chunk's load overlaps the previous
  // kernel (PDL); activations and y are read only after the wait.
  load_chunk<T>(row, 0, nb, wr);
  pdl_wait();

  const int ts = lane / LPT;
  float acc[NP];
  bool gemm[NP];
  EXQ_UNROLL
  for (int p = 0; p < NP; ++p) {
    acc[p] = 0.0f;
    gemm[p] = tok0 + p * TPP + ts < gemm_end;
  }
  for (int c0 = 0; c0 < nb; c0 += CB) {
    chunk_ints<T, REP, NT>(wr, c0, nb, cols, aq, ad, abs, tok0, nt, S, F);
    if (c0 + CB < nb) load_chunk<T>(row, c0 + CB, nb, wr);  // in flight during the chains
    sync_warp();
    run_chains<FL, NT>(S, F, (nb - c0) < CB ? (nb - c0) : CB, nt, gemm, acc);
    sync_warp();
  }
  combine_store<FL, NT>(acc, nt, tok0, r, rows, y, accumulate);
}

// Shared memory of qmv_row_block for rows of `cols`: nb * (slots + scales) words.
template <GgmlType T, bool REP>
EXQ_HD constexpr size_t row_block_smem(int cols) {
  constexpr Flavor FL = flavor_of<T, REP>();
  return static_cast<size_t>(cols / block_elems<T>()) *
         (FlavorInfo<FL>::kSlots + FlavorInfo<FL>::kScales) * sizeof(int);
}

// One thread of qmv_row_kernel (one token, rows longer than one chunk: decode of e.g. FFN
// down): block bx takes row bx; its warps compute the slots of all the row's chunks at once
// (all weight loads of the row in flight together) into shared memory, then warp 0 runs the
// chains over the whole row. smem: row_block_smem bytes, 16-byte aligned.
template <GgmlType T, bool REP>
EXQ_HD void qmv_row_block(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                          const int8_t* __restrict__ aq, const float* __restrict__ ad,
                          const int32_t* __restrict__ abs, int gemm_end, float* __restrict__ y,
                          int accumulate, int bx, int* smem) {
  constexpr Flavor FL = flavor_of<T, REP>();
  constexpr int SL = FlavorInfo<FL>::kSlots, NF = FlavorInfo<FL>::kScales;
  constexpr int CB = chunk_blocks<T>();
  const int nb = cols / block_elems<T>();
  int* S = smem;
  float* F = reinterpret_cast<float*>(S + nb * SL);
  const int warp = warp_id();
  const int r = bx;
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  const int nchunks = (nb + CB - 1) / CB;

  WRegs wr[passes<T>()];
  if (warp < nchunks) load_chunk<T>(row, warp * CB, nb, wr);
  pdl_wait();
  for (int c = warp; c < nchunks; c += kMMWarps) {  // warp-uniform
    chunk_ints<T, REP, 1>(wr, c * CB, nb, cols, aq, ad, abs, 0, 1, S + c * CB * SL,
                          F + c * CB * NF);
    if (c + kMMWarps < nchunks) load_chunk<T>(row, (c + kMMWarps) * CB, nb, wr);
  }
  sync_block();
  if (warp != 0) return;
  float acc[1] = {0.0f};
  const bool gemm[1] = {0 < gemm_end};
  run_chains<FL, 1>(S, F, nb, 1, gemm, acc);
  combine_store<FL, 1>(acc, 1, 0, r, rows, y, accumulate);
}

// ---------------------------------------------------------------------------------------
// quantize_act's warp bodies (matmul_quant.cu's act_q8_0_kernel / act_q8_k_kernel run one per
// warp and block; blocks are numbered over the whole [n_tok][cols] array).

// Q8_0 block k from the lane's element v (element 32k + lane): amax by a butterfly max
// (exact in any order), d = amax / 127 through fp16, q = round-half-even(x * (127 / amax)).
// Every lane of the warp calls it (shuffles); fusions that hold the values call it directly.
EXQ_HD void act_q8_0_from(float v, int8_t* __restrict__ q, float* __restrict__ d, size_t k) {
  const int lane = lane_id();
  float amax = fabsf(v);
  EXQ_UNROLL
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, shfl_xor_f(amax, o));
  const float id = act_q8_0_id(amax);
  q[k * 32 + lane] = act_q8_0_quant(v, id);
  if (lane == 0) d[k] = act_round_fp16(amax / 127.f);
}
EXQ_HD void act_q8_0_block(const float* __restrict__ x, int8_t* __restrict__ q,
                           float* __restrict__ d, size_t k) {
  act_q8_0_from(x[k * 32 + lane_id()], q, d, k);
}

// Q8_K block k from the lane's elements v = 256k + 8 lane .. + 7: the element of largest
// magnitude, first in index order on ties (each lane scans its 8 with the CPU's strict >; the
// butterfly merges aligned lane groups, the lower group winning ties), iscale = -127 / max,
// q = min(127, rint(iscale * x)), bsums of 16 from lane pairs, d = 1 / iscale; an all-zero
// block gives q = 0, d = 0, bsums 0. Every lane of the warp calls it (shuffles).
EXQ_HD void act_q8_k_from(const float (&v)[8], int8_t* __restrict__ q, float* __restrict__ d,
                          int32_t* __restrict__ bsum, size_t k) {
  const int lane = lane_id();
  float amax = 0.0f, mx = 0.0f;
  EXQ_UNROLL
  for (int i = 0; i < 8; ++i) {
    const float ax = fabsf(v[i]);
    if (ax > amax) {
      amax = ax;
      mx = v[i];
    }
  }
  EXQ_UNROLL
  for (int o = 1; o < kLanes; o <<= 1) {
    const float oa = shfl_xor_f(amax, o);
    const float om = shfl_xor_f(mx, o);
    if (oa > amax || (oa == amax && (lane ^ o) < lane)) {
      amax = oa;
      mx = om;
    }
  }
  uint32_t packed[2] = {0, 0};
  int s = 0;
  if (amax != 0.0f) {
    const float iscale = -127.f / mx;
    EXQ_UNROLL
    for (int i = 0; i < 8; ++i) {
      const int8_t qi = act_q8_k_quant(v[i], iscale);
      s += qi;
      packed[i >> 2] |= static_cast<uint32_t>(static_cast<uint8_t>(qi)) << (8 * (i & 3));
    }
    if (lane == 0) d[k] = 1 / iscale;
  } else if (lane == 0) {
    d[k] = 0.0f;
  }
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint2*>(q + k * 256 + 8 * lane) = make_uint2(packed[0], packed[1]);
#else
  std::memcpy(q + k * 256 + 8 * lane, packed, 8);
#endif
  s += shfl_xor(s, 1);  // sums of 16: lanes 2j and 2j+1
  if ((lane & 1) == 0) bsum[k * 16 + lane / 2] = s;
}
EXQ_HD void act_q8_k_block(const float* __restrict__ x, int8_t* __restrict__ q,
                           float* __restrict__ d, int32_t* __restrict__ bsum, size_t k) {
  const int lane = lane_id();
  float v[8];
#if defined(__CUDA_ARCH__)
  const float4* xp = reinterpret_cast<const float4*>(x + k * 256 + 8 * lane);
  const float4 a = xp[0], b = xp[1];
  v[0] = a.x;
  v[1] = a.y;
  v[2] = a.z;
  v[3] = a.w;
  v[4] = b.x;
  v[5] = b.y;
  v[6] = b.z;
  v[7] = b.w;
#else
  std::memcpy(v, x + k * 256 + 8 * lane, sizeof v);
#endif
  act_q8_k_from(v, q, d, bsum, k);
}

}  // namespace worker::kern::exact::qm
