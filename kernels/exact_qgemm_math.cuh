#pragma once
// Per-thread code of the exact quantized prompt GEMM (exact_qgemm.cu), __host__ __device__
// so that the host emulation test (exact_qgemm_test.cpp, ExactQgemmHost.*) replays the
// kernel's tiling thread by thread with the very same functions and checks it against
// cpu::dot_quantized bit for bit. See exact_qgemm.cu's header comment for the orders.
//
// Tiling: a CTA of kThreads threads owns kBR = 32 weight rows x BT tokens and walks the
// row in steps of 256 elements (8 Q0 blocks or one K super-block). Per step the whole CTA
// unpacks the 32 rows' weights to int8 (one 32-element unit per thread) and copies the BT
// tokens' activation quants into shared memory (load_w / load_a); then every thread runs
// its chains over the step's blocks in order (compute_step), its chain values in registers.
//  - "lane" flavours (Q0Lanes, Q6K, Q4KLanes): the 8 lane chains of a (row, token) live in 8
//    threads (L = lane & 7): thread L takes word L (elements 4L..4L+3) of every 32-element
//    unit: one dp4a per (row, token, unit) is exactly the reference's lane integer (Q0) or
//    one sub-block's part of it (K). A thread holds RT = 4 rows x TT tokens of chain L. At
//    the end the 8 chains combine with xor-4/2/1 butterflies, which is hsum_float_8's tree.
//  - "rep" flavours (Q4_0Rep, Q4KRep): 1 or 2 chains per (row, token) whose steps are whole
//    block / 64-element integer dots: one thread per (row, token) walks all 8 words of a unit
//    (128-bit shared loads), RT = 2 rows x TT tokens per thread.
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstring>

#include "exact_quant_math.cuh"
#include "gguf/ggml_types.h"

