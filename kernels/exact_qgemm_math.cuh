#pragma once
// Per-thread code of the exact quantized prompt GEMM (matmul_qgemm.cu), __host__ __device__
// so that the host emulation test (exact_qgemm_test.cpp, ExactQgemmHost.*) replays the
// kernel's tiling thread by thread with the very same functions and checks it against
// cpu::dot_quantized bit for bit. See matmul_qgemm.cu's header comment for the orders.
//
// Tiling: a CTA of kThreads threads owns BR (kBR = 32, or 16 / 8 where the grid is small)
// weight rows x BT tokens and walks the
// row in steps of 256 elements (8 Q0 blocks or one K super-block). Per step the whole CTA
// unpacks the 32 rows' weights to int8 (one 32-element unit per thread) and copies the BT
// tokens' activation quants into shared memory (fetch_w / fetch_a / commit); then every thread runs
// its chains over the step's blocks in order (compute_step), its chain values in registers.
//  - "lane" flavours (Q0Lanes, Q6K, Q4KLanes): the 8 lane chains of a (row, token) live in 8
//    threads (L = lane & 7): thread L takes word L (elements 4L..4L+3) of every 32-element
//    unit: one dp4a per (row, token, unit) is exactly the reference's lane integer (Q0) or
//    one sub-block's part of it (K). A thread holds RT = 4 rows x TT tokens of chain L. At
//    the end the 8 chains combine with xor-4/2/1 butterflies, which is hsum_float_8's tree.
//    Q0Lanes puts two chains in a thread instead (L = lane & 3: chains L and L + 4, in acc
//    and accm), so that the scale product d_w * d_a both steps use is formed once; its
//    combine starts with the thread's own t_L = v_L + v_(L+4), then xor 2, 1.
//  - "rep" flavours (Q4_0Rep, Q4KRep): 1 or 2 chains per (row, token) whose steps are whole
//    block / 64-element integer dots: one thread per (row, token) walks all 8 words of a unit
//    (128-bit shared loads), RT = 2 rows x TT tokens per thread.
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstring>

#include "exact_quant_math.cuh"
#include "gguf/ggml_types.h"
#include "gguf/type_traits.h"
#include "matmul.cuh"

