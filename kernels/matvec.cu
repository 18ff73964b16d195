#include <algorithm>
#include <cstdlib>
#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "launch.cuh"
#include "matvec.cuh"
#include "swiglu.cuh"

namespace worker::kern {
namespace {

constexpr int kRowsPerBlock = 4;  // 4 warps, one row each: 224 blocks for a 896-row matrix
constexpr int kMaxTok = 8;        // tokens sharing one pass over a weight row

// 32 activations of sub-block sb (zeros for an inactive lane), rounded to the weight
// type's vec_dot_type. For Q8_K every lane of the warp must take part.
template <GgmlType T>
__device__ __forceinline__ void load_x32(const float* __restrict__ x, int sb, bool active,
                                         float* xv) {
  if (active) {
    const float4* xp = reinterpret_cast<const float4*>(x + sb * 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 f = xp[i];
      xv[4 * i] = f.x;
      xv[4 * i + 1] = f.y;
      xv[4 * i + 2] = f.z;
      xv[4 * i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) xv[i] = 0.0f;
  }
  if constexpr (TypeTraits<T>::kAct == ActType::Q8_0) {
    if (active) round_q8_0_32(xv);
  } else if constexpr (TypeTraits<T>::kAct == ActType::Q8_K) {
    round_q8_k_32x8(xv);
  }
}

// One activation rounded for a float weight type (F16/BF16 weights see F16/BF16 inputs).
template <GgmlType T>
__device__ __forceinline__ float round_x(float x) {
  if constexpr (T == GgmlType::F16)
    return round_f16(x);
  else if constexpr (T == GgmlType::BF16)
    return round_bf16(x);
  else
    return x;
}

// Quantized types: lane handles 32-weight sub-blocks lane, lane+32, ...; each sub-block
// is dequantized into registers once and used for every token of the tile.
template <GgmlType T, int NT>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    matvec_q_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                    const float* __restrict__ x, float* __restrict__ y, int n_tok, int accumulate) {
  griddep_wait();
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int t0 = blockIdx.y * NT;
  if (r >= rows) return;
  const int nt = min(NT, n_tok - t0);
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  const int nsb = cols / 32;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#pragma unroll 2
  for (int sb0 = 0; sb0 < nsb; sb0 += kWarp) {  // uniform trip count: Q8_K shuffles
    const int sb = sb0 + lane;
    const bool active = sb < nsb;
    float v[32];
    if (active) deq32<T>(row, sb, v);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        float xv[32];
        load_x32<T>(x + static_cast<size_t>(t0 + t) * cols, sb, active, xv);
        if (active) {
          float a = 0.0f;
#pragma unroll
          for (int i = 0; i < 32; ++i) a += v[i] * xv[i];
          acc[t] += a;
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < nt) {
      float* out = y + static_cast<size_t>(t0 + t) * rows + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Float types: lane reads 8 consecutive weights per step (16 bytes for F16/BF16), so a
// warp reads one contiguous stretch of the row per step.
template <GgmlType T>
__device__ __forceinline__ void load8(const uint8_t* row, int j, float* v) {
  if constexpr (T == GgmlType::F32) {
    const float4* p = reinterpret_cast<const float4*>(row) + j / 4;
    const float4 a = p[0], b = p[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + static_cast<size_t>(j) * 2);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f;
      if constexpr (T == GgmlType::F16) {
        f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      } else {
        f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      }
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}

// One 8-element step of a float-weight dot: sum of v[i] * x[i] with x rounded for T.
template <GgmlType T>
__device__ __forceinline__ float dot8(const float* v, const float* __restrict__ x) {
  const float4* xp = reinterpret_cast<const float4*>(x);
  const float4 a = xp[0], b = xp[1];
  return v[0] * round_x<T>(a.x) + v[1] * round_x<T>(a.y) + v[2] * round_x<T>(a.z) +
         v[3] * round_x<T>(a.w) + v[4] * round_x<T>(b.x) + v[5] * round_x<T>(b.y) +
         v[6] * round_x<T>(b.z) + v[7] * round_x<T>(b.w);
}

// This thread's partial dots of NR float-weight rows with x, elements j0, j0 + step, ...
// (cols % 8 == 0). Contains the PDL wait: the weights of the first PF steps are loaded
// before it (weights are never written by a kernel), so their DRAM latency overlaps the
// previous kernel instead of following it. Each row's sum runs in ascending j.
template <GgmlType T, int NR, int PF>
__device__ __forceinline__ void rows_dot_pf(const uint8_t* (&rows)[NR], int cols,
                                            const float* __restrict__ x, int j0, int step,
                                            float (&acc)[NR]) {
  float v[PF][NR][8];
#pragma unroll
  for (int i = 0; i < PF; ++i) {
    const int j = j0 + i * step;
#pragma unroll
    for (int r = 0; r < NR; ++r)
      if (j < cols) load8<T>(rows[r], j, v[i][r]);
  }
  griddep_wait();
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int i = 0; i < PF; ++i) {
    const int j = j0 + i * step;
    if (j < cols) {
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] += dot8<T>(v[i][r], x + j);
    }
  }
#pragma unroll 2
  for (int j = j0 + PF * step; j < cols; j += step) {
    float w[NR][8];
#pragma unroll
    for (int r = 0; r < NR; ++r) load8<T>(rows[r], j, w[r]);
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] += dot8<T>(w[r], x + j);
  }
}

template <GgmlType T, int NT>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    matvec_f_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                    const float* __restrict__ x, float* __restrict__ y, int n_tok, int accumulate) {
  griddep_wait();
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int t0 = blockIdx.y * NT;
  if (r >= rows) return;
  const int nt = min(NT, n_tok - t0);
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#pragma unroll 4
  for (int j = lane * 8; j < cols; j += kWarp * 8) {
    float v[8];
    load8<T>(row, j, v);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        const float4* xp =
            reinterpret_cast<const float4*>(x + static_cast<size_t>(t0 + t) * cols + j);
        const float4 a = xp[0], b = xp[1];
        acc[t] += v[0] * round_x<T>(a.x) + v[1] * round_x<T>(a.y) + v[2] * round_x<T>(a.z) +
                  v[3] * round_x<T>(a.w) + v[4] * round_x<T>(b.x) + v[5] * round_x<T>(b.y) +
                  v[6] * round_x<T>(b.z) + v[7] * round_x<T>(b.w);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < nt) {
      float* out = y + static_cast<size_t>(t0 + t) * rows + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Float rows whose length is not a multiple of 8 (tiny test models): one element per lane.
template <GgmlType T, int NT>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    matvec_scalar_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                         const float* __restrict__ x, float* __restrict__ y, int n_tok,
                         int accumulate) {
  griddep_wait();
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int t0 = blockIdx.y * NT;
  if (r >= rows) return;
  const int nt = min(NT, n_tok - t0);
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (int j = lane; j < cols; j += kWarp) {
    const float v = load_float_elem(row, static_cast<uint32_t>(T), j);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) acc[t] += v * round_x<T>(x[static_cast<size_t>(t0 + t) * cols + j]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < nt) {
      float* out = y + static_cast<size_t>(t0 + t) * rows + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// One token, float weights, short-output matrices (wo, down: 896 rows): one row per
// block, the block's 4 warps split the row (8 elements per thread per step), then a
// fixed-order sum of the 4 warp sums (D15: no atomics). 4x the warps of one-warp-per-row,
// so more loads are in flight on a matrix that is only a few MB.
constexpr int kSplitThreads = 128;
template <GgmlType T>
__global__ void __launch_bounds__(kSplitThreads)
    matvec_split_kernel(const uint8_t* __restrict__ w, int cols, size_t row_bytes,
                        const float* __restrict__ x, float* __restrict__ y, int accumulate) {
  static_assert(TypeTraits<T>::kBlock == 1, "float weight types only");
  __shared__ float sh[kSplitThreads / kWarp];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int r = blockIdx.x;
  const uint8_t* rows[1] = {w + static_cast<size_t>(r) * row_bytes};
  float part[1];
  rows_dot_pf<T, 1, 2>(rows, cols, x, tid * 8, kSplitThreads * 8, part);
  float acc = part[0];
  acc = warp_sum(acc);
  if (lane == 0) sh[warp] = acc;
  __syncthreads();
  if (tid == 0) {
    float s = sh[0];
#pragma unroll
    for (int i = 1; i < kSplitThreads / kWarp; ++i) s += sh[i];
    y[r] = accumulate ? y[r] + s : s;
  }
}

// ---- one token, quantized weights ----
// The activation row is rounded to the weight's vec_dot_type (Q8_0 / Q8_K) ONCE per block
// into shared memory (the per-row kernels above round it again for every row: for the
// 151936-row LM head that was most of the work), then each row is split over S warps
// (S from the row length: short rows one warp, long rows up to 8) whose sums are added in
// a fixed order. Segments: up to 3 matrices of one layout in one grid (Q/K/V); kSwiglu:
// gate and up rows in one warp, y = silu(gate x) * (up x).
constexpr int kQ1Threads = 256;
constexpr int kQ1Warps = kQ1Threads / kWarp;
constexpr int kQ1MaxCols = 16384;
// Shared memory of the rounded row: int8 values [cols], then per 32 the float scale d
// (x = d * q exactly as rounded) and the int sum of the 32 values; the sub-block dots are
// integer (dp4a) dots against it.
__host__ __device__ constexpr size_t q1_smem_bytes(int cols) {
  return static_cast<size_t>(cols) + static_cast<size_t>(cols / 32) * (sizeof(float) + sizeof(int));
}

struct Segs {
  const uint8_t* w[3];
  float* y[3];
  int rows[3];
  int n;
  // Mixed-type segments (matvec_q1_kernel with kMixed): each segment's own type and row
  // size; the types share one activation rounding (Q8_0 or Q8_K).
  uint32_t type[3] = {0, 0, 0};
  size_t row_bytes[3] = {0, 0, 0};
};

// Every thread rounds 8 consecutive activations; the lanes of one rounding block (4 for
// Q8_0's 32, the whole warp for Q8_K's 256) agree on its scale through shuffles. Same
// arithmetic per element as round_q8_0_32 / round_q8_k_32x8 (and act_quant.cpp), so the
// same values; the largest magnitude wins with the lowest index on ties, as there.
template <GgmlType T>
__device__ __forceinline__ void round_x_to_smem(const float* __restrict__ x, int cols,
                                                int8_t* __restrict__ xq, float* __restrict__ xd,
                                                int* __restrict__ xsum) {
  constexpr bool kK = TypeTraits<T>::kAct == ActType::Q8_K;
  constexpr int kGroup = kK ? 32 : 4;
  const int lane = threadIdx.x % kWarp;
  const int n8 = cols / 8;  // a multiple of 4 (Q8_0) or 32 (Q8_K): whole groups only
  for (int c = threadIdx.x; c - lane < n8; c += kQ1Threads) {  // trip count per warp
    const bool active = c < n8;
    float v[8];
    if (active) {
      const float4 p = reinterpret_cast<const float4*>(x)[2 * c];
      const float4 q = reinterpret_cast<const float4*>(x)[2 * c + 1];
      v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z,
      v[7] = q.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
    float amax, mx;
    group_absmax<kGroup, 8>(v, amax, mx);
    float d = 0.0f;
    int q[8];
    if constexpr (kK) {
      if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = 0;
      } else {
        const float iscale = -127.f / mx;
        d = 1.0f / iscale;
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = static_cast<int>(fminf(127.0f, rintf(iscale * v[i])));
      }
    } else {
      d = round_f16(amax / 127.f);
      const float id = amax != 0.0f ? 127.f / amax : 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = static_cast<int>(rintf(v[i] * id));
    }
    if (active) {
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo |= (static_cast<uint32_t>(q[i]) & 0xFFu) << (8 * i);
        hi |= (static_cast<uint32_t>(q[4 + i]) & 0xFFu) << (8 * i);
      }
      reinterpret_cast<uint2*>(xq)[c] = make_uint2(lo, hi);
    }
    // per 32-block: the scale and the sum of the 8-bit values (the integer dots' offset
    // terms: Q4_0/Q5_0's -8/-16 and Q4_K's minimum)
    int qs = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) qs += q[i];
    qs += __shfl_xor_sync(0xffffffffu, qs, 1);
    qs += __shfl_xor_sync(0xffffffffu, qs, 2);
    if (active && (c & 3) == 0) {
      xd[c >> 2] = d;
      xsum[c >> 2] = qs;
    }
  }
}

// ---- integer dots of one 32-weight sub-block with the rounded row ----
// The row is held as int8 q with a scale d and the sum of q per 32 (x = d * q), so a
// sub-block's dot is 8 dp4a over exact integers and one or two float multiplies: the
// per-element int->float conversions of a float dequantization were the bottleneck
// (conversions run at 1/8 of the FMA rate on sm_90).
struct XBlk {
  uint32_t w[8];  // 32 int8 activations
  float d;
  int sum;
};
__device__ __forceinline__ XBlk x_blk(const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                      const int* __restrict__ xsum, int sb) {
  XBlk x;
  const uint4* p = reinterpret_cast<const uint4*>(xq + 32 * sb);
  const uint4 a = p[0], b = p[1];
  x.w[0] = a.x, x.w[1] = a.y, x.w[2] = a.z, x.w[3] = a.w;
  x.w[4] = b.x, x.w[5] = b.y, x.w[6] = b.z, x.w[7] = b.w;
  x.d = xd[sb];
  x.sum = xsum[sb];
  return x;
}
__device__ __forceinline__ int dp4(uint32_t a, uint32_t b, int c) {
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
}

template <GgmlType T>
__device__ __forceinline__ float dot32_int(const uint8_t* row, int sb, const XBlk& x);

// block_q8_0: d * sum(q * qx)
template <>
__device__ __forceinline__ float dot32_int<GgmlType::Q8_0>(const uint8_t* row, int sb,
                                                           const XBlk& x) {
  const uint8_t* b = row + sb * 34;
  uint32_t w[8];
  load_words(b + 2, w);
  int s = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) s = dp4(w[k], x.w[k], s);
  return ld_half(b) * x.d * static_cast<float>(s);
}

// block_q4_0: nibbles n (low = elements 0..15, high = 16..31), weight d * (n - 8)
template <>
__device__ __forceinline__ float dot32_int<GgmlType::Q4_0>(const uint8_t* row, int sb,
                                                           const XBlk& x) {
  const uint8_t* b = row + sb * 18;
  uint32_t w[4];
  load_words(b + 2, w);
  int s = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s = dp4(w[k] & 0x0F0F0F0Fu, x.w[k], s);
    s = dp4((w[k] >> 4) & 0x0F0F0F0Fu, x.w[4 + k], s);
  }
  return ld_half(b) * x.d * static_cast<float>(s - 8 * x.sum);
}

// bit i of `bits` (4 bits) to bit 4 of byte i
__device__ __forceinline__ uint32_t spread4_to_bit4(uint32_t bits) {
  return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// block_q5_0: 5-bit n = nibble | (bit j of qh) << 4, weight d * (n - 16)
template <>
__device__ __forceinline__ float dot32_int<GgmlType::Q5_0>(const uint8_t* row, int sb,
                                                           const XBlk& x) {
  const uint8_t* b = row + sb * 22;
  uint32_t w[5];  // qh, then qs
  load_words(b + 2, w);
  const uint32_t qh = w[0];
  int s = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t lo = (w[1 + k] & 0x0F0F0F0Fu) | spread4_to_bit4((qh >> (4 * k)) & 0xFu);
    const uint32_t hi =
        ((w[1 + k] >> 4) & 0x0F0F0F0Fu) | spread4_to_bit4((qh >> (16 + 4 * k)) & 0xFu);
    s = dp4(lo, x.w[k], s);
    s = dp4(hi, x.w[4 + k], s);
  }
  return ld_half(b) * x.d * static_cast<float>(s - 16 * x.sum);
}

// block_q4_K sub-block s: weight d*sc*n - dmin*m
template <>
__device__ __forceinline__ float dot32_int<GgmlType::Q4_K>(const uint8_t* row, int sb,
                                                           const XBlk& x) {
  const uint8_t* b = row + (sb >> 3) * 144;
  const int s = sb & 7;
  const Q4KSub sub = q4k_sub(b, s);
  uint32_t w[8];
  load_words(b + 16 + 32 * (s >> 1), w);
  const int shift = (s & 1) * 4;
  int acc = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) acc = dp4((w[k] >> shift) & 0x0F0F0F0Fu, x.w[k], acc);
  return x.d * (sub.d * static_cast<float>(sub.scale) * static_cast<float>(acc) -
                sub.dmin * static_cast<float>(sub.mn) * static_cast<float>(x.sum));
}

