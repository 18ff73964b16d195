#include "engine/cpu/act_quant.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/errors.h"
#include "gguf/type_traits.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace worker::cpu {
namespace {

// Kernels are always-inline so that one body serves both the portable build and the
// FMA/AVX2 clones below (same floats: every step is an explicitly rounded fma or add).
#if defined(__GNUC__)
#define WORKER_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define WORKER_ALWAYS_INLINE inline
#endif

constexpr int kQ = TypeTraits<GgmlType::Q8_0>::kBlock;   // Q8_0 / Q4_0 / Q5_0 block
constexpr int kQK = TypeTraits<GgmlType::Q4_K>::kBlock;  // K-quant super-block

// fp16 -> fp32 by table (exact, as ggml's ggml_table_f32_f16): the block scales are read
// once per 32 or 256 elements, and the out-of-line conversion was ~10% of a quantized dot.
const float* f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_to_fp32(static_cast<uint16_t>(i));
    return t;
  }();
  return table.data();
}

float f16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return f16_table()[v];
}

// ggml's nearest_int: round half to even through the float mantissa trick.
int nearest_int(float f) {
  const float val = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &val, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

// quantize_row_q8_0 as the x86 build does it: d = amax/127 stored as fp16, q = x * (127/amax)
// rounded half to even.
void quantize_q8_0(const float* x, int64_t n, QuantizedActivation& o) {
  const int64_t nb = n / kQ;
  o.q.resize(static_cast<size_t>(n));
  o.d.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < kQ; ++j) amax = std::max(amax, std::fabs(x[b * kQ + j]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    o.d[static_cast<size_t>(b)] = fp16_to_fp32(fp32_to_fp16(d));
    for (int j = 0; j < kQ; ++j) {
      o.q[static_cast<size_t>(b * kQ + j)] =
          static_cast<int8_t>(std::nearbyint(x[b * kQ + j] * id));
    }
  }
}

// quantize_row_q8_K_ref
void quantize_q8_k(const float* x, int64_t n, QuantizedActivation& o) {
  const int64_t nb = n / kQK;
  o.q.assign(static_cast<size_t>(n), 0);
  o.d.assign(static_cast<size_t>(nb), 0.0f);
  o.bsum.assign(static_cast<size_t>(nb * 16), 0);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQK;
    float max = 0, amax = 0;
    for (int j = 0; j < kQK; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax == 0.0f) continue;
    const float iscale = -127.f / max;
    int8_t* q = o.q.data() + b * kQK;
    for (int j = 0; j < kQK; ++j)
      q[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * xb[j])));
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += q[j * 16 + i];
      o.bsum[static_cast<size_t>(b * 16 + j)] = s;
    }
    o.d[static_cast<size_t>(b)] = 1 / iscale;
  }
}

// Q8_0 / Q4_0 / Q5_0 rows against Q8_0 activations in the order of ggml's AVX2/AVX-512
// ggml_vec_dot_q{8,4,5}_0_q8_0 (one token) and llamafile's tinyBLAS_Q0_AVX (prompt batch),
// which agree: 8 float lanes, lane i holds the integer dot of elements 4i..4i+3 of each
// block (dpbusd / maddubs, exact), acc[i] = fma(d_w * d_a, lane, acc[i]) block after block,
// then hsum_float_8 ((v[i] + v[i+4]) for i < 4, then (t0 + t2) + (t1 + t3)).
// `wq` yields a block's 32 weight quants in element order.
template <typename Unpack>
WORKER_ALWAYS_INLINE float dot_q0_lanes(const uint8_t* row, size_t block_bytes,
                                        const QuantizedActivation& a, Unpack wq) {
  const int64_t nb = a.n / kQ;
  float acc[8] = {};
  int8_t w[kQ];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + static_cast<size_t>(b) * block_bytes;
    wq(blk, w);
    const int8_t* y = a.q.data() + b * kQ;
    const float d = f16_at(blk) * a.d[static_cast<size_t>(b)];
    int32_t p[kQ];  // products first: a shape the vectoriser handles (integers, exact)
    for (int e = 0; e < kQ; ++e) p[e] = int32_t{w[e]} * int32_t{y[e]};
    for (int i = 0; i < 8; ++i) {
      const int s = (p[4 * i] + p[4 * i + 1]) + (p[4 * i + 2] + p[4 * i + 3]);
      acc[i] = std::fma(d, static_cast<float>(s), acc[i]);
    }
  }
  const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5], t2 = acc[2] + acc[6],
              t3 = acc[3] + acc[7];
  return (t0 + t2) + (t1 + t3);
}