namespace worker::kern::exact::qg {

using qm::Flavor;

// qgemm with the kernel variant chosen: the dp4a tiles with prefetch 1 = the next step's
// global loads are issued before this step's chains run (Stage registers), 0 = loaded after
// the barrier; kVariantMma = the tensor-core tile (matmul_qgemm.cu's mma0: Q8_0 / Q5_0 / Q4_0
// lanes, widths a multiple of 128, 8-byte aligned rows; throws for other weights); -1 = the
// default per launch (what qgemm() runs). The GPU tests check them against each other.
constexpr int kVariantMma = 2;
void qgemm_variant(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order,
                   float* y, bool accumulate, cudaStream_t stream, int prefetch);

constexpr int kThreads = 256;  // 8 warps
constexpr int kBR = 32;        // weight rows per CTA (the most; small grids take 16 or 8)
constexpr int kUnits = 8;      // 32-element units per step (256 elements)

template <GgmlType T>
EXQ_HD constexpr bool is_k() {
  return T == GgmlType::Q4_K || T == GgmlType::Q6_K;
}
template <Flavor FL>
EXQ_HD constexpr bool lane_flavor() {
  return FL == Flavor::Q0Lanes || FL == Flavor::Q6K || FL == Flavor::Q4KLanes;
}
// Threads holding the 8 chains of one (row, token): 4 for Q0Lanes (two chains each), 8 for
// the other lane flavours.
template <Flavor FL>
EXQ_HD constexpr int chain_threads() {
  return FL == Flavor::Q0Lanes ? 4 : 8;
}

// Tile geometry of a flavour, TT (tokens per thread) and BR (weight rows per CTA). Threads
// whose row (tid >> 3) is BR or more load no weights (has_row).
template <Flavor FL, int TT, int BR = kBR>
struct Geo {
  static constexpr bool kLane = lane_flavor<FL>();
  static constexpr int LT = kLane ? 32 / chain_threads<FL>() : 16;  // token lanes per warp
  static constexpr int LR = kLane ? 1 : 2;                          // row lanes per warp
  static constexpr int RT = BR / (8 * LR);    // rows per thread: 4 / 2 / 1 (lane), 2 / 1 (rep)
  static constexpr int BT = LT * TT;          // tokens per CTA
  static constexpr int WS = kLane ? 72 : 68;  // words per shared row (bank padding)
  static constexpr int OS = BR + 1;           // floats per token of the out tile
  static_assert(BR <= kBR && BR % (8 * LR) == 0, "BR: 32, 16 or 8 (rep flavours 32 or 16)");
};
// Whether weight row r = tid >> 3 of a thread is in a BR-row tile (always for 32 rows: no test).
template <int BR>
EXQ_HD bool has_row(int r) {
  return BR >= kThreads / 8 || r < BR;
}

// Shared memory of one CTA. w / y: int8 quants, 64 words (256 elements) per row / token,
// word 8u + k = elements 4k..4k+3 of unit u. dw: Q0: fp16 d of unit u as float; K: [0] d,
// [1] dmin. sc: Q4_K [0..7] scales, [8..15] mins; Q6_K the 16 int8 scales. da: Q0: Q8_0
// scale of unit u; K: [0] the Q8_K d. bs: Q8_K bsums. out: the result tile [BT][OS].
template <Flavor FL, int TT, int BR = kBR>
struct Smem {
  using G = Geo<FL, TT, BR>;
  alignas(16) uint32_t w[BR * G::WS];
  alignas(16) uint32_t y[G::BT * G::WS];
  float dw[BR * 8];
  int sc[BR * 16];
  float da[G::BT * 8];
  int bs[G::BT * 16];
  float out[G::BT * G::OS];
};

// Per-thread chain values: acc (lane chain / acc), accm (Q4_K min chain / accm).
template <Flavor FL, int TT, int BR = kBR>
struct Acc {
  using G = Geo<FL, TT, BR>;
  float acc[G::RT][TT];
  float accm[G::RT][TT];
};

// ---- small helpers ----

// float(s) for |s| < 2^22, exactly (as the int -> float conversion gives): the bits of
// 1.5 * 2^23 + s minus 1.5 * 2^23. Two full-rate ops instead of one quarter-rate I2F; one
// where the integer comes from dp4a, whose accumulator input adds the bias for free
// (biased_i2f(dp4a(a, b, kI2fBias)) == small_i2f(dp4a(a, b, 0))).
constexpr int kI2fBias = 0x4B400000;  // the bits of 1.5 * 2^23
EXQ_HD float biased_i2f(int b) {
#if defined(__CUDA_ARCH__)
  const float f = __int_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
#endif
  return f - 12582912.0f;
}
EXQ_HD float small_i2f(int s) {
  return biased_i2f(static_cast<int>(static_cast<uint32_t>(kI2fBias) + static_cast<uint32_t>(s)));
}

EXQ_HD uint4 ld16(const void* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint4*>(p);
#else
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
#endif
}
EXQ_HD void st16(void* p, uint4 v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = v;
#else
  std::memcpy(p, &v, 16);
#endif
}

// Bytes v (each < 16) minus 8, as 4 int8: x = v ^ 8 is right in the low nibble and its bit 3
// is set exactly when the result is negative; that bit times 0x1E (= 0xF0 / 8) fills the high
// nibble (no carries between bytes: each byte's product is <= 0xF0).
EXQ_HD uint32_t sub8_bytes(uint32_t v) {
  const uint32_t x = v ^ 0x08080808u;
  return x | ((x & 0x08080808u) * 0x1Eu);
}
// Bytes v (each < 32) minus 16, the same way (bit 4, times 0x0F).
EXQ_HD uint32_t sub16_bytes(uint32_t v) {
  const uint32_t x = v ^ 0x10101010u;
  return x | ((x & 0x10101010u) * 0x0Fu);
}

// ---- the load phase of one step ----
// Split in two so that the kernel can issue step s + 1's global loads before it runs step
// s's chains (the loads in flight meanwhile): fetch_* reads global memory into a thread's
// Stage registers (raw weight words, activation vectors); commit writes them, the weights
// unpacked to int8, into shared memory. Without prefetching the kernel calls them back to
// back.

// Raw words per thread and step: the weight unit (Q8_0: d + 8 qs words; Q4_0: d + 4;
// Q5_0: d + qh + 4; Q4_K: d|dmin + 3 scale words + 8 qs words; Q6_K: 8 ql + 8 qh words,
// scales 2g|2g+1, d) and the activation items of the thread (strided by kThreads).
template <GgmlType T, Flavor FL, int TT, int BR = kBR>
struct Stage {
  using G = Geo<FL, TT, BR>;
  static constexpr int kW = T == GgmlType::Q6_K   ? 18
                            : T == GgmlType::Q4_K ? 12
                            : T == GgmlType::Q8_0 ? 9
                            : T == GgmlType::Q5_0 ? 6
                                                  : 5;  // Q4_0: only the block's own bytes
  static constexpr int kY = (G::BT * 16 + kThreads - 1) / kThreads;  // 16-byte quant vectors
  static constexpr int kD = is_k<T>() ? kY : (G::BT * 8 + kThreads - 1) / kThreads;
  uint32_t w[kW];
  bool wok;
  uint4 y[kY];
  float d[kD];  // Q0: Q8_0 scales; K: the Q8_K d of the item's token (items with i == 0)
  int bs[kY];   // K: bsums (item k = token k >> 4, sum k & 15)
};

template <int N>
EXQ_HD void ld_raw(const uint8_t* p, uint32_t* dst) {
  uint32_t v[N];
  qm::ld_words(p, v);
  for (int i = 0; i < N; ++i) dst[i] = v[i];
}

// Weights of step `step`: thread tid takes unit tid & 7 of tile row tid >> 3. nb: blocks per
// row (32-element for Q0, super-blocks for K).
template <GgmlType T, Flavor FL, int TT, int BR>
EXQ_HD void fetch_w(int tid, int step, const uint8_t* __restrict__ w, int rows, size_t row_bytes,
                    int row0, int nb, Stage<T, FL, TT, BR>& st) {
  const int r = tid >> 3, u = tid & 7;
  const int gr = has_row<BR>(r) ? row0 + r : rows;  // past the tile: as past the matrix
  const uint8_t* row = w + static_cast<size_t>(gr) * row_bytes;
  if constexpr (!is_k<T>()) {
    constexpr size_t bb = TypeTraits<T>::kBlockBytes;
    const int b = step * kUnits + u;
    st.wok = gr < rows && b < nb;
    if (st.wok) {
      const uint8_t* p = row + static_cast<size_t>(b) * bb;
      st.w[0] = qm::ld_u16(p);
      ld_raw<Stage<T, FL, TT, BR>::kW - 1>(p + 2, st.w + 1);
    }
  } else if constexpr (T == GgmlType::Q4_K) {
    st.wok = gr < rows;
    if (st.wok) {
      const uint8_t* p = row + static_cast<size_t>(step) * 144;
      ld_raw<4>(p, st.w);                           // d | dmin, 12 scale bytes
      ld_raw<8>(p + 16 + 32 * (u >> 1), st.w + 4);  // qs of pair u / 2
    }
  } else {  // Q6_K, sub-block g = u
    st.wok = gr < rows;
    if (st.wok) {
      const uint8_t* p = row + static_cast<size_t>(step) * 210;
      ld_raw<8>(p + qm::q6k_ql_off(u), st.w);
      ld_raw<8>(p + qm::q6k_qh_off(u), st.w + 8);
      st.w[16] = qm::ld_u16(p + 192 + 2 * u);
      st.w[17] = qm::ld_u16(p + 208);
    }
  }
}

// ---- the weight ring (types whose rows are 8-byte aligned; matmul_qgemm.cu) ----
// Instead of fetch_w's loads into registers one step ahead, the kernel copies the raw bytes of
// kRing - 1 steps ahead into shared memory (8-byte cp.async, issued before griddep_wait for
// the first steps) and each thread then reads its unit from there (fetch_w_ring). The bytes
// a step takes from a row: 8 Q0 blocks or one K super-block; a row's step starts 8-byte
// aligned when row_bytes % 8 == 0 (Q0: 4 | blocks, so a short last step has 4 blocks).
constexpr int kRing = 4;
template <GgmlType T>
EXQ_HD constexpr int ring_step_bytes() {
  return (is_k<T>() ? 1 : kUnits) * TypeTraits<T>::kBlockBytes;  // 272 / 176 / 144 / 144
}
template <GgmlType T>
EXQ_HD constexpr bool ring_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::Q5_0 || T == GgmlType::Q4_0 || T == GgmlType::Q4_K;
}
// 8-byte pieces of one ring stage (BR rows) and the most a thread copies.
template <GgmlType T, int BR = kBR>
EXQ_HD constexpr int ring_pieces() {
  return BR * ring_step_bytes<T>() / 8;
}
template <GgmlType T, int BR = kBR>
EXQ_HD constexpr int ring_rounds() {
  return (ring_pieces<T, BR>() + kThreads - 1) / kThreads;
}
// Piece n (n = tid + kThreads * i) of step `step`: stage byte offset `dst`, and whether it is
// in the matrix (src = its global address); pieces outside (rows >= rows, blocks >= nb) are
// zero-filled by the copy.
template <GgmlType T>
EXQ_HD bool ring_piece(int n, int step, const uint8_t* w, int rows, size_t row_bytes, int row0,
                       int& dst, const uint8_t*& src) {
  constexpr int kSB = ring_step_bytes<T>(), kPR = kSB / 8;
  const int r = n / kPR, q = n % kPR;
  dst = r * kSB + 8 * q;
  const size_t off = static_cast<size_t>(step) * kSB + 8 * static_cast<size_t>(q);
  src = w + static_cast<size_t>(row0 + r) * row_bytes + off;
  return row0 + r < rows && off < row_bytes;
}
// Bytes of one ring stage: BR rows of a step and 16 bytes that sw_words may read past the
// last row (never used).
template <GgmlType T, int BR = kBR>
EXQ_HD constexpr int ring_stage_bytes() {
  return BR * ring_step_bytes<T>() + 16;
}