// block_q6_K sub-block s: two halves of 16 with their own int8 scale, weight d*sc*(n - 32)
template <>
__device__ __forceinline__ float dot32_int<GgmlType::Q6_K>(const uint8_t* row, int sb,
                                                           const XBlk& x) {
  const uint8_t* b = row + (sb >> 3) * 210;
  const int s = sb & 7, h = s >> 2, k = s & 3;
  uint32_t ql[8], qh[8];
  load_words(b + 64 * h + 32 * (k & 1), ql);
  load_words(b + 128 + 32 * h, qh);
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * k;
  const int nshift = (k >> 1) * 4, hshift = 2 * k;
  int acc[2] = {0, 0}, xs[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t n = ((ql[j] >> nshift) & 0x0F0F0F0Fu) | (((qh[j] >> hshift) & 0x03030303u) << 4);
    acc[j >> 2] = dp4(n, x.w[j], acc[j >> 2]);
    xs[j >> 2] = dp4(0x01010101u, x.w[j], xs[j >> 2]);
  }
  return ld_half(b + 208) * x.d *
         (static_cast<float>(sc[0]) * static_cast<float>(acc[0] - 32 * xs[0]) +
          static_cast<float>(sc[1]) * static_cast<float>(acc[1] - 32 * xs[1]));
}