WORKER_ALWAYS_INLINE float dot_q8_0(const uint8_t* row, const QuantizedActivation& a) {
  return dot_q0_lanes(row, 34, a,
                      [](const uint8_t* blk, int8_t* w) { std::memcpy(w, blk + 2, kQ); });
}

// Q4_0 on x86: llama.cpp moves Q4_0 weights with a multiple of 8 rows into the CPU "repack"
// buffer (block_q4_0x8, ggml_gemv/gemm_q4_0_8x8_q8_0, prompt and decode alike): one float
// accumulator per output, acc = fma(float(integer block dot), d_w * d_a, acc), block after
// block. Rows not a multiple of 8 stay in the plain layout (dot_q0_lanes).
WORKER_ALWAYS_INLINE float dot_q4_0_repack(const uint8_t* row, const QuantizedActivation& a) {
  const int64_t nb = a.n / kQ;
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 18;
    const uint8_t* qs = blk + 2;
    const int8_t* y = a.q.data() + b * kQ;
    int sumi = 0;
    for (int j = 0; j < kQ / 2; ++j) {
      sumi += ((qs[j] & 0x0F) - 8) * y[j] + ((qs[j] >> 4) - 8) * y[j + kQ / 2];
    }
    acc = std::fma(static_cast<float>(sumi), f16_at(blk) * a.d[static_cast<size_t>(b)], acc);
  }
  return acc;
}

// Q4_0 / Q5_0 block -> 32 int8 weights in element order (low nibbles, then high nibbles)
WORKER_ALWAYS_INLINE void unpack_q4_0(const uint8_t* blk, int8_t* w) {
  const uint8_t* qs = blk + 2;
  for (int j = 0; j < kQ / 2; ++j) {
    w[j] = static_cast<int8_t>((qs[j] & 0x0F) - 8);
    w[j + kQ / 2] = static_cast<int8_t>((qs[j] >> 4) - 8);
  }
}

WORKER_ALWAYS_INLINE void unpack_q5_0(const uint8_t* blk, int8_t* w) {
  uint32_t qh;
  std::memcpy(&qh, blk + 2, 4);
  const uint8_t* qs = blk + 6;
  for (int j = 0; j < kQ / 2; ++j) {
    const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    w[j] = static_cast<int8_t>(((qs[j] & 0x0F) | xh0) - 16);
    w[j + kQ / 2] = static_cast<int8_t>(((qs[j] >> 4) | xh1) - 16);
  }
}

WORKER_ALWAYS_INLINE float dot_q4_0(const uint8_t* row, const QuantizedActivation& a) {
  return dot_q0_lanes(row, 18, a, unpack_q4_0);
}

WORKER_ALWAYS_INLINE float dot_q5_0(const uint8_t* row, const QuantizedActivation& a) {
  return dot_q0_lanes(row, 22, a, unpack_q5_0);
}

