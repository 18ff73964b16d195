#pragma once
// Per-thread math of the exact quantized kernels (exact_quant.cu), __host__ __device__ so
// that the host tests (exact_quant_test.cpp) emulate the kernels' thread decomposition
// with the very same functions and check it against cpu::dot_quantized bit for bit.
//
// Vocabulary (see exact_quant.cu's header comment for the orders):
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

#define EXQ_HD __host__ __device__ __forceinline__

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
  h &= 0xFFFFu;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  uint32_t bits;
  if (e == 0) {
    if (m == 0) {
      bits = sign;
    } else {  // subnormal: m * 2^-24, exact in float
      const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
#if defined(__CUDA_ARCH__)
      bits = sign | __float_as_uint(v);
#else
      uint32_t vb;
      __builtin_memcpy(&vb, &v, 4);
      bits = sign | vb;
#endif
    }
  } else if (e == 31) {
    bits = sign | 0x7F800000u | (m << 13);
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
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

// Q8_0 block: qs words w[8] (bytes 2..33 of the block).
EXQ_HD void q8_0_ints(const uint32_t (&w)[8], const uint32_t (&y)[8], int (&s)[8]) {
  for (int i = 0; i < 8; ++i) s[i] = dp4a(w[i], y[i], 0);
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
EXQ_HD void q5_0_ints(uint32_t qh, const uint32_t (&w)[4], const uint32_t (&y)[8], int (&s)[8]) {
  for (int i = 0; i < 8; ++i) {
    uint32_t v = (i < 4 ? w[i] : (w[i - 4] >> 4)) & 0x0F0F0F0Fu;
    for (int k = 0; k < 4; ++k) v |= ((qh >> (4 * i + k)) & 1u) << (8 * k + 4);
    s[i] = dp4a(v, y[i], 0) - 16 * bytesum(y[i]);
  }
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
// Q8_0 of a 32-block, given amax: the stored scale (d = amax / 127 through fp16: `h` is
// its fp16 value as float) and the inverse scale.
EXQ_HD float q8_0_id(float amax) {
  return amax != 0.0f ? 127.f / amax : 0.0f;
}
// nearbyint / ggml's nearest_int (round half to even; |v| < 2^22).
EXQ_HD int round_even(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}
EXQ_HD int8_t q8_0_quant(float x, float id) {
  return static_cast<int8_t>(round_even(x * id));
}
// Q8_K: iscale = -127 / max (max: the element of largest magnitude, first on ties).
EXQ_HD int8_t q8_k_quant(float x, float iscale) {
  const int q = round_even(iscale * x);
  return static_cast<int8_t>(q < 127 ? q : 127);
}

}  // namespace worker::kern::exact::qm