__device__ __forceinline__ float dot32_int_any(uint32_t type, const uint8_t* row, int sb,
                                               const XBlk& x) {
  return dispatch(type, [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (quantized(Tr::kFamily)) {
      return dot32_int<Tr::kType>(row, sb, x);
    } else {
      return 0.0f;  // float weights never share a quantized launch
    }
  });
}

// L2 prefetch of the 128-byte line holding p (weights, before the PDL wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <GgmlType T, int S, bool kSwiglu, bool kMixed = false>
__global__ void __launch_bounds__(kQ1Threads)
    matvec_q1_kernel(Segs segs, const uint8_t* __restrict__ w_up, int cols, size_t row_bytes,
                     const float* __restrict__ x, int accumulate) {
  extern __shared__ uint4 xs_raw[];
  int8_t* xq = reinterpret_cast<int8_t*>(xs_raw);
  float* xd = reinterpret_cast<float*>(xq + cols);
  int* xsum = reinterpret_cast<int*>(xd + cols / 32);
  __shared__ float part[kQ1Warps][2];
  constexpr int R = kQ1Warps / S;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, piece = warp % S;
  const int nsb = cols / 32;
  int total = 0;
  for (int i = 0; i < segs.n; ++i) total += segs.rows[i];
  // The grid may be smaller than the row count (the LM head): blocks then walk the rows
  // with a grid stride, so the rounded row is built once per block rather than per 8 rows.
  struct RowRef {
    const uint8_t* row = nullptr;
    const uint8_t* row_u = nullptr;
    float* out = nullptr;
    uint32_t type = 0;
    bool valid = false;
  };
  auto locate = [&](int base) {
    RowRef ref;
    int r = base + warp / S, s = 0;
    while (s < segs.n && r >= segs.rows[s]) r -= segs.rows[s++];
    if (s >= segs.n) return ref;
    const size_t rb = kMixed ? segs.row_bytes[s] : row_bytes;
    ref.type = kMixed ? segs.type[s] : static_cast<uint32_t>(T);
    ref.row = segs.w[s] + static_cast<size_t>(r) * rb;
    if constexpr (kSwiglu) ref.row_u = w_up + static_cast<size_t>(r) * row_bytes;
    ref.out = segs.y[s] + r;
    ref.valid = true;
    return ref;
  };
  const int sb0 = piece * kWarp + lane;
  {
    // Weights are never written by a kernel: pull this lane's first block into L2 before
    // the PDL wait, so its DRAM latency overlaps the previous kernel's tail.
    const RowRef f = locate(blockIdx.x * R);
    if (f.valid && sb0 < nsb) {
      const size_t rb = kMixed ? 0 : row_bytes;
      const size_t off = kMixed ? 0 : static_cast<size_t>(sb0) * rb / static_cast<size_t>(nsb);
      prefetch_l2(f.row + off);
      if constexpr (kSwiglu) prefetch_l2(f.row_u + off);
    }
  }
  griddep_wait();
  round_x_to_smem<T>(x, cols, xq, xd, xsum);
  __syncthreads();
  for (int base = blockIdx.x * R; base < total; base += gridDim.x * R) {  // block-uniform
    const RowRef ref = locate(base);
    float a = 0.0f, u = 0.0f;
    if (ref.valid) {
      for (int sb = sb0; sb < nsb; sb += kWarp * S) {
        const XBlk xb = x_blk(xq, xd, xsum, sb);
        if constexpr (kMixed)
          a += dot32_int_any(ref.type, ref.row, sb, xb);
        else
          a += dot32_int<T>(ref.row, sb, xb);
        if constexpr (kSwiglu) u += dot32_int<T>(ref.row_u, sb, xb);
      }
    }
    a = warp_sum(a);
    if constexpr (kSwiglu) u = warp_sum(u);
    if constexpr (S > 1) {
      if (lane == 0) {
        part[warp][0] = a;
        part[warp][1] = u;
      }
      __syncthreads();
      if (piece == 0) {
        a = part[warp][0];
        u = part[warp][1];
#pragma unroll
        for (int k = 1; k < S; ++k) {
          a += part[warp + k][0];
          u += part[warp + k][1];
        }
      }
      __syncthreads();  // part[] is reused by the next rows
    }
    if (ref.valid && piece == 0 && lane == 0) {
      // same rounding as the unfused swiglu kernel: silu(g) * u
      const float res = kSwiglu ? a / (1.0f + expf(-a)) * u : a;
      *ref.out = accumulate ? *ref.out + res : res;
    }
  }
}