// 32-bit word of shared memory at a 4-byte aligned offset (host: memcpy).
EXQ_HD uint32_t sw32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
// The 16-bit little-endian value at an even offset o of the stage (a block's d).
EXQ_HD uint32_t sw16(const uint8_t* stage, int o) {
  return (sw32(stage + (o & ~3)) >> (8 * (o & 2))) & 0xFFFFu;
}
// Q5_0's fifth bits h (h < 16; bit k: element 4i + k of a word's four) as bit 4 of each byte:
// h << 4 | h << 11 | h << 18 | h << 25 (four copies 7 bits apart, none overlapping: the product
// is their OR) keeps bit k of copy k, which lands on bit 8k + 4.
EXQ_HD uint32_t q5_high_bits(uint32_t h) {
  return (h * 0x02040810u) & 0x10101010u;
}
// N little-endian words at an even offset o of the stage (2 mod 4 or 0 mod 4): aligned word
// loads, then a funnel shift by 16 bits where o is 2 mod 4.
template <int N>
EXQ_HD void sw_words(const uint8_t* stage, int o, uint32_t* dst) {
  const uint8_t* b = stage + (o & ~3);
  const int sh = 8 * (o & 2);
  uint32_t w[N + 1];
  for (int i = 0; i <= N; ++i) w[i] = sw32(b + 4 * i);
  for (int i = 0; i < N; ++i) {
#if defined(__CUDA_ARCH__)
    dst[i] = __funnelshift_r(w[i], w[i + 1], sh);
#else
    dst[i] = static_cast<uint32_t>(((static_cast<uint64_t>(w[i + 1]) << 32) | w[i]) >> sh);
#endif
  }
}

