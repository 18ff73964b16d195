#pragma once
// The arithmetic both samplers share, written once for the CPU (worker/engine/sampler.cpp)
// and the GPU (kernels/sampling.cu) so that, for the same logits, parameters and seed, both
// pick the same token on every draw (WRK-D18). Every step is either integer arithmetic
// (exact in any order: sums, prefix sums, the draw) or one IEEE-754 double operation with
// round-to-nearest whose inputs are fixed (the same bits on any conforming machine): no
// library exp, no floating-point sum whose order could differ, no multiply-add
// contraction (explicit __dmul_rn / __dadd_rn on the device; sampler.cpp is compiled with
// -ffp-contract=off).
//
// Probabilities are integer weights: w = floor(2^32 * e^d) for d = scaled - scaled_max <= 0,
// so the most likely candidate weighs exactly 2^32 and a candidate more than ~22.2 nats
// below it weighs 0 (its probability is below 2^-32 of the top one). With at most 2^18
// candidates every total stays below 2^50, exact as an integer and as a double.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define WORKER_SAMPLER_HD __host__ __device__ __forceinline__
#else
#define WORKER_SAMPLER_HD inline
#endif

namespace worker::sampler_math {

inline constexpr double kWeightOne = 4294967296.0;  // 2^32: the top candidate's weight

WORKER_SAMPLER_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
WORKER_SAMPLER_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
WORKER_SAMPLER_HD double round_even(double x) {  // round to nearest integer, ties to even
#if defined(__CUDA_ARCH__)
  return rint(x);
#else
  return __builtin_rint(x);
#endif
}
WORKER_SAMPLER_HD double pow2(int e) {  // 2^e for -1022 <= e <= 1023, exact
  const uint64_t bits = static_cast<uint64_t>(1023 + e) << 52;
  double r;
  memcpy(&r, &bits, sizeof r);
  return r;
}

// floor(2^32 * e^d) for d <= 0 (0 for d <= -23 or NaN; d > 0 is not a valid input and
// is clamped to 0). e^d by range reduction d = k ln2 + r (|r| <= ln2/2, ln2 split in a
// head and a tail as fdlibm does) and a degree-12 Taylor polynomial in Horner form:
// within 2 ulp of e^d, and the same bits wherever IEEE double arithmetic is.
WORKER_SAMPLER_HD uint64_t weight(float d) {
  if (!(d > -23.0f)) return 0;
  if (d > 0.0f) d = 0.0f;
  const double x = static_cast<double>(d);
  const double k = round_even(mul(x, 1.4426950408889634));  // x / ln2
  double r = add(x, -mul(k, 6.93147180369123816490e-01));   // ln2 head
  r = add(r, -mul(k, 1.90821492927058770002e-10));          // ln2 tail
  constexpr double c[13] = {1.0,
                            1.0,
                            0.5,
                            1.6666666666666666e-01,
                            4.1666666666666664e-02,
                            8.3333333333333332e-03,
                            1.3888888888888889e-03,
                            1.9841269841269841e-04,
                            2.4801587301587302e-05,
                            2.7557319223985893e-06,
                            2.7557319223985888e-07,
                            2.5052108385441720e-08,
                            2.0876756987868100e-09};
  double p = c[12];
  for (int i = 11; i >= 0; --i) p = add(mul(p, r), c[i]);
  const double scaled = mul(p, pow2(static_cast<int>(k) + 32));  // exact: a power of two
  return static_cast<uint64_t>(scaled);                          // truncation = floor (> 0)
}

// floor(u53 * total / 2^53): the draw as an integer below `total` (u53 < 2^53 from the
// job's generator, total < 2^50), exact.
WORKER_SAMPLER_HD uint64_t scale_draw(uint64_t u53, uint64_t total) {
#if defined(__CUDA_ARCH__)
  const uint64_t hi = __umul64hi(u53, total), lo = u53 * total;
  return (hi << 11) | (lo >> 53);
#else
  __extension__ typedef unsigned __int128 u128;
  return static_cast<uint64_t>((static_cast<u128>(u53) * total) >> 53);
#endif
}

// top-p keeps the shortest prefix whose cumulative weight reaches this (one rounding).
WORKER_SAMPLER_HD double top_p_threshold(float top_p, uint64_t total) {
  return mul(static_cast<double>(top_p), static_cast<double>(total));
}
// min-p keeps the prefix of candidates whose weight is at least this (exact: 2^32 * min_p).
WORKER_SAMPLER_HD double min_p_threshold(float min_p) {
  return mul(static_cast<double>(min_p), kWeightOne);
}

// The per-step logits hash of a receipt (WRK-D18): an order-independent sum over the
// vocabulary of a 64-bit mix of (index, float bits), so a GPU reduction in any order and the
// CPU's loop give the same value; any changed bit of any logit changes it (but with
// probability 2^-64).
WORKER_SAMPLER_HD uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
WORKER_SAMPLER_HD uint64_t logit_term(uint32_t index, float v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  return mix64((static_cast<uint64_t>(index) << 32) | bits);
}
// The hash of n logits whose logit_term()s sum (mod 2^64) to `sum`.
WORKER_SAMPLER_HD uint64_t logits_hash_final(uint64_t sum, uint64_t n) {
  return mix64(sum ^ mix64(n));
}

}  // namespace worker::sampler_math
