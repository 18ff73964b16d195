#pragma once
// The per-thread float steps of the exact F32/F16/BF16 matmul (matmul_float.cu), as
// __host__ __device__ helpers: the GPU kernels call them, and exact_float_test.cpp calls the
// same functions in a host emulation of the kernels' thread decomposition, which is checked
// bit for bit against the CPU reference (worker/engine/cpu/act_quant.cpp) on any machine.
//
// Every float operation is explicitly rounded: mul_rn / add_rn never fuse into an FMA (on
// the device they are __fmul_rn / __fadd_rn, which the compiler never contracts; on the
// host the product passes through an empty asm so GCC cannot contract it either), and
// fmaf() is used exactly where the reference has std::fma.
#include <cuda_runtime.h>  // __host__ __device__ also for host-only compilers
#include <math.h>
#include <stdint.h>

#include "gguf/ggml_types.h"

namespace worker::kern::exact::xf {

__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float p = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#endif
  return p;
#endif
}

__host__ __device__ __forceinline__ float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// One step of an F32/F16 chain (ggml's GGML_F32_VEC_FMA lane, tinyBLAS's madd lane):
// acc = fma(weight, activation, acc).
__host__ __device__ __forceinline__ float fma_step(float acc, float w, float x) {
  return fmaf(w, x, acc);
}

// One lane of _mm512_dpbf16_ps on a pair of elements (2l, 2l+1): the odd product is added
// first, then the even one, each sum rounded (the products of two bf16 values are exact in
// float, so rounding them changes nothing).
__host__ __device__ __forceinline__ float dpbf16_step(float c, float w0, float x0, float w1,
                                                      float x1) {
  return add_rn(add_rn(c, mul_rn(w1, x1)), mul_rn(w0, x0));
}

// The reduction trees. Every tree of the reference is a butterfly over the bits of the
// lane index from the highest to the lowest:
//  - vec_dot F32/F16: 64 chains c = 16a + j; GGML_F32x16_REDUCE pairs c with c^32 (a with
//    a+2), then c^16, then hsum16 on j: t8[i] = v[i+8] + v[i] (bit 3), t4[i] = t8[i+4] +
//    t8[i] (bit 2), (t4[0] + t4[2]) (bit 1) + (t4[1] + t4[3]) (bit 0).
//  - tinyBLAS and the bf16 accumulators: hsum16 over 16 lanes, bits 3, 2, 1, 0.
// Float addition is commutative, so both partners of a pair compute the same sum whichever
// operand comes first; only the pairing matters.
//
// combine(): one butterfly level done across threads: v[k] += partner's v[k].
template <int N>
__host__ __device__ __forceinline__ void combine(float (&v)[N], const float (&o)[N]) {
  for (int k = 0; k < N; ++k) v[k] = add_rn(v[k], o[k]);
}

// The levels held inside one thread, for a thread owning 8 consecutive lanes (bits 2, 1, 0
// of the lane index): (t4[0] + t4[2]) + (t4[1] + t4[3]) with t4[k] = v[k + 4] + v[k].
__host__ __device__ __forceinline__ float local_tree8(const float (&v)[8]) {
  float t4[4];
  for (int k = 0; k < 4; ++k) t4[k] = add_rn(v[k + 4], v[k]);
  return add_rn(add_rn(t4[0], t4[2]), add_rn(t4[1], t4[3]));
}

// The same for 4 consecutive lanes (bits 1, 0).
__host__ __device__ __forceinline__ float local_tree4(const float (&v)[4]) {
  return add_rn(add_rn(v[0], v[2]), add_rn(v[1], v[3]));
}

// hsum16 of 16 values in one place (host emulation, and tests of the tree itself).
__host__ __device__ __forceinline__ float hsum16(const float (&v)[16]) {
  float t8[8];
  for (int k = 0; k < 8; ++k) t8[k] = add_rn(v[k + 8], v[k]);
  return local_tree8(t8);
}