// fetch_w from the ring stage of its step: the same Stage words.
template <GgmlType T, Flavor FL, int TT, int BR>
EXQ_HD void fetch_w_ring(int tid, int step, const uint8_t* stage, int rows, int row0, int nb,
                         Stage<T, FL, TT, BR>& st) {
  const int r = tid >> 3, u = tid & 7;
  const uint8_t* row = stage + r * ring_step_bytes<T>();
  if constexpr (!is_k<T>()) {
    constexpr int bb = TypeTraits<T>::kBlockBytes;
    st.wok = has_row<BR>(r) && row0 + r < rows && step * kUnits + u < nb;
    if (st.wok) {
      const int o = bb * u;  // even
      st.w[0] = sw16(row, o);
      sw_words<Stage<T, FL, TT, BR>::kW - 1>(row, o + 2, st.w + 1);
    }
  } else {  // Q4_K
    st.wok = has_row<BR>(r) && row0 + r < rows;
    if (st.wok) {
      for (int i = 0; i < 4; ++i) st.w[i] = sw32(row + 4 * i);
      for (int i = 0; i < 8; ++i) st.w[4 + i] = sw32(row + 16 + 32 * (u >> 1) + 4 * i);
    }
  }
}

// Activations of step `step` for tokens [tok0, tok0 + BT): item k (k = tid, tid + kThreads,
// ...) is 16 bytes (token k >> 4, bytes 16 (k & 15) of the step); Q0 scales item k: token
// k >> 3, unit k & 7; K: bsum k & 15 of token k >> 4 (and its d with sum 0).
template <GgmlType T, Flavor FL, int TT, int BR>
EXQ_HD void fetch_a(int tid, int step, const int8_t* __restrict__ aq, const float* __restrict__ ad,
                    const int32_t* __restrict__ abs, int cols, int nb, int tok0, int n_tok,
                    Stage<T, FL, TT, BR>& st) {
  using G = Geo<FL, TT, BR>;
  using S = Stage<T, FL, TT, BR>;
  EXQ_UNROLL
  for (int n = 0; n < S::kY; ++n) {
    const int k = tid + n * kThreads;
    const int t = k >> 4, q = k & 15;
    const int gt = tok0 + t;
    const bool ok = k < G::BT * 16 && gt < n_tok && (is_k<T>() || step * kUnits + (q >> 1) < nb);
    st.y[n] = make_uint4(0, 0, 0, 0);
    if (ok)
      st.y[n] =
          ld16(aq + static_cast<size_t>(gt) * cols + 256 * static_cast<size_t>(step) + 16 * q);
    if constexpr (is_k<T>()) {
      const bool tok_ok = k < G::BT * 16 && gt < n_tok;
      st.bs[n] = tok_ok ? abs[static_cast<size_t>(gt) * (cols / 16) + 16 * step + q] : 0;
      st.d[n] = (tok_ok && q == 0) ? ad[static_cast<size_t>(gt) * nb + step] : 0.0f;
    }
  }
  if constexpr (!is_k<T>()) {
    EXQ_UNROLL
    for (int n = 0; n < S::kD; ++n) {
      const int k = tid + n * kThreads;
      const int t = k >> 3, u = k & 7;
      const int gt = tok0 + t, b = step * kUnits + u;
      const bool ok = k < G::BT * 8 && gt < n_tok && b < nb;
      st.d[n] = ok ? ad[static_cast<size_t>(gt) * nb + b] : 0.0f;
    }
  }
}

