#pragma once
// One row of an exact F32 / F16 / BF16 one-token product, computed by one warp in the
// reference's vec_dot order (see matvec1_float.cu for the orders), from global memory
// (warp_dot: the row streamed through a rolling register window) or from shared memory
// (smem_row_dot). Shared by matvec1_float.cu and the persistent decode kernel
// (decode_step.cu). Compiled with -fmad=false; every product / sum / fma goes through xf::.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "exact_float_math.cuh"
#include "gguf/ggml_types.h"

namespace worker::kern::exact::fr {

template <GgmlType T>
struct Raw {
  using type = uint32_t;  // two 16-bit weights
};
template <>
struct Raw<GgmlType::F32> {
  using type = uint2;  // two floats
};

// The weight loads are volatile asm so that they are issued where they are written: the
// rolling window below relies on D loads being in flight; plain loads were sunk next to
// their use by the compiler (the 896 x 4864 product ran one L2 round trip per step).
template <GgmlType T>
__device__ __forceinline__ typename Raw<T>::type load_pair(const uint8_t* __restrict__ row, int i,
                                                           int lane) {
  if constexpr (T == GgmlType::F32) {
    const uint2* p = reinterpret_cast<const uint2*>(row) + 32 * i + lane;
    uint2 v;
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
  } else {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(row) + 32 * i + lane;
    uint32_t v;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
  }
}

template <GgmlType T>
__device__ __forceinline__ void unpack_pair(const typename Raw<T>::type& r, float& w0, float& w1) {
  if constexpr (T == GgmlType::F32) {
    w0 = __uint_as_float(r.x);
    w1 = __uint_as_float(r.y);
  } else if constexpr (T == GgmlType::F16) {
    w0 = __half2float(__ushort_as_half(static_cast<unsigned short>(r & 0xFFFFu)));
    w1 = __half2float(__ushort_as_half(static_cast<unsigned short>(r >> 16)));
  } else {
    w0 = __uint_as_float(r << 16);
    w1 = __uint_as_float(r & 0xFFFF0000u);
  }
}

template <GgmlType T, int D>
__device__ __forceinline__ void prefetch(const uint8_t* __restrict__ row, int n_it, int lane,
                                         typename Raw<T>::type (&raw)[D]) {
#pragma unroll
  for (int u = 0; u < D; ++u) {
    if (u < n_it) raw[u] = load_pair<T>(row, u, lane);
  }
}

// The chains' reduce (+ hsum16) and the leftovers: the result is valid in lane 0 (leftovers
// are added there), the tree's sum in every lane. `row` may be global or shared memory.
template <GgmlType T>
__device__ __forceinline__ float finish(float a0, float a1, const uint8_t* row, int cols,
                                        const float* __restrict__ x, int lane) {
  const int np = (cols / 64) * 64;
  auto we = [row](int i) {
    if constexpr (T == GgmlType::F32) {
      return reinterpret_cast<const float*>(row)[i];
    } else {
      const uint32_t h = reinterpret_cast<const unsigned short*>(row)[i];
      if constexpr (T == GgmlType::F16) {
        return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
      } else {
        return __uint_as_float(h << 16);
      }
    }
  };
  // leftovers (cols % 64 != 0, rare): lane 0 reads the row and x (global or shared memory)
  if constexpr (T == GgmlType::BF16) {
    (void)a1;
#pragma unroll
    for (int m = 8; m >= 1; m >>= 1) a0 = xf::add_rn(a0, __shfl_xor_sync(0xffffffffu, a0, m));
    const float h2 = __shfl_xor_sync(0xffffffffu, a0, 16);
    double d = static_cast<double>(a0);
    d += static_cast<double>(h2);
    if (lane == 0 && np != cols) d = xf::tail_double(d, we, x, np, cols);
    return static_cast<float>(d);
  } else {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
      a0 = xf::add_rn(a0, __shfl_xor_sync(0xffffffffu, a0, m));
      a1 = xf::add_rn(a1, __shfl_xor_sync(0xffffffffu, a1, m));
    }
    float res = xf::add_rn(a0, a1);
    if (lane == 0 && np != cols) {
      if constexpr (T == GgmlType::F32) {
        res = xf::tail_f32(res, we, x, np, cols);
      } else {
        res = static_cast<float>(xf::tail_double(static_cast<double>(res), we, x, np, cols));
      }
    }
    return res;
  }
}