template <GgmlType T, int S, bool kSwiglu, bool kMixed = false>
void launch_q1_split(const Segs& segs, int rows, const uint8_t* w_up, int cols, size_t row_bytes,
                     const float* x, bool acc, cudaStream_t st) {
  constexpr int kRowsPerBlock = kQ1Warps / S;
  // The carveout first (launch_pdl_smem would set it at the first launch): the occupancy
  // below depends on it.
  static const bool carveout_set = [] {
    carveout_for_occupancy(reinterpret_cast<const void*>(matvec_q1_kernel<T, S, kSwiglu, kMixed>),
                           kQ1Threads, q1_smem_bytes(kQ1MaxCols));
    return true;
  }();
  (void)carveout_set;
  // At most the blocks that fit on the GPU at once (one wave); more rows are walked by
  // the blocks (grid stride).
  static const int max_blocks = [] {
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, matvec_q1_kernel<T, S, kSwiglu, kMixed>, kQ1Threads, q1_smem_bytes(kQ1MaxCols)));
    return std::max(1, sms * std::max(1, per_sm));
  }();
  const int blocks = std::min((rows + kRowsPerBlock - 1) / kRowsPerBlock, max_blocks);
  launch_pdl_smem("matvec_q1_kernel", matvec_q1_kernel<T, S, kSwiglu, kMixed>,
                  dim3(static_cast<unsigned>(blocks)), dim3(kQ1Threads), q1_smem_bytes(cols), st,
                  segs, w_up, cols, row_bytes, x, acc ? 1 : 0);
}