// The staged step into shared memory (commit_w: thread (r, u)'s weight unit unpacked to 8
// words of int8 in element order (zeros past the matrix) and its scales; commit_a: the
// thread's activation items).
template <GgmlType T, Flavor FL, int TT, int BR>
EXQ_HD void commit_w(int r, int u, const Stage<T, FL, TT, BR>& st, Smem<FL, TT, BR>& s) {
  using G = Geo<FL, TT, BR>;
  uint32_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if constexpr (!is_k<T>()) {
    float d = 0.0f;
    if (st.wok) {
      d = qm::half_bits(st.w[0]);
      if constexpr (T == GgmlType::Q8_0) {
        for (int i = 0; i < 8; ++i) v[i] = st.w[1 + i];
      } else if constexpr (T == GgmlType::Q4_0) {
        for (int i = 0; i < 4; ++i) {
          v[i] = sub8_bytes(st.w[1 + i] & 0x0F0F0F0Fu);             // elements 4i..: low nibbles
          v[i + 4] = sub8_bytes((st.w[1 + i] >> 4) & 0x0F0F0F0Fu);  // 16+4i..: high nibbles
        }
      } else {  // Q5_0: qh (bit e = fifth bit of element e), then qs as Q4_0
        const uint32_t qh = st.w[1];
        for (int i = 0; i < 8; ++i) {
          const uint32_t nib = (i < 4 ? st.w[2 + i] : (st.w[2 + i - 4] >> 4)) & 0x0F0F0F0Fu;
          v[i] = sub16_bytes(nib | q5_high_bits((qh >> (4 * i)) & 0xFu));  // elements 4i..4i+3
        }
      }
    }
    s.dw[r * 8 + u] = d;
  } else if constexpr (T == GgmlType::Q4_K) {
    int sc = 0, mn = 0;
    float d = 0.0f, dmin = 0.0f;
    if (st.wok) {
      d = qm::half_bits(st.w[0]);
      dmin = qm::half_bits(st.w[0] >> 16);
      const uint32_t scw[3] = {st.w[1], st.w[2], st.w[3]};
      qm::q4k_scale_min_w(u, scw, sc, mn);
      const int shift = 4 * (u & 1);  // sub-block u: low (even) or high (odd) nibbles
      for (int t = 0; t < 8; ++t) v[t] = (st.w[4 + t] >> shift) & 0x0F0F0F0Fu;
    }
    s.sc[r * 16 + u] = sc;
    s.sc[r * 16 + 8 + u] = mn;
    if (u == 0) {
      s.dw[r * 8] = d;
      s.dw[r * 8 + 1] = dmin;
    }
  } else {  // Q6_K sub-block g = u: unsigned 6-bit quants
    int sc0 = 0, sc1 = 0;
    float d = 0.0f;
    if (st.wok) {
      const int k = u & 3;
      const int nshift = (k >> 1) * 4, hshift = 2 * k;
      for (int t = 0; t < 8; ++t)
        v[t] = ((st.w[t] >> nshift) & 0x0F0F0F0Fu) | (((st.w[8 + t] >> hshift) & 0x03030303u) << 4);
      sc0 = static_cast<int8_t>(static_cast<uint8_t>(st.w[16] & 0xFF));
      sc1 = static_cast<int8_t>(static_cast<uint8_t>((st.w[16] >> 8) & 0xFF));
      d = qm::half_bits(st.w[17]);
    }
    s.sc[r * 16 + 2 * u] = sc0;
    s.sc[r * 16 + 2 * u + 1] = sc1;
    if (u == 0) s.dw[r * 8] = d;
  }
  uint32_t* dst = s.w + r * G::WS + 8 * u;
  st16(dst, make_uint4(v[0], v[1], v[2], v[3]));
  st16(dst + 4, make_uint4(v[4], v[5], v[6], v[7]));
}
template <GgmlType T, Flavor FL, int TT, int BR>
EXQ_HD void commit_a(int tid, const Stage<T, FL, TT, BR>& st, Smem<FL, TT, BR>& s) {
  using G = Geo<FL, TT, BR>;
  using S = Stage<T, FL, TT, BR>;
  EXQ_UNROLL
  for (int n = 0; n < S::kY; ++n) {
    const int k = tid + n * kThreads;
    if (k < G::BT * 16) {
      const int t = k >> 4, q = k & 15;
      st16(s.y + t * G::WS + 4 * q, st.y[n]);
      if constexpr (is_k<T>()) {
        s.bs[t * 16 + q] = st.bs[n];
        if (q == 0) s.da[t * 8] = st.d[n];
      }
    }
  }
  if constexpr (!is_k<T>()) {
    EXQ_UNROLL
    for (int n = 0; n < S::kD; ++n) {
      const int k = tid + n * kThreads;
      if (k < G::BT * 8) s.da[(k >> 3) * 8 + (k & 7)] = st.d[n];
    }
  }
}
template <GgmlType T, Flavor FL, int TT, int BR>
EXQ_HD void commit(int tid, const Stage<T, FL, TT, BR>& st, Smem<FL, TT, BR>& s) {
  const int r = tid >> 3, u = tid & 7;
  if (has_row<BR>(r)) commit_w(r, u, st, s);  // rows past the tile: no weights
  commit_a(tid, st, s);
}

// ---- thread coordinates ----
// Lane flavours: tile rows warp + 8 i (i < RT), tokens lt + LT j (lt = lane / chain
// threads), chain / word L.
// Rep flavours: tile rows 2 warp + lr + 16 i (i < RT), tokens lt + 16 j.
template <Flavor FL, int TT>
EXQ_HD int thread_row(int tid, int i) {
  const int warp = tid >> 5, lane = tid & 31;
  if constexpr (lane_flavor<FL>()) {
    (void)lane;
    return warp + 8 * i;
  } else {
    return 2 * warp + (lane >> 4) + 16 * i;
  }
}
template <Flavor FL, int TT>
EXQ_HD int thread_tok(int tid, int j) {
  const int lane = tid & 31;
  if constexpr (lane_flavor<FL>())
    return lane / chain_threads<FL>() + Geo<FL, TT>::LT * j;
  else
    return (lane & 15) + 16 * j;
}

template <Flavor FL, int TT, int BR>
EXQ_HD void zero_acc(Acc<FL, TT, BR>& a) {
  using G = Geo<FL, TT, BR>;
  EXQ_UNROLL
  for (int i = 0; i < G::RT; ++i) {
    EXQ_UNROLL
    for (int j = 0; j < TT; ++j) {
      a.acc[i][j] = 0.0f;
      a.accm[i][j] = 0.0f;
    }
  }
}

