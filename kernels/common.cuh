#pragma once
// Device helpers shared by the kernels: warp/block reductions in a fixed order (D15: no
// atomics, so the same inputs give the same bits every run) and in-register
// dequantization of 32 consecutive weights, laid out exactly as ggml stores them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "gguf/type_traits.h"

namespace worker::kern {

constexpr int kWarp = 32;

// Programmatic dependent launch (see launch.cuh). griddep_wait() blocks until the previous
// kernel has completed and its writes are visible, and then lets the next kernel launch
// (griddepcontrol.launch_dependents); both are no-ops in a kernel launched without the PDL
// attribute. Every kernel calls it before touching data an earlier kernel wrote.
//
// Why the trigger comes after the wait: the wait only makes the *previous* grid's writes
// visible. A trigger at kernel entry let the next-but-one kernel launch while the previous
// one was still running, and that kernel could then read what the previous one wrote
// before it was visible to it: on an H100 the F32-weight models gave wrong, run-to-run
// different tokens (cuda_engine_tests). Triggering after the wait means a kernel is
// launched only after its predecessor's predecessor has completed; its pre-wait part
// (weight loads) overlaps the predecessor's work.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 16 bytes global -> shared through L2 (cp.async.cg), asynchronous until a cp.async wait;
// src_bytes < 16 copies that many and fills the rest with zeros (0: reads nothing).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
// cp_async16 to a shared-state-space address (__cvta_generic_to_shared of the target), all 16
// bytes copied.
__device__ __forceinline__ void cp_async16_sa(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem) : "memory");
}
// 8 bytes global -> shared (cp.async.ca: sizes below 16 go through L1), zero-filled when
// src_bytes is 0.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes = 8) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
// 4 bytes global -> shared (cp.async.ca), zero-filled when src_bytes is 0.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes = 4) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
// Closes the thread's current group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of the thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// Commits the current group and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

// f(i, ld(i)) for i = tid, tid + NT, ... < n in that order (NT threads a block), 8 loads a
// thread at a time, all issued before the first is used: a loop of load-then-store waits one
// memory round trip an element.
template <int NT, class Ld, class F>
__device__ __forceinline__ void for_each_batched(int n, Ld&& ld, F&& f) {
  constexpr int kBatch = 8;
  const int tid = static_cast<int>(threadIdx.x);
  for (int i0 = 0; i0 < n; i0 += kBatch * NT) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * NT + tid;
      v[u] = i < n ? ld(i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * NT + tid;
      if (i < n) f(i, v[u]);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide max; every thread gets the result. `sh` holds >= 32 floats.
__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int nw = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(r);
}

__device__ __forceinline__ float ld_half(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}
__device__ __forceinline__ float ld_bf16(const uint8_t* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}

// A float-typed vector element (norm weights, biases): F32, F16 or BF16.
__device__ __forceinline__ float load_float_elem(const void* p, uint32_t type, int64_t i) {
  if (type == static_cast<uint32_t>(GgmlType::F16))
    return __half2float(static_cast<const __half*>(p)[i]);
  if (type == static_cast<uint32_t>(GgmlType::BF16))
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// ---- activation rounding (what llama.cpp's CPU backend and the CPU reference do) ----
// Before a dot product the activation row is converted to the weight type's
// vec_dot_type (TypeTraits<T>::kAct, gguf/type_traits.h). The kernels round in registers
// and then multiply the exact dequantized values, so they see the same numbers as the CPU
// reference (worker/engine/cpu/act_quant.cpp).
__device__ __forceinline__ float round_f16(float x) {
  return __half2float(__float2half_rn(x));
}
__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// Q8_0 of one block of 32 held by one thread: d = amax/127 (stored as fp16),
// q = rint(x * 127/amax) (half to even, as the x86 build).
__device__ __forceinline__ void round_q8_0_32(float* v) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const float d = round_f16(amax / 127.f);
  const float id = amax != 0.0f ? 127.f / amax : 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = d * rintf(v[i] * id);
}

// Q8_K of a block of 256 held as 32 values by each of 8 consecutive lanes (lane & ~7 is
// the group): the value of largest magnitude (first in index order on ties) sets
// iscale = -127/max; q = min(127, rint(iscale*x)); x = q / iscale. Every lane of the warp
// must call it (shuffles).
// The value of largest magnitude over the N values of each of G consecutive lanes (first
// in index order on ties: a lower lane holds lower indices), as |max| and signed value.
// Every lane of the warp must call it (shuffles).
template <int G, int N>
__device__ __forceinline__ void group_absmax(const float* v, float& amax, float& mx) {
  amax = 0.0f;
  mx = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float a = fabsf(v[i]);
    if (a > amax) {
      amax = a;
      mx = v[i];
    }
  }
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int o = 1; o < G; o <<= 1) {
    const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
    const float om = __shfl_xor_sync(0xffffffffu, mx, o);
    // the partner covers lower indices when its lane is lower: it wins ties
    if (oa > amax || (oa == amax && (lane ^ o) < lane)) {
      amax = oa;
      mx = om;
    }
  }
}