WORKER_ALWAYS_INLINE void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// ggml_vec_dot_q4_K_q8_K, x86 AVX2 version (Q4_K weights llama.cpp does not repack: rows
// not a multiple of 8, e.g. an output matrix of 2051 rows). Block layout d, dmin (fp16),
// scales[12], qs[128]. Per super-block: 8 int32 lanes, lane t = sum over the 8 sub-blocks j
// of scale_j * (dot of elements 4t..4t+3 of sub-block j), acc[t] = fma(d_a * d, lane t,
// acc[t]); the mins go to 4 lanes, lane k = min_2k bsum32_2k + min_2k+1 bsum32_2k+1,
// accm[k] = fma(-d_a * dmin, lane k, accm[k]). Result hsum_float_8(acc) + ((accm0 + accm2) +
// (accm1 + accm3)).
WORKER_ALWAYS_INLINE float dot_q4_k(const uint8_t* row, const QuantizedActivation& a) {
  const int64_t nb = a.n / kQK;
  float acc[8] = {}, accm[4] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 144;
    const uint8_t* scales = blk + 4;
    const uint8_t* qs = blk + 16;
    const int8_t* y = a.q.data() + b * kQK;
    const int32_t* bs = a.bsum.data() + b * 16;
    int sc[8], mn[8];
    for (int j = 0; j < 8; ++j) scale_min_k4(j, scales, sc[j], mn[j]);
    const float yd = a.d[static_cast<size_t>(b)];
    const float d = yd * f16_at(blk);
    const float dmin = -yd * f16_at(blk + 2);
    for (int k = 0; k < 4; ++k) {
      const int prod =
          mn[2 * k] * (bs[4 * k] + bs[4 * k + 1]) + mn[2 * k + 1] * (bs[4 * k + 2] + bs[4 * k + 3]);
      accm[k] = std::fma(dmin, static_cast<float>(prod), accm[k]);
    }
    int32_t lane[8] = {};
    for (int j = 0; j < 4; ++j) {  // 64 elements: low nibbles (sub-block 2j), high (2j+1)
      const uint8_t* q = qs + 32 * j;
      const int8_t* yl = y + 64 * j;
      for (int t = 0; t < 8; ++t) {
        int pl = 0, ph = 0;
        for (int e = 4 * t; e < 4 * t + 4; ++e) {
          pl += (q[e] & 0xF) * yl[e];
          ph += (q[e] >> 4) * yl[32 + e];
        }
        lane[t] += sc[2 * j] * pl + sc[2 * j + 1] * ph;
      }
    }
    for (int t = 0; t < 8; ++t) acc[t] = std::fma(d, static_cast<float>(lane[t]), acc[t]);
  }
  const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5], t2 = acc[2] + acc[6],
              t3 = acc[3] + acc[7];
  return ((t0 + t2) + (t1 + t3)) + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
}

// Q4_K on x86: llama.cpp repacks Q4_K weights with a multiple of 8 rows (block_q4_Kx8,
// prompt and decode alike). Integer sums are exact; the floats differ by kernel:
// ggml_gemv_q4_K_8x8_q8_K (one token, and the n % 4 last tokens of a batch) accumulates once
// per super-block, acc = fma(float(isum), d * d_a, acc), accm = fma(float(imin), dmin * d_a,
// accm); ggml_gemm_q4_K_8x8_q8_K (groups of 4 tokens) does the same once per pair of
// sub-blocks (64 elements). Result acc - accm. (Checked value for value against the library's
// CPU_REPACK buffer path, which is what llama.cpp ran.)
WORKER_ALWAYS_INLINE float dot_q4_k_repack(const uint8_t* row, const QuantizedActivation& a) {
  const int64_t nb = a.n / kQK;
  float acc = 0.0f, accm = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 144;
    const uint8_t* scales = blk + 4;
    const uint8_t* qs = blk + 16;
    const int8_t* y = a.q.data() + b * kQK;
    const int32_t* bs = a.bsum.data() + b * 16;
    const float yd = a.d[static_cast<size_t>(b)];
    const float dd = f16_at(blk) * yd, dm = f16_at(blk + 2) * yd;
    int isum = 0, imin = 0;
    for (int j = 0; j < 4; ++j) {  // 64 elements: low nibbles (sub-block 2j), high (2j+1)
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * j, scales, sc0, m0);
      scale_min_k4(2 * j + 1, scales, sc1, m1);
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += (qs[j * 32 + l] & 0xF) * y[j * 64 + l];
        s1 += (qs[j * 32 + l] >> 4) * y[j * 64 + 32 + l];
      }
      const int isb = sc0 * s0 + sc1 * s1;
      const int msb = m0 * (bs[4 * j] + bs[4 * j + 1]) + m1 * (bs[4 * j + 2] + bs[4 * j + 3]);
      if (a.repack_gemm) {
        acc = std::fma(static_cast<float>(isb), dd, acc);
        accm = std::fma(static_cast<float>(msb), dm, accm);
      } else {
        isum += isb;
        imin += msb;
      }
    }
    if (!a.repack_gemm) {
      acc = std::fma(static_cast<float>(isum), dd, acc);
      accm = std::fma(static_cast<float>(imin), dm, accm);
    }
  }
  return acc - accm;
}