// ---- the chain phase of one step (every thread) ----
// nunits: Q0 blocks in this step (8, fewer at the row's end). gemm_mask: bit j set when the
// thread's token j takes the Q4_K repack gemm order.
template <GgmlType T, Flavor FL, int TT, int BR>
EXQ_HD void compute_step(int tid, const Smem<FL, TT, BR>& s, int nunits, uint32_t gemm_mask,
                         Acc<FL, TT, BR>& a) {
  using G = Geo<FL, TT, BR>;
  constexpr int RT = G::RT, WS = G::WS;
  int rr[RT], tt[TT];
  EXQ_UNROLL
  for (int i = 0; i < RT; ++i) rr[i] = thread_row<FL, TT>(tid, i);
  EXQ_UNROLL
  for (int j = 0; j < TT; ++j) tt[j] = thread_tok<FL, TT>(tid, j);

  if constexpr (FL == Flavor::Q0Lanes) {
    // chain c: acc = fma(d_w * d_a, float(lane int c), acc), block after block; this thread
    // holds chains L (acc) and L + 4 (accm) and forms their common scale product once.
    // Small tiles (RT x TT <= 4: 8 dp4a a unit or fewer) run a full step (every step but a
    // row's short last one) without a test per unit: the tests split the unrolled units into
    // blocks, and ptxas recomputed the thread's shared-memory offsets in each (ncu SASS of the
    // 16-row x 8-token tile: ~39 instructions a unit for its 4 dp4a, a dozen of them offsets;
    // H100, Q8_0 896 x 4864 at 32 tokens 29.2 -> 24.7 us). Larger tiles keep the tested loop:
    // rolled it measured 5-7% slower, and unrolled without tests ptxas spilled.
    const int L = tid & 3;
    const uint32_t* wb = s.w + L;
    const uint32_t* yb = s.y + L;
    auto unit = [&](int u) {
      uint32_t wl[RT], wh[RT], yl[TT], yh[TT];
      float dw[RT], da[TT];
      EXQ_UNROLL
      for (int i = 0; i < RT; ++i) {
        wl[i] = wb[rr[i] * WS + 8 * u];
        wh[i] = wb[rr[i] * WS + 8 * u + 4];
        dw[i] = s.dw[rr[i] * 8 + u];
      }
      EXQ_UNROLL
      for (int j = 0; j < TT; ++j) {
        yl[j] = yb[tt[j] * WS + 8 * u];
        yh[j] = yb[tt[j] * WS + 8 * u + 4];
        da[j] = s.da[tt[j] * 8 + u];
      }
      EXQ_UNROLL
      for (int i = 0; i < RT; ++i) {
        EXQ_UNROLL
        for (int j = 0; j < TT; ++j) {
          const float d = dw[i] * da[j];
          a.acc[i][j] = qm::fma_(d, biased_i2f(qm::dp4a(wl[i], yl[j], kI2fBias)), a.acc[i][j]);
          a.accm[i][j] = qm::fma_(d, biased_i2f(qm::dp4a(wh[i], yh[j], kI2fBias)), a.accm[i][j]);
        }
      }
    };
    if constexpr (RT * TT >= 8) {
      EXQ_UNROLL
      for (int u = 0; u < kUnits; ++u) {
        if (u < nunits) unit(u);
      }
    } else if (nunits == kUnits) {
      EXQ_UNROLL
      for (int u = 0; u < kUnits; ++u) unit(u);
    } else {
      EXQ_NO_UNROLL
      for (int u = 0; u < nunits; ++u) unit(u);
    }
  } else if constexpr (FL == Flavor::Q6K || FL == Flavor::Q4KLanes) {
    // Lane int L of the super-block: sum over sub-blocks g of scale * dot(elements
    // 32g+4L..+3); Q6_K minus 32 (bs[2L] sc[2L] + bs[2L+1] sc[2L+1]). Then one fma.
    const int L = tid & 7;
    int is[RT][TT];
    EXQ_UNROLL
    for (int i = 0; i < RT; ++i) {
      EXQ_UNROLL
      for (int j = 0; j < TT; ++j) is[i][j] = 0;
    }
    EXQ_UNROLL
    for (int g = 0; g < 8; ++g) {
      uint32_t wv[RT], yv[TT];
      int sc[RT];
      EXQ_UNROLL
      for (int i = 0; i < RT; ++i) {
        wv[i] = s.w[rr[i] * WS + 8 * g + L];
        sc[i] = FL == Flavor::Q6K ? s.sc[rr[i] * 16 + 2 * g + (L >> 2)] : s.sc[rr[i] * 16 + g];
      }
      EXQ_UNROLL
      for (int j = 0; j < TT; ++j) yv[j] = s.y[tt[j] * WS + 8 * g + L];
      EXQ_UNROLL
      for (int i = 0; i < RT; ++i) {
        EXQ_UNROLL
        for (int j = 0; j < TT; ++j) is[i][j] += sc[i] * qm::dp4a(wv[i], yv[j], 0);
      }
    }
    EXQ_UNROLL
    for (int i = 0; i < RT; ++i) {
      const float dw = s.dw[rr[i] * 8];
      EXQ_UNROLL
      for (int j = 0; j < TT; ++j) {
        const float da = s.da[tt[j] * 8];
        int lane = is[i][j];
        if constexpr (FL == Flavor::Q6K) {
          const int* sc = s.sc + rr[i] * 16;
          const int* bs = s.bs + tt[j] * 16;
          lane -= 32 * (bs[2 * L] * sc[2 * L] + bs[2 * L + 1] * sc[2 * L + 1]);
        }
        // dot_q6_k: d = d_a * d_w; dot_q4_k: d = yd * d (same product)
        a.acc[i][j] = qm::fma_(da * dw, static_cast<float>(lane), a.acc[i][j]);
      }
    }
    if constexpr (FL == Flavor::Q4KLanes) {
      if (L < 4) {  // min chain L: mn[2L] (bs[4L] + bs[4L+1]) + mn[2L+1] (bs[4L+2] + bs[4L+3])
        EXQ_UNROLL
        for (int i = 0; i < RT; ++i) {
          const int* mn = s.sc + rr[i] * 16 + 8;
          const float dmin = s.dw[rr[i] * 8 + 1];
          EXQ_UNROLL
          for (int j = 0; j < TT; ++j) {
            const int* bs = s.bs + tt[j] * 16;
            const int prod = mn[2 * L] * (bs[4 * L] + bs[4 * L + 1]) +
                             mn[2 * L + 1] * (bs[4 * L + 2] + bs[4 * L + 3]);
            const float dm = -s.da[tt[j] * 8] * dmin;  // dmin = -yd * f16(dmin)
            a.accm[i][j] = qm::fma_(dm, static_cast<float>(prod), a.accm[i][j]);
          }
        }
      }
    }
  } else if constexpr (FL == Flavor::Q4_0Rep) {
    // acc = fma(float(block int dot), d_w * d_a, acc), block after block.
    EXQ_UNROLL
    for (int u = 0; u < kUnits; ++u) {
      if (u < nunits) {
        uint4 w0[RT], w1[RT];
        float dw[RT];
        EXQ_UNROLL
        for (int i = 0; i < RT; ++i) {
          w0[i] = ld16(s.w + rr[i] * WS + 8 * u);
          w1[i] = ld16(s.w + rr[i] * WS + 8 * u + 4);
          dw[i] = s.dw[rr[i] * 8 + u];
        }
        EXQ_UNROLL
        for (int j = 0; j < TT; ++j) {
          const uint4 y0 = ld16(s.y + tt[j] * WS + 8 * u);
          const uint4 y1 = ld16(s.y + tt[j] * WS + 8 * u + 4);
          const float da = s.da[tt[j] * 8 + u];
          EXQ_UNROLL
          for (int i = 0; i < RT; ++i) {
            int si = qm::dp4a(w0[i].x, y0.x, 0);
            si = qm::dp4a(w0[i].y, y0.y, si);
            si = qm::dp4a(w0[i].z, y0.z, si);
            si = qm::dp4a(w0[i].w, y0.w, si);
            si = qm::dp4a(w1[i].x, y1.x, si);
            si = qm::dp4a(w1[i].y, y1.y, si);
            si = qm::dp4a(w1[i].z, y1.z, si);
            si = qm::dp4a(w1[i].w, y1.w, si);
            a.acc[i][j] = qm::fma_(small_i2f(si), dw[i] * da, a.acc[i][j]);
          }
        }
      }
    }
  } else {  // Q4KRep
    // Per 64-element pair p: isb = sc[2p] s0 + sc[2p+1] s1, msb = mins x bsums; gemm tokens:
    // acc = fma(float(isb), d * d_a, acc), accm = fma(float(msb), dmin * d_a, accm) per pair;
    // gemv tokens: the same once per super-block with the sums over the pairs.
    int isum[RT][TT], imin[RT][TT];
    EXQ_UNROLL
    for (int i = 0; i < RT; ++i) {
      EXQ_UNROLL
      for (int j = 0; j < TT; ++j) {
        isum[i][j] = 0;
        imin[i][j] = 0;
      }
    }
    float dd[RT][TT], dm[RT][TT];
    EXQ_UNROLL
    for (int i = 0; i < RT; ++i) {
      const float d = s.dw[rr[i] * 8], dmin = s.dw[rr[i] * 8 + 1];
      EXQ_UNROLL
      for (int j = 0; j < TT; ++j) {
        const float yd = s.da[tt[j] * 8];
        dd[i][j] = d * yd;
        dm[i][j] = dmin * yd;
      }
    }
    EXQ_UNROLL
    for (int p = 0; p < 4; ++p) {
      uint4 wv[RT][4];
      int sc0[RT], sc1[RT], m0[RT], m1[RT];
      EXQ_UNROLL
      for (int i = 0; i < RT; ++i) {
        EXQ_UNROLL
        for (int k = 0; k < 4; ++k) wv[i][k] = ld16(s.w + rr[i] * WS + 16 * p + 4 * k);
        const int* sc = s.sc + rr[i] * 16;
        sc0[i] = sc[2 * p];
        sc1[i] = sc[2 * p + 1];
        m0[i] = sc[8 + 2 * p];
        m1[i] = sc[8 + 2 * p + 1];
      }
      EXQ_UNROLL
      for (int j = 0; j < TT; ++j) {
        uint4 yv[4];
        EXQ_UNROLL
        for (int k = 0; k < 4; ++k) yv[k] = ld16(s.y + tt[j] * WS + 16 * p + 4 * k);
        const int* bs = s.bs + tt[j] * 16 + 4 * p;
        const int b01 = bs[0] + bs[1], b23 = bs[2] + bs[3];
        const bool gemm = ((gemm_mask >> j) & 1u) != 0;
        EXQ_UNROLL
        for (int i = 0; i < RT; ++i) {
          int s0 = 0, s1 = 0;
          EXQ_UNROLL
          for (int k = 0; k < 2; ++k) {
            s0 = qm::dp4a(wv[i][k].x, yv[k].x, s0);
            s0 = qm::dp4a(wv[i][k].y, yv[k].y, s0);
            s0 = qm::dp4a(wv[i][k].z, yv[k].z, s0);
            s0 = qm::dp4a(wv[i][k].w, yv[k].w, s0);
            s1 = qm::dp4a(wv[i][k + 2].x, yv[k + 2].x, s1);
            s1 = qm::dp4a(wv[i][k + 2].y, yv[k + 2].y, s1);
            s1 = qm::dp4a(wv[i][k + 2].z, yv[k + 2].z, s1);
            s1 = qm::dp4a(wv[i][k + 2].w, yv[k + 2].w, s1);
          }
          const int isb = sc0[i] * s0 + sc1[i] * s1;
          const int msb = m0[i] * b01 + m1[i] * b23;
          if (gemm) {
            a.acc[i][j] = qm::fma_(static_cast<float>(isb), dd[i][j], a.acc[i][j]);
            a.accm[i][j] = qm::fma_(static_cast<float>(msb), dm[i][j], a.accm[i][j]);
          } else {
            isum[i][j] += isb;
            imin[i][j] += msb;
          }
        }
      }
    }
    EXQ_UNROLL
    for (int j = 0; j < TT; ++j) {
      if (((gemm_mask >> j) & 1u) == 0) {
        EXQ_UNROLL
        for (int i = 0; i < RT; ++i) {
          a.acc[i][j] = qm::fma_(static_cast<float>(isum[i][j]), dd[i][j], a.acc[i][j]);
          a.accm[i][j] = qm::fma_(static_cast<float>(imin[i][j]), dm[i][j], a.accm[i][j]);
        }
      }
    }
  }
}