template <GgmlType T, bool kSwiglu, bool kMixed = false>
void launch_q1(const Segs& segs, const uint8_t* w_up, int cols, size_t row_bytes, const float* x,
               bool acc, cudaStream_t st) {
  int rows = 0;
  for (int i = 0; i < segs.n; ++i) rows += segs.rows[i];
  const int nsb = cols / 32;
  if (nsb <= 64)
    launch_q1_split<T, 1, kSwiglu, kMixed>(segs, rows, w_up, cols, row_bytes, x, acc, st);
  else if (nsb <= 128)
    launch_q1_split<T, 2, kSwiglu, kMixed>(segs, rows, w_up, cols, row_bytes, x, acc, st);
  else if (nsb <= 256)
    launch_q1_split<T, 4, kSwiglu, kMixed>(segs, rows, w_up, cols, row_bytes, x, acc, st);
  else
    launch_q1_split<T, 8, kSwiglu, kMixed>(segs, rows, w_up, cols, row_bytes, x, acc, st);
}

// True when the one-token quantized kernel takes this shape (x fits in shared memory).
bool q1_fits(int64_t cols) {
  return cols <= kQ1MaxCols;
}

// Rows up to which a one-token matvec takes the split kernel (the LM head and the wide
// FFN matrices have rows enough to fill the GPU with one warp per row).
constexpr int64_t kSplitMaxRows = 2048;