// ggml_vec_dot_q6_K_q8_K, x86 AVX2 version (also the AVX-512 builds; K-quants never go
// through tinyBLAS or the repack buffer on x86, so prompt and decode alike). Block layout
// ql[128], qh[64], scales[16] (int8), d (fp16). Per super-block 8 int32 lanes: lane t gets,
// for each 32-element group g (elements 32g..32g+31, scale pair 2g, 2g+1), scale *
// (dot of unsigned 6-bit quants and q8 over elements 4t..4t+3 of the group), minus
// 32 * (bsum[2t] sc[2t] + bsum[2t+1] sc[2t+1]); then acc[t] = fma(d, float(lane t), acc[t])
// and hsum_float_8. Integer parts are exact; the int -> float conversion and the float
// steps are what must come in this order.
WORKER_ALWAYS_INLINE float dot_q6_k(const uint8_t* row, const QuantizedActivation& a) {
  const int64_t nb = a.n / kQK;
  float acc[8] = {};
  uint8_t v[kQK];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 210;
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    for (int c = 0; c < 2; ++c) {  // two halves of 128
      const uint8_t* q4 = ql + 64 * c;
      const uint8_t* h = qh + 32 * c;
      uint8_t* o = v + 128 * c;
      for (int l = 0; l < 32; ++l) {
        o[l + 0] = static_cast<uint8_t>((q4[l] & 0xF) | (((h[l] >> 0) & 3) << 4));
        o[l + 32] = static_cast<uint8_t>((q4[l + 32] & 0xF) | (((h[l] >> 2) & 3) << 4));
        o[l + 64] = static_cast<uint8_t>((q4[l] >> 4) | (((h[l] >> 4) & 3) << 4));
        o[l + 96] = static_cast<uint8_t>((q4[l + 32] >> 4) | (((h[l] >> 6) & 3) << 4));
      }
    }
    const int8_t* y = a.q.data() + b * kQK;
    const int32_t* bs = a.bsum.data() + b * 16;
    int32_t lane[8] = {};
    for (int g = 0; g < 8; ++g) {
      for (int t = 0; t < 8; ++t) {
        const int e = 32 * g + 4 * t;
        const int p = v[e] * y[e] + v[e + 1] * y[e + 1] + v[e + 2] * y[e + 2] + v[e + 3] * y[e + 3];
        lane[t] += sc[2 * g + (t >= 4 ? 1 : 0)] * p;
      }
    }
    const float d = a.d[static_cast<size_t>(b)] * f16_at(blk + 208);
    for (int t = 0; t < 8; ++t) {
      lane[t] -= 32 * (bs[2 * t] * sc[2 * t] + bs[2 * t + 1] * sc[2 * t + 1]);
      acc[t] = std::fma(d, static_cast<float>(lane[t]), acc[t]);
    }
  }
  const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5], t2 = acc[2] + acc[6],
              t3 = acc[3] + acc[7];
  return (t0 + t2) + (t1 + t3);
}

// ---- llama.cpp CPU summation orders (see act_quant.h) ----
// The bodies are always-inline templates instantiated twice: once for CPUs with FMA (where
// std::fma becomes one instruction, and the lane loops vectorise) and once portable. Both
// compute identical floats: every step is an explicitly rounded fma or add, in a fixed order.

// a * b rounded to float before it is used: keeps GCC/clang from contracting it with a
// following add into an FMA (which they do in the FMA clones below, -ffp-contract=fast).
WORKER_ALWAYS_INLINE float rounded_product(float a, float b) {
  float p = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#endif
  return p;
}

WORKER_ALWAYS_INLINE float hsum16_impl(const float* v) {
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i + 4] + t8[i];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