// gemm_mask of a thread: bit j when its token j (tile token tt, call token tok0 + tt) is
// below gemm_end (the Q4_K repack gemm order); only Q4KRep reads it.
template <Flavor FL, int TT>
EXQ_HD uint32_t gemm_mask_of(int tid, int tok0, int gemm_end) {
  uint32_t m = 0;
  for (int j = 0; j < TT; ++j)
    if (tok0 + thread_tok<FL, TT>(tid, j) < gemm_end) m |= 1u << j;
  return m;
}

// The butterfly the lane flavours run across the 8 chain lanes of a (row, token) (device:
// shuffles xor 4, 2, 1, each lane adding its partner's value; Q0Lanes: the thread's own
// acc + accm, then xor 2, 1), written on an array: lane 0 ends with (t0 + t2) + (t1 + t3),
// t_i = v[i] + v[i+4], which is hsum_float_8 (float + is commutative). The min chains
// (lanes 0..3) run the xor 2, 1 steps: (m0 + m2) + (m1 + m3). Host emulation of the
// kernel's combine; the device code is in matmul_qgemm.cu.
inline float butterfly8_host(const float (&v)[8]) {
  float a[8], b[8];
  for (int l = 0; l < 8; ++l) a[l] = v[l] + v[l ^ 4];
  for (int l = 0; l < 8; ++l) b[l] = a[l] + a[l ^ 2];
  return b[0] + b[1];
}
inline float butterfly4_host(const float (&m)[4]) {
  float a[4];
  for (int l = 0; l < 4; ++l) a[l] = m[l] + m[l ^ 2];
  return a[0] + a[1];
}