__device__ __forceinline__ void round_q8_k_32x8(float* v) {
  float amax, mx;
  group_absmax<8, 32>(v, amax, mx);
  if (amax == 0.0f) {
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = 0.0f;
    return;
  }
  const float iscale = -127.f / mx;
  const float d = 1.0f / iscale;
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = d * fminf(127.0f, rintf(iscale * v[i]));
}

// Dequantizes the 32 weights [32*sb, 32*sb + 32) of a row into v. For the float types
// the "sub-block" is just 32 consecutive elements.
template <GgmlType T>
__device__ __forceinline__ void deq32(const uint8_t* row, int sb, float* v);

template <>
__device__ __forceinline__ void deq32<GgmlType::F32>(const uint8_t* row, int sb, float* v) {
  const float4* p = reinterpret_cast<const float4*>(row) + sb * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 f = p[i];
    v[4 * i] = f.x;
    v[4 * i + 1] = f.y;
    v[4 * i + 2] = f.z;
    v[4 * i + 3] = f.w;
  }
}

template <>
__device__ __forceinline__ void deq32<GgmlType::F16>(const uint8_t* row, int sb, float* v) {
  const __half2* p = reinterpret_cast<const __half2*>(row) + sb * 16;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float2 f = __half22float2(p[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

template <>
__device__ __forceinline__ void deq32<GgmlType::BF16>(const uint8_t* row, int sb, float* v) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(row) + sb * 16;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float2 f = __bfloat1622float2(p[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// Quantized blocks are only 2-byte aligned in general (18, 22, 34 and 210 bytes), so
// byte-wise loads were the safe choice, but they made the quantized matvecs issue-bound
// (32-64 load instructions per lane per 32 weights). load_words() reads 4*NW bytes from
// a 2-byte aligned address as little-endian 32-bit words with the widest loads the
// address allows: 16-byte, 4-byte, or pairs of 2-byte loads.
template <int NW>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[NW]) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if constexpr (NW % 4 == 0) {
    if ((a & 15) == 0) {
      const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
      for (int i = 0; i < NW / 4; ++i) {
        const uint4 u = q[i];
        w[4 * i] = u.x;
        w[4 * i + 1] = u.y;
        w[4 * i + 2] = u.z;
        w[4 * i + 3] = u.w;
      }
      return;
    }
  }
  if ((a & 3) == 0) {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = q[i];
  } else {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int i = 0; i < NW; ++i)
      w[i] = static_cast<uint32_t>(q[2 * i]) | (static_cast<uint32_t>(q[2 * i + 1]) << 16);
  }
}
// Byte j of the words (j known at compile time after unrolling).
template <int NW>
__device__ __forceinline__ uint32_t byte_of(const uint32_t (&w)[NW], int j) {
  return (w[j >> 2] >> (8 * (j & 3))) & 0xFFu;
}

// block_q8_0 {f16 d; int8 qs[32]}: x = d * q
template <>
__device__ __forceinline__ void deq32<GgmlType::Q8_0>(const uint8_t* row, int sb, float* v) {
  const uint8_t* b = row + sb * 34;
  const float d = ld_half(b);
  uint32_t w[8];
  load_words(b + 2, w);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    v[i] = d * static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(byte_of(w, i))));
  }
}