// The row's dot with the staged activation, in the reference's order (see the top); the
// result is valid in lane 0 (leftovers are added there), the tree's sum in every lane.
template <GgmlType T, int D>
__device__ __forceinline__ float warp_dot(const uint8_t* __restrict__ row, int cols,
                                          typename Raw<T>::type (&raw)[D],
                                          const float2* __restrict__ xp,
                                          const float* __restrict__ x, int lane) {
  const int n_it = cols / 64;
  float a0 = 0.0f, a1 = 0.0f;  // F32/F16: chains 2t, 2t+1; BF16: a0 is the dpbf16 lane
  for (int i0 = 0; i0 < n_it; i0 += D) {
#pragma unroll
    for (int u = 0; u < D; ++u) {
      const int i = i0 + u;
      if (i < n_it) {
        float w0, w1;
        unpack_pair<T>(raw[u], w0, w1);
        if (i + D < n_it) raw[u] = load_pair<T>(row, i + D, lane);
        const float2 xv = xp[32 * i + lane];
        if constexpr (T == GgmlType::BF16) {
          a0 = xf::dpbf16_step(a0, w0, xv.x, w1, xv.y);
        } else {
          a0 = xf::fma_step(a0, w0, xv.x);
          a1 = xf::fma_step(a1, w1, xv.y);
        }
      }
    }
  }
  return finish<T>(a0, a1, row, cols, x, lane);
}

// The dots of N rows in shared memory (cols % 64 leftovers from them too) with the staged
// activation xp (shared memory; x: the same values, for the leftovers), each in the
// reference's order; the N rows' chains run interleaved (independent, so the loads and FMAs of
// one row hide the latency of another's). Results valid in lane 0, the trees' sums in every lane.
template <GgmlType T, int N>
__device__ __forceinline__ void smem_rows_dot(const uint8_t* const (&rows)[N], int cols,
                                              const float2* xp, const float* x, int lane,
                                              float (&out)[N]) {
  const int n_it = cols / 64;
  float a0[N], a1[N];
#pragma unroll
  for (int j = 0; j < N; ++j) a0[j] = a1[j] = 0.0f;
#pragma unroll 4
  for (int i = 0; i < n_it; ++i) {
    const float2 xv = xp[32 * i + lane];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float w0, w1;
      if constexpr (T == GgmlType::F32) {
        const uint2 v = reinterpret_cast<const uint2*>(rows[j])[32 * i + lane];
        unpack_pair<T>(v, w0, w1);
      } else {
        const uint32_t v = reinterpret_cast<const uint32_t*>(rows[j])[32 * i + lane];
        unpack_pair<T>(v, w0, w1);
      }
      if constexpr (T == GgmlType::BF16) {
        a0[j] = xf::dpbf16_step(a0[j], w0, xv.x, w1, xv.y);
      } else {
        a0[j] = xf::fma_step(a0[j], w0, xv.x);
        a1[j] = xf::fma_step(a1[j], w1, xv.y);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = finish<T>(a0[j], a1[j], rows[j], cols, x, lane);
}

// One row (N = 1).
template <GgmlType T>
__device__ __forceinline__ float smem_row_dot(const uint8_t* row, int cols, const float2* xp,
                                              const float* x, int lane) {
  const uint8_t* const rows[1] = {row};
  float out[1];
  smem_rows_dot<T, 1>(rows, cols, xp, x, lane, out);
  return out[0];
}

}  // namespace worker::kern::exact::fr