// Final result of a (row, token) from its combined chain values (lane flavours: hsum8 of acc
// plus, for Q4KLanes, hsum4 of accm; rep: acc, or acc - accm).
template <Flavor FL>
EXQ_HD float final_value(float acc_sum, float accm_sum) {
  if constexpr (FL == Flavor::Q4KLanes)
    return acc_sum + accm_sum;
  else if constexpr (FL == Flavor::Q4KRep)
    return acc_sum - accm_sum;
  else
    return acc_sum;
}

// Write-out: thread tid writes elements tid, tid + kThreads, ... of the [BT][32] out tile
// to y (a token's 32 rows are contiguous in y: coalesced), adding to y when accumulate.
template <Flavor FL, int TT, int BR>
EXQ_HD void store_tile(int tid, const Smem<FL, TT, BR>& s, int row0, int rows, int tok0, int n_tok,
                       float* __restrict__ y, int accumulate) {
  using G = Geo<FL, TT, BR>;
  for (int k = tid; k < G::BT * BR; k += kThreads) {
    const int t = k / BR, r = k % BR;
    if (tok0 + t < n_tok && row0 + r < rows) {
      float* o = y + static_cast<size_t>(tok0 + t) * static_cast<size_t>(rows) + (row0 + r);
      const float v = s.out[t * G::OS + r];
      *o = accumulate ? *o + v : v;
    }
  }
}

}  // namespace worker::kern::exact::qg