WORKER_ALWAYS_INLINE float dot_vecdot_impl(const float* x, const float* y, int64_t n, bool f16) {
  float acc[64] = {};
  const int64_t np = n & ~int64_t{63};
  for (int64_t i = 0; i < np; i += 64) {
    for (int l = 0; l < 64; ++l) acc[l] = std::fma(x[i + l], y[i + l], acc[l]);
  }
  // GGML_F32x16_REDUCE: sum[0] += sum[2], sum[1] += sum[3]; sum[0] += sum[1]; reduce_add.
  float r[16];
  for (int l = 0; l < 16; ++l) r[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
  float sum = hsum16_impl(r);
  if (f16) {
    // ggml_vec_dot_f16: leftovers are added to a double (ggml_float) as float products
    double s = static_cast<double>(sum);
    for (int64_t i = np; i < n; ++i) s += static_cast<double>(x[i] * y[i]);
    return static_cast<float>(s);
  }
  // ggml_vec_dot_f32's leftover loop `sumf += x[i]*y[i]` as GCC 11 compiled it (zen4
  // disassembly): products of 16, then of 8, elements are multiplied as vectors and added to
  // the float sum one by one in index order (rounded product, then add); the last < 8 are
  // scalar FMAs.
  int64_t i = np;
  if (n - i >= 16) {
    for (; i + 16 <= n; i += 16) {
      for (int l = 0; l < 16; ++l) sum += rounded_product(x[i + l], y[i + l]);
    }
  }
  if (n - i >= 8) {
    for (int l = 0; l < 8; ++l) sum += rounded_product(x[i + l], y[i + l]);
    i += 8;
  }
  for (; i < n; ++i) sum = std::fma(x[i], y[i], sum);
  return sum;
}

WORKER_ALWAYS_INLINE float dot_tinyblas_impl(const float* a, const float* b, int64_t k) {
  float acc[16] = {};
  for (int64_t i = 0; i < k; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  }
  return hsum16_impl(acc);
}

// _mm512_dpbf16_ps, one lane: c += a[1]*b[1], then c += a[0]*b[0], each rounded once (the
// product of two bf16 values is exact in float, so an FMA gives the same sum). The
// instruction's DAZ/FTZ (denormals as zero) is not reproduced: no activation or weight of
// a working model is that small.
// (Written with a contiguous product buffer: GCC 12.2's loop vectoriser miscompiled the
// stride-2 form at -O3, measured.)
WORKER_ALWAYS_INLINE void dpbf16(float* c, const float* a, const float* b) {
  float p[32];
  for (int l = 0; l < 32; ++l) p[l] = a[l] * b[l];
  for (int l = 0; l < 16; ++l) c[l] = (c[l] + p[2 * l + 1]) + p[2 * l];
}

WORKER_ALWAYS_INLINE float dot_bf16_vecdot_impl(const float* x, const float* y, int64_t n) {
  float c1[16] = {}, c2[16] = {};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    dpbf16(c1, x + i, y + i);
    dpbf16(c2, x + i + 32, y + i + 32);
  }
  double sum = static_cast<double>(hsum16_impl(c1));
  sum += static_cast<double>(hsum16_impl(c2));
  for (; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

WORKER_ALWAYS_INLINE float dot_bf16_tinyblas_impl(const float* a, const float* b, int64_t k) {
  float acc[16] = {};
  for (int64_t i = 0; i < k; i += 32) {
    dpbf16(acc, a + i, b + i);
  }
  return hsum16_impl(acc);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) float dot_bf16_vecdot_fma(const float* x, const float* y,
                                                              int64_t n) {
  return dot_bf16_vecdot_impl(x, y, n);
}
__attribute__((target("avx2,fma"))) float dot_bf16_tinyblas_fma(const float* a, const float* b,
                                                                int64_t k) {
  return dot_bf16_tinyblas_impl(a, b, k);
}
__attribute__((target("avx2,fma"))) float dot_vecdot_fma(const float* x, const float* y, int64_t n,
                                                         bool f16) {
  return dot_vecdot_impl(x, y, n, f16);
}
__attribute__((target("avx2,fma"))) float dot_tinyblas_fma(const float* a, const float* b,
                                                           int64_t k) {
  return dot_tinyblas_impl(a, b, k);
}
std::atomic<bool> g_force_portable{false};
bool have_fma() {
  static const bool yes = __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
  return yes && !g_force_portable.load(std::memory_order_relaxed);
}
#endif

}  // namespace

float hsum16(const float* v) {
  return hsum16_impl(v);
}

void force_portable_kernels(bool on) {
#if defined(__x86_64__) && defined(__GNUC__)
  g_force_portable.store(on, std::memory_order_relaxed);
#else
  (void)on;
#endif
}

float dot_vecdot(const float* x, const float* y, int64_t n, bool f16) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_fma()) return dot_vecdot_fma(x, y, n, f16);
#endif
  return dot_vecdot_impl(x, y, n, f16);
}