template <GgmlType T, int NT>
void launch_one(const WeightView& w, const float* x, float* y, int n_tok, bool acc,
                cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((w.rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((n_tok + NT - 1) / NT));
  const auto* data = static_cast<const uint8_t*>(w.data);
  // Float types only: measured on an H200, a quantized variant (a thread per 32-weight
  // sub-block) made Q4_K_M decode slower; see reports/perf-notes.md v5.
  if constexpr (TypeTraits<T>::kBlock > 1) {
    if (NT == 1 && q1_fits(w.cols)) {
      const Segs segs{
          {data, nullptr, nullptr}, {y, nullptr, nullptr}, {static_cast<int>(w.rows), 0, 0}, 1};
      launch_q1<T, false>(segs, nullptr, static_cast<int>(w.cols), w.row_bytes, x, acc, s);
      return;
    }
  }
  if constexpr (TypeTraits<T>::kBlock == 1) {
    if (NT == 1 && w.rows <= kSplitMaxRows && w.cols % 8 == 0) {
      launch_pdl("matvec_split_kernel", matvec_split_kernel<T>, dim3(static_cast<unsigned>(w.rows)),
                 dim3(kSplitThreads), s, data, static_cast<int>(w.cols), w.row_bytes, x, y, acc);
      CUDA_CHECK_LAUNCH("matvec_split_kernel");
      return;
    }
  }
  if constexpr (TypeTraits<T>::kBlock == 1) {
    if (w.cols % 8 != 0) {
      launch_pdl("matvec_scalar_kernel", matvec_scalar_kernel<T, NT>, dim3(grid),
                 dim3(kRowsPerBlock * kWarp), s, data, static_cast<int>(w.rows),
                 static_cast<int>(w.cols), w.row_bytes, x, y, n_tok, acc);
      CUDA_CHECK_LAUNCH("matvec_scalar_kernel");
      return;
    }
    launch_pdl("matvec_f_kernel", matvec_f_kernel<T, NT>, dim3(grid), dim3(kRowsPerBlock * kWarp),
               s, data, static_cast<int>(w.rows), static_cast<int>(w.cols), w.row_bytes, x, y,
               n_tok, acc);
  } else {
    launch_pdl("matvec_q_kernel", matvec_q_kernel<T, NT>, dim3(grid), dim3(kRowsPerBlock * kWarp),
               s, data, static_cast<int>(w.rows), static_cast<int>(w.cols), w.row_bytes, x, y,
               n_tok, acc);
  }
  CUDA_CHECK_LAUNCH("matvec kernel");
}

template <GgmlType T>
void launch_type(const WeightView& w, const float* x, float* y, int n_tok, bool acc,
                 cudaStream_t s) {
  const int elems = TypeTraits<T>::kBlock == 1 ? 1 : TypeTraits<T>::kBlock;
  if (w.cols % elems != 0) {
    throw WorkerError(ErrorCode::Internal,
                      "matvec: row length " + std::to_string(w.cols) + " of type " +
                          std::string(ggml_type_name(static_cast<uint32_t>(T))) +
                          " is not a multiple of " + std::to_string(elems));
  }
  if (n_tok == 1) {
    launch_one<T, 1>(w, x, y, n_tok, acc, s);
  } else if (n_tok == 2) {
    launch_one<T, 2>(w, x, y, n_tok, acc, s);
  } else if (n_tok <= 4) {
    launch_one<T, 4>(w, x, y, n_tok, acc, s);
  } else {
    launch_one<T, kMaxTok>(w, x, y, n_tok, acc, s);
  }
}

template <typename T>
__device__ __forceinline__ T to_lowp(float f);
template <>
__device__ __forceinline__ __half to_lowp<__half>(float f) {
  return __float2half_rn(f);
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_lowp<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}

template <typename T>
__global__ void to_lowp_kernel(const float* __restrict__ x, T* __restrict__ out, size_t n) {
  griddep_wait();
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = to_lowp<T>(x[i]);
}

// ---- decode-only fused launches: Q/K/V in one grid; gate+up+SwiGLU in one grid ----

// One warp's dot product of a weight row with x (n_tok = 1), summed over the warp.
template <GgmlType T>
__device__ __forceinline__ float row_dot(const uint8_t* __restrict__ row, int cols,
                                         const float* __restrict__ x, int lane) {
  float acc = 0.0f;
  if constexpr (TypeTraits<T>::kBlock > 1) {
    const int nsb = cols / 32;
    for (int sb0 = 0; sb0 < nsb; sb0 += kWarp) {
      const int sb = sb0 + lane;
      const bool active = sb < nsb;
      float v[32], xv[32];
      if (active) deq32<T>(row, sb, v);
      load_x32<T>(x, sb, active, xv);
      if (active) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) a += v[i] * xv[i];
        acc += a;
      }
    }
  } else if (cols % 8 == 0) {
#pragma unroll 4
    for (int j = lane * 8; j < cols; j += kWarp * 8) {
      float v[8];
      load8<T>(row, j, v);
      const float4* xp = reinterpret_cast<const float4*>(x + j);
      const float4 a = xp[0], b = xp[1];
      acc += v[0] * round_x<T>(a.x) + v[1] * round_x<T>(a.y) + v[2] * round_x<T>(a.z) +
             v[3] * round_x<T>(a.w) + v[4] * round_x<T>(b.x) + v[5] * round_x<T>(b.y) +
             v[6] * round_x<T>(b.z) + v[7] * round_x<T>(b.w);
    }
  } else {
    for (int j = lane; j < cols; j += kWarp) {
      acc += load_float_elem(row, static_cast<uint32_t>(T), j) * round_x<T>(x[j]);
    }
  }
  return warp_sum(acc);
}