// block_q4_0 {f16 d; u8 qs[16]}: low nibbles are elements 0..15, high nibbles 16..31.
template <>
__device__ __forceinline__ void deq32<GgmlType::Q4_0>(const uint8_t* row, int sb, float* v) {
  const uint8_t* b = row + sb * 18;
  const float d = ld_half(b);
  uint32_t w[4];
  load_words(b + 2, w);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int q = static_cast<int>(byte_of(w, j));
    v[j] = static_cast<float>((q & 0x0F) - 8) * d;
    v[j + 16] = static_cast<float>((q >> 4) - 8) * d;
  }
}

// block_q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: the 5th bit of element j is bit j of qh.
template <>
__device__ __forceinline__ void deq32<GgmlType::Q5_0>(const uint8_t* row, int sb, float* v) {
  const uint8_t* b = row + sb * 22;
  const float d = ld_half(b);
  uint32_t w[5];  // qh (4 bytes) then qs (16 bytes)
  load_words(b + 2, w);
  const uint32_t qh = w[0];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int q = static_cast<int>(byte_of(w, 4 + j));
    const int xh0 = ((qh >> j) << 4) & 0x10;
    const int xh1 = (qh >> (j + 12)) & 0x10;
    v[j] = static_cast<float>(((q & 0x0F) | xh0) - 16) * d;
    v[j + 16] = static_cast<float>(((q >> 4) | xh1) - 16) * d;
  }
}

// block_q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}, 256 weights in 8 sub-blocks
// of 32 with 6-bit scales and mins (ggml's get_scale_min_k4).
// Super-block scale d, min dmin and sub-block s's 6-bit scale and min of a block_q4_K.
struct Q4KSub {
  float d, dmin;
  int scale, mn;
};
__device__ __forceinline__ Q4KSub q4k_sub(const uint8_t* b, int s) {
  uint32_t hw[4];  // d, dmin, scales[12]
  load_words(b, hw);
  Q4KSub r;
  r.d = __half2float(__ushort_as_half(static_cast<unsigned short>(hw[0] & 0xFFFFu)));
  r.dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(hw[0] >> 16)));
  // scales[i] for a run-time i: pick the word with selects (a run-time index into hw
  // would put it in local memory)
  auto sc = [&](int i) {
    const uint32_t word = i < 4 ? hw[1] : (i < 8 ? hw[2] : hw[3]);
    return static_cast<int>((word >> (8 * (i & 3))) & 0xFFu);
  };
  if (s < 4) {
    r.scale = sc(s) & 63;
    r.mn = sc(s + 4) & 63;
  } else {
    r.scale = (sc(s + 4) & 0xF) | ((sc(s - 4) >> 6) << 4);
    r.mn = (sc(s + 4) >> 4) | ((sc(s) >> 6) << 4);
  }
  return r;
}

template <>
__device__ __forceinline__ void deq32<GgmlType::Q4_K>(const uint8_t* row, int sb, float* v) {
  const uint8_t* b = row + (sb >> 3) * 144;
  const int s = sb & 7;
  const Q4KSub sub = q4k_sub(b, s);
  const float d1 = sub.d * static_cast<float>(sub.scale),
              m1 = sub.dmin * static_cast<float>(sub.mn);
  uint32_t w[8];
  load_words(b + 16 + 32 * (s >> 1), w);
  const int shift = (s & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) v[l] = d1 * static_cast<float>((byte_of(w, l) >> shift) & 0xF) - m1;
}

// block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: two halves of 128 weights,
// each four runs of 32 built from nibbles of ql and 2-bit pairs of qh.
template <>
__device__ __forceinline__ void deq32<GgmlType::Q6_K>(const uint8_t* row, int sb, float* v) {
  const uint8_t* b = row + (sb >> 3) * 210;
  const int s = sb & 7, h = s >> 2, k = s & 3;
  uint32_t ql[8], qh[8];
  load_words(b + 64 * h + 32 * (k & 1), ql);
  load_words(b + 128 + 32 * h, qh);
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * k;
  const float d = ld_half(b + 208);
  const int nshift = (k >> 1) * 4, hshift = 2 * k;
  const float d0 = d * static_cast<float>(sc[0]), d1 = d * static_cast<float>(sc[1]);
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int q = static_cast<int>(((byte_of(ql, l) >> nshift) & 0xF) |
                                   (((byte_of(qh, l) >> hshift) & 3) << 4)) -
                  32;
    v[l] = (l < 16 ? d0 : d1) * static_cast<float>(q);
  }
}

}  // namespace worker::kern