float dot_tinyblas(const float* a, const float* b, int64_t k) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_fma()) return dot_tinyblas_fma(a, b, k);
#endif
  return dot_tinyblas_impl(a, b, k);
}

float dot_bf16_vecdot(const float* x, const float* y, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_fma()) return dot_bf16_vecdot_fma(x, y, n);
#endif
  return dot_bf16_vecdot_impl(x, y, n);
}

float dot_bf16_tinyblas(const float* a, const float* b, int64_t k) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_fma()) return dot_bf16_tinyblas_fma(a, b, k);
#endif
  return dot_bf16_tinyblas_impl(a, b, k);
}

// llamafile_sgemm: only for prompt batches (n >= 2); F32 x F32 and F16 x F16 (the
// activation converted to F16 first) on AVX-512F, BF16 x BF16 on AVX512_BF16; tinyBLAS::matmul
// needs k % KN == 0 and m % 4 == 0, otherwise mul_mat falls back to vec_dot.
bool tinyblas_takes(GgmlType t, int64_t m, int64_t n_tokens, int64_t k) {
  if (n_tokens < 2 || m % 4 != 0) return false;
  if (t == GgmlType::F32 || t == GgmlType::F16) return k % 16 == 0;
  if (t == GgmlType::BF16) return k % 32 == 0;  // tinyBLAS<32, __m512, __m512bh> (AVX512_BF16)
  return false;
}

// ggml_v_expf, AVX-512 version (vec.h), one lane: fnmadd(a, b, c) = fma(-a, b, c) and
// _mm512_scalef_ps(j, n) = j * 2^n with one rounding (std::ldexp).
float ggml_expf(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  if (std::isnan(n)) return n;
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  return std::ldexp(j, static_cast<int>(n));
}

float ggml_silu(float x) {
  return x / (1.0f + ggml_expf(0.0f - x));
}

void quantize_activation(GgmlType t, const float* x, int64_t n, QuantizedActivation& o) {
  o.weight_type = t;
  o.n = n;
  switch (act_type_for(static_cast<uint32_t>(t), "quantize_activation")) {
    case ActType::F32: o.f.assign(x, x + n); return;
    case ActType::F16:
      o.f.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        o.f[static_cast<size_t>(i)] = fp16_to_fp32(fp32_to_fp16(x[i]));
      return;
    case ActType::BF16:
      o.f.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        o.f[static_cast<size_t>(i)] = bf16_to_fp32(fp32_to_bf16(x[i]));
      return;
    case ActType::Q8_0: quantize_q8_0(x, n, o); return;
    case ActType::Q8_K: quantize_q8_k(x, n, o); return;
  }
}

namespace {
#if defined(__x86_64__) && defined(__GNUC__)
// dot_q0_lanes with the instructions ggml uses (AVX2 `ggml_vec_dot_q8_0_q8_0` and friends):
// 32 int8 weights and activations, |w| * sign(y, w) through maddubs + madd into the 8 int32
// lanes of 4 products (exact: no pair exceeds 2 * 128 * 127), converted, then one FMA per
// block. Same integers, same float steps as the portable dot_q0_lanes.
template <typename Unpack>
__attribute__((target("avx2,fma"))) inline float dot_q0_lanes_avx2(const uint8_t* row,
                                                                   size_t block_bytes,
                                                                   const QuantizedActivation& a,
                                                                   Unpack wq) {
  const int64_t nb = a.n / kQ;
  __m256 acc = _mm256_setzero_ps();
  alignas(32) int8_t w[kQ];
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + static_cast<size_t>(b) * block_bytes;
    wq(blk, w);
    const __m256i qx = _mm256_load_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + b * kQ));
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, p16));
    const __m256 d = _mm256_set1_ps(f16_at(blk) * a.d[static_cast<size_t>(b)]);
    acc = _mm256_fmadd_ps(d, q, acc);
  }
  alignas(32) float l[8];
  _mm256_store_ps(l, acc);
  const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
  return (t0 + t2) + (t1 + t3);
}
#endif