// tinyblas_kernel's transposing hsum16, one level (lane bit B, pairs lane l and l ^ 2^B): lane l
// holds n values (the first n of v); it keeps the half its bit picks and adds the partner's
// values of it, sending the partner its own values of the other half: for pair i (i < n / 2)
// fold_pair gives the value lane l sends and the one it keeps, and v[i] = keep + received.
// Float addition is commutative, so both lanes of a pair compute the reference's pair sum;
// after the levels B = 3, 2, 1, 0 lane l holds outputs (N / 16) * l .. + N / 16 - 1, each the
// hsum16 over the 16 lanes (exact_float_test.cpp emulates the 16 lanes against the CPU's tree).
template <int n, int B, int N>
__host__ __device__ __forceinline__ void fold_pair(const float (&v)[N], int l, int i, float& send,
                                                   float& keep) {
  const bool hi = ((l >> B) & 1) != 0;
  send = hi ? v[i] : v[i + n / 2];
  keep = hi ? v[i + n / 2] : v[i];
}

// ---- leftovers of vec_dot (n % 64 elements from np = n & ~63), one thread ----
// w(i): weight element i of the row as float; x: the activation row.

// ggml_vec_dot_f32's leftover loop as GCC compiled it: 16- then 8-wide rounded products
// added to the float sum one by one in index order, the last < 8 as FMAs.
template <typename W>
__host__ __device__ __forceinline__ float tail_f32(float sum, const W& w, const float* x, int np,
                                                   int n) {
  int i = np;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) sum = add_rn(sum, mul_rn(w(i + l), x[i + l]));
  }
  if (n - i >= 8) {
    for (int l = 0; l < 8; ++l) sum = add_rn(sum, mul_rn(w(i + l), x[i + l]));
    i += 8;
  }
  for (; i < n; ++i) sum = fmaf(w(i), x[i], sum);
  return sum;
}

// ggml_vec_dot_f16 and ggml_vec_dot_bf16: each leftover float product added to a double.
template <typename W>
__host__ __device__ __forceinline__ double tail_double(double s, const W& w, const float* x, int np,
                                                       int n) {
  for (int i = np; i < n; ++i) s += static_cast<double>(mul_rn(w(i), x[i]));
  return s;
}

}  // namespace worker::kern::exact::xf

namespace worker::kern::exact::xf {

// tinyblas_kernel's interleaved weight stage (F32 / F16, 128-element chunks): in a row, the
// four elements 64q + 16s + l (s = 0 .. 3) of lane l = 8h + j are the 16-byte slot 18q + 9h + j,
// element s of it. ilv_read: the first float of lane l's slot of group q; ilv_pos: where element
// k of the chunk goes. The slots of (q, h) start 0, 9, 18, 27 = 0, 1, 2, 3 mod 8, so that the
// eight floats one conversion unit writes (one q, s, h, consecutive j) fall in banks that no
// other unit of the row uses (ExactFloatHost.InterleavedStageIsAConflictFreePermutation).
__host__ __device__ constexpr int ilv_read(int q, int l) {
  return 4 * (18 * q + 9 * (l >> 3) + (l & 7));
}
__host__ __device__ constexpr int ilv_pos(int k) {
  return ilv_read(k / 64, k % 16) + (k % 64) / 16;
}
constexpr int kIlvRowFloats = 4 * 35;  // slots 0 .. 34

// tinyblas_kernel's activations for F32 / F16 weights (ActBuf::fp): each row permuted in
// 64-element groups so that lane l's four steps 64q + 16s + l (s = 0 .. 3) are the 16-byte
// slot at 64q + 4l, element s; rows are tb_perm_cols(cols) long, the positions past cols
// holding -0 (the padding whose products leave every chain unchanged: matmul_float.cu).
__host__ __device__ constexpr int tb_perm_pos(int col) {
  return (col & ~63) + 4 * (col & 15) + ((col >> 4) & 3);
}
__host__ __device__ constexpr int tb_perm_cols(int cols) {
  return (cols + 63) & ~63;
}

// cpu::tinyblas_takes (worker/engine/cpu/act_quant.cpp), restated here because the kernels
// library does not link the CPU engine; exact_float_test.cpp checks that the two agree.
// llamafile_sgemm takes prompt batches (>= 2 tokens) of F32/F16 weights with k % 16 == 0
// and BF16 with k % 32 == 0, and rows % 4 == 0; otherwise mul_mat runs vec_dot.
__host__ __device__ constexpr bool tinyblas_takes(uint32_t type, int64_t rows, int64_t n_tokens,
                                                  int64_t cols) {
  if (n_tokens < 2 || rows % 4 != 0) return false;
  const auto t = static_cast<GgmlType>(type);
  if (t == GgmlType::F32 || t == GgmlType::F16) return cols % 16 == 0;
  if (t == GgmlType::BF16) return cols % 32 == 0;
  return false;
}

}  // namespace worker::kern::exact::xf