template <GgmlType T, bool kSwiglu>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    matvec_multi_kernel(Segs segs, const uint8_t* __restrict__ w_up, int cols, size_t row_bytes,
                        const float* __restrict__ x) {
  const int lane = threadIdx.x % kWarp;
  int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  int s = 0;
  while (s < segs.n && r >= segs.rows[s]) r -= segs.rows[s++];
  if (s >= segs.n) return;
  constexpr int NR = kSwiglu ? 2 : 1;
  const uint8_t* rows[NR];
  rows[0] = segs.w[s] + static_cast<size_t>(r) * row_bytes;
  if constexpr (kSwiglu) rows[NR - 1] = w_up + static_cast<size_t>(r) * row_bytes;
  float res[NR];
  bool done = false;
  if constexpr (TypeTraits<T>::kBlock == 1) {
    if (cols % 8 == 0) {
      rows_dot_pf<T, NR, 4>(rows, cols, x, lane * 8, kWarp * 8, res);
#pragma unroll
      for (int i = 0; i < NR; ++i) res[i] = warp_sum(res[i]);
      done = true;
    }
  }
  if (!done) {
    griddep_wait();
#pragma unroll
    for (int i = 0; i < NR; ++i) res[i] = row_dot<T>(rows[i], cols, x, lane);
  }
  if constexpr (kSwiglu) {
    const float a = res[0], u = res[NR - 1];
    // same rounding as the unfused swiglu kernel: silu(g) * u
    if (lane == 0) segs.y[s][r] = a / (1.0f + expf(-a)) * u;
  } else {
    if (lane == 0) segs.y[s][r] = res[0];
  }
}

template <GgmlType T, bool kSwiglu>
void launch_multi(const Segs& segs, const uint8_t* w_up, int cols, size_t row_bytes, const float* x,
                  cudaStream_t st) {
  if constexpr (TypeTraits<T>::kBlock > 1) {
    if (q1_fits(cols)) return launch_q1<T, kSwiglu>(segs, w_up, cols, row_bytes, x, false, st);
  }
  int rows = 0;
  for (int i = 0; i < segs.n; ++i) rows += segs.rows[i];
  launch_pdl("matvec_multi_kernel", matvec_multi_kernel<T, kSwiglu>,
             dim3((rows + kRowsPerBlock - 1) / kRowsPerBlock), dim3(kRowsPerBlock * kWarp), st,
             segs, w_up, cols, row_bytes, x);
  CUDA_CHECK_LAUNCH("matvec_multi_kernel");
}

template <bool kSwiglu>
void dispatch_multi(uint32_t type, const Segs& segs, const uint8_t* w_up, int cols,
                    size_t row_bytes, const float* x, cudaStream_t st) {
  dispatch_or_throw(type, "matvec", [&](auto tr) {
    launch_multi<decltype(tr)::kType, kSwiglu>(segs, w_up, cols, row_bytes, x, st);
  });
}

bool same_layout(const WeightView& a, const WeightView& b) {
  return a.type == b.type && a.cols == b.cols && a.row_bytes == b.row_bytes;
}
}  // namespace