// Q5_0 block -> 32 int8 weights with AVX2 (what unpack_q5_0 computes): nibbles in element
// order, and 0xF0 OR-ed in where the fifth bit is clear ((n | 0x10) - 16 = n, n - 16 = n | 0xF0).
__attribute__((target("avx2,fma"))) inline void unpack_q5_0_avx2(const uint8_t* blk, int8_t* w) {
  const __m128i nib = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 6));
  const __m256i q = _mm256_and_si256(
      _mm256_insertf128_si256(_mm256_castsi128_si256(nib), _mm_srli_epi16(nib, 4), 1),
      _mm256_set1_epi8(0x0F));
  uint32_t qh;
  std::memcpy(&qh, blk + 2, 4);
  // byte i gets bit i of qh: broadcast, pick byte i / 8, OR all bits but (i % 8), compare
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i set = _mm256_cmpeq_epi8(
      _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
  const __m256i hi = _mm256_andnot_si256(set, _mm256_set1_epi8(static_cast<char>(0xF0)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(w), _mm256_or_si256(q, hi));
}

// dot(row of quantized type Tr, a), with the AVX2 instructions where kAvx2.
template <bool kAvx2, class Tr>
WORKER_ALWAYS_INLINE float dot_blocks(const uint8_t* r, const QuantizedActivation& a) {
  constexpr GgmlType T = Tr::kType;
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (kAvx2 && T == GgmlType::Q8_0) {
    return dot_q0_lanes_avx2(r, Tr::kBlockBytes, a,
                             [](const uint8_t* blk, int8_t* w) { std::memcpy(w, blk + 2, kQ); });
  }
  if constexpr (kAvx2 && T == GgmlType::Q4_0) {
    if (!a.repacked) return dot_q0_lanes_avx2(r, Tr::kBlockBytes, a, unpack_q4_0);
  }
  if constexpr (kAvx2 && T == GgmlType::Q5_0) {
    return dot_q0_lanes_avx2(r, Tr::kBlockBytes, a, unpack_q5_0_avx2);
  }
#endif
  if constexpr (T == GgmlType::Q8_0) return dot_q8_0(r, a);
  if constexpr (T == GgmlType::Q4_0) return a.repacked ? dot_q4_0_repack(r, a) : dot_q4_0(r, a);
  if constexpr (T == GgmlType::Q5_0) return dot_q5_0(r, a);
  if constexpr (T == GgmlType::Q4_K) return a.repacked ? dot_q4_k_repack(r, a) : dot_q4_k(r, a);
  if constexpr (T == GgmlType::Q6_K) return dot_q6_k(r, a);
}
#if defined(__x86_64__) && defined(__GNUC__)
template <class Tr>
__attribute__((target("avx2,fma"))) float dot_blocks_fma(const uint8_t* r,
                                                         const QuantizedActivation& a) {
  return dot_blocks<true, Tr>(r, a);
}
#endif
}  // namespace

float dot_quantized(GgmlType t, const void* row, const QuantizedActivation& a, float* scratch) {
  const auto* r = static_cast<const uint8_t*>(row);
  return dispatch_or_throw(t, "dot_quantized", [&](auto tr) -> float {
    using Tr = decltype(tr);
    if constexpr (Tr::kFamily == DotFamily::Float) {
      dequantize_row(t, row, scratch, a.n);
      if constexpr (Tr::kType == GgmlType::BF16) return dot_bf16_vecdot(scratch, a.f.data(), a.n);
      return dot_vecdot(scratch, a.f.data(), a.n, Tr::kType == GgmlType::F16);
    } else {
#if defined(__x86_64__) && defined(__GNUC__)
      if (have_fma()) return dot_blocks_fma<Tr>(r, a);
#endif
      return dot_blocks<false, Tr>(r, a);
    }
  });
}

}  // namespace worker::cpu