namespace worker::kern::exact::qg {

using qm::Flavor;

constexpr int kThreads = 256;  // 8 warps
constexpr int kBR = 32;        // weight rows per CTA
constexpr int kUnits = 8;      // 32-element units per step (256 elements)

template <GgmlType T>
EXQ_HD constexpr bool is_k() {
  return T == GgmlType::Q4_K || T == GgmlType::Q6_K;
}
template <Flavor FL>
EXQ_HD constexpr bool lane_flavor() {
  return FL == Flavor::Q0Lanes || FL == Flavor::Q6K || FL == Flavor::Q4KLanes;
}

// Tile geometry of a flavour and TT (tokens per thread).
template <Flavor FL, int TT>
struct Geo {
  static constexpr bool kLane = lane_flavor<FL>();
  static constexpr int LT = kLane ? 4 : 16;   // token lanes per warp
  static constexpr int LR = kLane ? 1 : 2;    // row lanes per warp
  static constexpr int RT = kBR / (8 * LR);   // rows per thread: 4 (lane) / 2 (rep)
  static constexpr int BT = LT * TT;          // tokens per CTA
  static constexpr int WS = kLane ? 72 : 68;  // words per shared row (bank padding)
  static constexpr int OS = kBR + 1;          // floats per token of the out tile
};

// Shared memory of one CTA. w / y: int8 quants, 64 words (256 elements) per row / token,
// word 8u + k = elements 4k..4k+3 of unit u. dw: Q0: fp16 d of unit u as float; K: [0] d,
// [1] dmin. sc: Q4_K [0..7] scales, [8..15] mins; Q6_K the 16 int8 scales. da: Q0: Q8_0
// scale of unit u; K: [0] the Q8_K d. bs: Q8_K bsums. out: the result tile [BT][OS].
template <Flavor FL, int TT>
struct Smem {
  using G = Geo<FL, TT>;
  alignas(16) uint32_t w[kBR * G::WS];
  alignas(16) uint32_t y[G::BT * G::WS];
  float dw[kBR * 8];
  int sc[kBR * 16];
  float da[G::BT * 8];
  int bs[G::BT * 16];
  float out[G::BT * G::OS];
};

// Per-thread chain values: acc (lane chain / acc), accm (Q4_K min chain / accm).
template <Flavor FL, int TT>
struct Acc {
  using G = Geo<FL, TT>;
  float acc[G::RT][TT];
  float accm[G::RT][TT];
};

// ---- small helpers ----

// float(s) for |s| < 2^22, exactly (as the int -> float conversion gives): the bits of
// 1.5 * 2^23 + s minus 1.5 * 2^23. Two full-rate ops instead of one quarter-rate I2F.
EXQ_HD float small_i2f(int s) {
  const uint32_t b = 0x4B400000u + static_cast<uint32_t>(s);
#if defined(__CUDA_ARCH__)
  const float f = __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
#endif
  return f - 12582912.0f;
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

// ---- weight unpacking: one 32-element unit as 8 words of int8 in element order ----

// Q8_0 / Q4_0 / Q5_0 block at p (2-byte aligned); d: its fp16 scale as float.
template <GgmlType T>
EXQ_HD void unpack_q0(const uint8_t* p, uint32_t (&w)[8], float& d) {
  d = qm::half_bits(qm::ld_u16(p));
  if constexpr (T == GgmlType::Q8_0) {
    qm::ld_words(p + 2, w);
  } else if constexpr (T == GgmlType::Q4_0) {
    uint32_t q[4];
    qm::ld_words(p + 2, q);
    for (int i = 0; i < 4; ++i) {
      w[i] = sub8_bytes(q[i] & 0x0F0F0F0Fu);             // elements 4i..: low nibbles
      w[i + 4] = sub8_bytes((q[i] >> 4) & 0x0F0F0F0Fu);  // elements 16+4i..: high nibbles
    }
  } else {  // Q5_0: qh (bit e = fifth bit of element e), then qs as Q4_0
    uint32_t q[5];
    qm::ld_words(p + 2, q);
    const uint32_t qh = q[0];
    for (int i = 0; i < 8; ++i) {
      const uint32_t nib = (i < 4 ? q[1 + i] : (q[1 + i - 4] >> 4)) & 0x0F0F0F0Fu;
      const uint32_t h = (qh >> (4 * i)) & 0xFu;  // fifth bits of elements 4i..4i+3
      const uint32_t hb = ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
      w[i] = sub16_bytes(nib | hb);
    }
  }
}

// Q4_K super-block at p, sub-block s: its 32 nibbles (unsigned 0..15), 6-bit scale and min;
// d / dmin: the block's fp16 scales.
EXQ_HD void unpack_q4k(const uint8_t* p, int s, uint32_t (&w)[8], int& sc, int& mn, float& d,
                       float& dmin) {
  uint32_t hw[4];
  qm::ld_words(p, hw);
  d = qm::half_bits(hw[0]);
  dmin = qm::half_bits(hw[0] >> 16);
  const uint32_t scw[3] = {hw[1], hw[2], hw[3]};
  qm::q4k_scale_min_w(s, scw, sc, mn);
  uint32_t q[8];
  qm::ld_words(p + 16 + 32 * (s >> 1), q);
  const int shift = 4 * (s & 1);
  for (int t = 0; t < 8; ++t) w[t] = (q[t] >> shift) & 0x0F0F0F0Fu;
}

// Q6_K super-block at p, sub-block g (elements 32g..32g+31): unsigned 6-bit quants, the
// int8 scales 2g, 2g+1 and d.
EXQ_HD void unpack_q6k(const uint8_t* p, int g, uint32_t (&w)[8], int& sc0, int& sc1, float& d) {
  uint32_t ql[8], qh[8];
  qm::ld_words(p + qm::q6k_ql_off(g), ql);
  qm::ld_words(p + qm::q6k_qh_off(g), qh);
  const int k = g & 3;
  const int nshift = (k >> 1) * 4, hshift = 2 * k;
  for (int t = 0; t < 8; ++t)
    w[t] = ((ql[t] >> nshift) & 0x0F0F0F0Fu) | (((qh[t] >> hshift) & 0x03030303u) << 4);
  const uint32_t s2 = qm::ld_u16(p + 192 + 2 * g);
  sc0 = static_cast<int8_t>(static_cast<uint8_t>(s2 & 0xFF));
  sc1 = static_cast<int8_t>(static_cast<uint8_t>(s2 >> 8));
  d = qm::half_bits(qm::ld_u16(p + 208));
}

// ---- the load phase of one step (every thread of the CTA) ----

// Weights of step `step`: thread tid unpacks unit tid & 7 of tile row tid >> 3 (zeros past
// the matrix). nb: blocks per row (32-element for Q0, super-blocks for K).
template <GgmlType T, Flavor FL, int TT>
EXQ_HD void load_w(int tid, int step, const uint8_t* __restrict__ w, int rows, size_t row_bytes,
                   int row0, int nb, Smem<FL, TT>& s) {
  using G = Geo<FL, TT>;
  const int r = tid >> 3, u = tid & 7;
  const int gr = row0 + r;
  uint32_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t* row = w + static_cast<size_t>(gr) * row_bytes;
  if constexpr (!is_k<T>()) {
    constexpr size_t bb = T == GgmlType::Q8_0 ? 34 : (T == GgmlType::Q4_0 ? 18 : 22);
    const int b = step * kUnits + u;
    float d = 0.0f;
    if (gr < rows && b < nb) unpack_q0<T>(row + static_cast<size_t>(b) * bb, v, d);
    s.dw[r * 8 + u] = d;
  } else if constexpr (T == GgmlType::Q4_K) {
    int sc = 0, mn = 0;
    float d = 0.0f, dmin = 0.0f;
    if (gr < rows) unpack_q4k(row + static_cast<size_t>(step) * 144, u, v, sc, mn, d, dmin);
    s.sc[r * 16 + u] = sc;
    s.sc[r * 16 + 8 + u] = mn;
    if (u == 0) {
      s.dw[r * 8] = d;
      s.dw[r * 8 + 1] = dmin;
    }
  } else {  // Q6_K
    int sc0 = 0, sc1 = 0;
    float d = 0.0f;
    if (gr < rows) unpack_q6k(row + static_cast<size_t>(step) * 210, u, v, sc0, sc1, d);
    s.sc[r * 16 + 2 * u] = sc0;
    s.sc[r * 16 + 2 * u + 1] = sc1;
    if (u == 0) s.dw[r * 8] = d;
  }
  uint32_t* dst = s.w + r * G::WS + 8 * u;
  st16(dst, make_uint4(v[0], v[1], v[2], v[3]));
  st16(dst + 4, make_uint4(v[4], v[5], v[6], v[7]));
}

// Activations of step `step` for tokens [tok0, tok0 + BT) (zeros past n_tok / the row).
template <GgmlType T, Flavor FL, int TT>
EXQ_HD void load_a(int tid, int step, const int8_t* __restrict__ aq, const float* __restrict__ ad,
                   const int32_t* __restrict__ abs, int cols, int nb, int tok0, int n_tok,
                   Smem<FL, TT>& s) {
  using G = Geo<FL, TT>;
  for (int k = tid; k < G::BT * 16; k += kThreads) {
    const int t = k >> 4, q = k & 15;  // 16 bytes q of the step (unit q >> 1)
    const int gt = tok0 + t;
    const bool ok = gt < n_tok && (is_k<T>() || step * kUnits + (q >> 1) < nb);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (ok)
      v = ld16(aq + static_cast<size_t>(gt) * cols + 256 * static_cast<size_t>(step) + 16 * q);
    st16(s.y + t * G::WS + 4 * q, v);
  }
  if constexpr (!is_k<T>()) {
    for (int k = tid; k < G::BT * 8; k += kThreads) {
      const int t = k >> 3, u = k & 7;
      const int gt = tok0 + t, b = step * kUnits + u;
      s.da[t * 8 + u] = (gt < n_tok && b < nb) ? ad[static_cast<size_t>(gt) * nb + b] : 0.0f;
    }
  } else {
    for (int k = tid; k < G::BT * 16; k += kThreads) {
      const int t = k >> 4, i = k & 15;
      const int gt = tok0 + t;
      const bool ok = gt < n_tok;
      s.bs[t * 16 + i] = ok ? abs[static_cast<size_t>(gt) * (cols / 16) + 16 * step + i] : 0;
      if (i == 0) s.da[t * 8] = ok ? ad[static_cast<size_t>(gt) * nb + step] : 0.0f;
    }
  }
}

// ---- thread coordinates ----
// Lane flavours: tile rows warp + 8 i (i < 4), tokens lt + 4 j, chain / word L.
// Rep flavours: tile rows 2 warp + lr + 16 i (i < 2), tokens lt + 16 j.
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
    return (lane >> 3) + 4 * j;
  else
    return (lane & 15) + 16 * j;
}

template <Flavor FL, int TT>
EXQ_HD void zero_acc(Acc<FL, TT>& a) {
  using G = Geo<FL, TT>;
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
template <GgmlType T, Flavor FL, int TT>
EXQ_HD void compute_step(int tid, const Smem<FL, TT>& s, int nunits, uint32_t gemm_mask,
                         Acc<FL, TT>& a) {
  using G = Geo<FL, TT>;
  constexpr int RT = G::RT, WS = G::WS;
  int rr[RT], tt[TT];
  EXQ_UNROLL
  for (int i = 0; i < RT; ++i) rr[i] = thread_row<FL, TT>(tid, i);
  EXQ_UNROLL
  for (int j = 0; j < TT; ++j) tt[j] = thread_tok<FL, TT>(tid, j);

  if constexpr (FL == Flavor::Q0Lanes) {
    // acc[i] = fma(d_w * d_a, float(lane int i), acc[i]), block after block.
    const int L = tid & 7;
    EXQ_UNROLL
    for (int u = 0; u < kUnits; ++u) {
      if (u < nunits) {
        uint32_t wv[RT], yv[TT];
        float dw[RT], da[TT];
        EXQ_UNROLL
        for (int i = 0; i < RT; ++i) {
          wv[i] = s.w[rr[i] * WS + 8 * u + L];
          dw[i] = s.dw[rr[i] * 8 + u];
        }
        EXQ_UNROLL
        for (int j = 0; j < TT; ++j) {
          yv[j] = s.y[tt[j] * WS + 8 * u + L];
          da[j] = s.da[tt[j] * 8 + u];
        }
        EXQ_UNROLL
        for (int i = 0; i < RT; ++i) {
          EXQ_UNROLL
          for (int j = 0; j < TT; ++j) {
            const int si = qm::dp4a(wv[i], yv[j], 0);
            a.acc[i][j] = qm::fma_(dw[i] * da[j], small_i2f(si), a.acc[i][j]);
          }
        }
      }
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
// shuffles xor 4, 2, 1, each lane adding its partner's value), written on an array: lane 0
// ends with (t0 + t2) + (t1 + t3), t_i = v[i] + v[i+4], which is hsum_float_8 (float + is
// commutative). The min chains (lanes 0..3) run the xor 2, 1 steps: (m0 + m2) + (m1 + m3).
// Host emulation of the kernel's combine; the device code is in exact_qgemm.cu.
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
template <Flavor FL, int TT>
EXQ_HD void store_tile(int tid, const Smem<FL, TT>& s, int row0, int rows, int tok0, int n_tok,
                       float* __restrict__ y, int accumulate) {
  using G = Geo<FL, TT>;
  for (int k = tid; k < G::BT * kBR; k += kThreads) {
    const int t = k / kBR, r = k % kBR;
    if (tok0 + t < n_tok && row0 + r < rows) {
      float* o = y + static_cast<size_t>(tok0 + t) * static_cast<size_t>(rows) + (row0 + r);
      const float v = s.out[t * G::OS + r];
      *o = accumulate ? *o + v : v;
    }
  }
}

}  // namespace worker::kern::exact::qg