void matvec_qkv(const WeightView& q, const WeightView& k, const WeightView& v, const float* x,
                float* yq, float* yk, float* yv, cudaStream_t stream) {
  if (!same_layout(q, k) || !same_layout(q, v)) {
    // Quantized Q/K/V of different types (a Q4_K_M file's Q5_0 Q and K with a Q8_0 V)
    // still share one launch when they round the activations alike.
    const ActType kind = act_type_of(q.type);
    static const bool mixed_off = std::getenv("WORKER_NO_MIXED_QKV") != nullptr;  // A/B runs
    if (!mixed_off && (kind == ActType::Q8_0 || kind == ActType::Q8_K) &&
        act_type_of(k.type) == kind && act_type_of(v.type) == kind && q.cols == k.cols &&
        q.cols == v.cols && q1_fits(q.cols) && q.cols % act_block(kind) == 0) {
      Segs segs{{static_cast<const uint8_t*>(q.data), static_cast<const uint8_t*>(k.data),
                 static_cast<const uint8_t*>(v.data)},
                {yq, yk, yv},
                {static_cast<int>(q.rows), static_cast<int>(k.rows), static_cast<int>(v.rows)},
                3,
                {q.type, k.type, v.type},
                {q.row_bytes, k.row_bytes, v.row_bytes}};
      const int cols = static_cast<int>(q.cols);
      if (kind == ActType::Q8_0)
        launch_q1<GgmlType::Q8_0, false, true>(segs, nullptr, cols, 0, x, false, stream);
      else
        launch_q1<GgmlType::Q4_K, false, true>(segs, nullptr, cols, 0, x, false, stream);
      return;
    }
    matvec(q, x, yq, 1, false, stream);
    matvec(k, x, yk, 1, false, stream);
    matvec(v, x, yv, 1, false, stream);
    return;
  }
  const Segs segs{{static_cast<const uint8_t*>(q.data), static_cast<const uint8_t*>(k.data),
                   static_cast<const uint8_t*>(v.data)},
                  {yq, yk, yv},
                  {static_cast<int>(q.rows), static_cast<int>(k.rows), static_cast<int>(v.rows)},
                  3};
  dispatch_multi<false>(q.type, segs, nullptr, static_cast<int>(q.cols), q.row_bytes, x, stream);
}

void matvec_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* y,
                   float* u_scratch, cudaStream_t stream) {
  if (!same_layout(gate, up) || gate.rows != up.rows) {
    matvec(gate, x, y, 1, false, stream);
    matvec(up, x, u_scratch, 1, false, stream);
    swiglu(y, u_scratch, static_cast<size_t>(gate.rows), stream);
    return;
  }
  const Segs segs{{static_cast<const uint8_t*>(gate.data), nullptr, nullptr},
                  {y, nullptr, nullptr},
                  {static_cast<int>(gate.rows), 0, 0},
                  1};
  dispatch_multi<true>(gate.type, segs, static_cast<const uint8_t*>(up.data),
                       static_cast<int>(gate.cols), gate.row_bytes, x, stream);
}

void matvec(const WeightView& w, const float* x, float* y, int n_tok, bool accumulate,
            cudaStream_t stream) {
  if (n_tok <= 0 || w.rows <= 0 || w.cols <= 0) {
    throw WorkerError(ErrorCode::Internal, "matvec: empty shape");
  }
  dispatch_or_throw(w.type, "matvec", [&](auto tr) {
    launch_type<decltype(tr)::kType>(w, x, y, n_tok, accumulate, stream);
  });
}

bool gemm_supported(uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

void gemm_cublas(cublasHandle_t handle, const WeightView& w, const float* x, void* x_lowp, float* y,
                 int n_tok, bool accumulate, cudaStream_t stream) {
  const auto t = static_cast<GgmlType>(w.type);
  if (!gemm_supported(w.type)) {
    throw WorkerError(ErrorCode::Internal, "gemm_cublas: unsupported weight type " +
                                               std::string(ggml_type_name(w.type)));
  }
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  const size_t n = static_cast<size_t>(n_tok) * static_cast<size_t>(w.cols);
  const int m = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Row-major W [rows, cols] is column-major [cols, rows]; so y^T = op_T(W) * x^T with
  // x [n_tok, cols] row-major = column-major [cols, n_tok].
  auto gemm = [&](const void* b, cudaDataType_t ty, float bt) {
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n_tok, k, &one, w.data, ty, k, b,
                              ty, k, &bt, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  };
  if (t == GgmlType::F32) {
    gemm(x, CUDA_R_32F, beta);
    return;
  }
  // The activations are rounded to the weight type (what the CPU reference and
  // llama.cpp do); products of 16-bit values are exact in the FP32 accumulation.
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  if (t == GgmlType::F16) {
    auto* xh = static_cast<__half*>(x_lowp);
    launch_pdl("to_lowp_kernel", to_lowp_kernel<__half>, dim3(blocks), dim3(256), stream, x, xh, n);
    CUDA_CHECK_LAUNCH("to_lowp_kernel<half>");
    gemm(xh, CUDA_R_16F, beta);
  } else {
    auto* xb = static_cast<__nv_bfloat16*>(x_lowp);
    launch_pdl("to_lowp_kernel", to_lowp_kernel<__nv_bfloat16>, dim3(blocks), dim3(256), stream, x,
               xb, n);
    CUDA_CHECK_LAUNCH("to_lowp_kernel<bf16>");
    gemm(xb, CUDA_R_16BF, beta);
  }
}

}  // namespace worker::kern
