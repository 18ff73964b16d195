#pragma once
// Activation rounding: a matmul input rounded to its weight type's vec_dot_type
// (TypeTraits<T>::kAct) exactly as cpu::quantize_activation does, alone (quantize_act) or
// fused into the op that produces the input (rmsnorm_act, swiglu_act). act_round.cu.
// All pointers are device memory.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/type_traits.h"

namespace worker::kern::exact {

// A matmul input: n_tok activation rows of `cols` values rounded / quantized for one weight
// type exactly as cpu::quantize_activation does. Caller-owned device buffers sized for the
// largest n_tok * cols (act_buffer_bytes lays them out in one allocation).
struct ActBuf {
  // What the buffer holds: the rows at `src` rounded to `type` (src nullptr: nothing yet).
  // Every op that writes it says so through holds(); linear() and friends reuse it when it
  // already holds their input rounded for their weight.
  ActType type = ActType::F32;
  const float* src = nullptr;
  float* f = nullptr;  // [n_tok][cols] F32 / F16- / BF16-rounded values (float weights)
  // The tinyBLAS products of F32 / F16 weights read f's rows permuted (xf::tb_perm_pos):
  // [n_tok][cols rounded up to 64]. rmsnorm_act and swiglu_act write them with f (fp_of ==
  // f then); otherwise matmul_float permutes f into fp before its tinyBLAS launch.
  float* fp = nullptr;
  const float* fp_of = nullptr;
  int8_t* q = nullptr;  // [n_tok][cols] Q8_0 or Q8_K quants (quantized weights)
  float* d = nullptr;   // [n_tok][cols / 32] Q8_0 scales (fp16-rounded) or [n_tok][cols/256] Q8_K
  int32_t* bsum = nullptr;  // [n_tok][cols / 16] Q8_K sums of 16 quants
  // Scratch of qgemm's tensor-core Q0 tile (matmul.cuh: qgemm_scratch_bytes): a launch's
  // weights and activations converted to its f16 layout; nullptr / 0: the tile does not run.
  uint8_t* mma = nullptr;
  size_t mma_bytes = 0;
  // permuted: fp holds f's rows permuted too
  void holds(ActType t, const float* x, bool permuted = false) {
    type = t;
    src = x;
    fp_of = permuted ? f : nullptr;
  }
  bool holds_for(uint32_t weight_type, const float* x) const {
    return src == x && type == act_type_of(weight_type);
  }
  // Whether fp holds f's rows permuted.
  bool fp_holds_f() const { return fp_of != nullptr && fp_of == f; }
  // The roundings whose products read fp: F32 / F16 (tinyBLAS); BF16 and the quantized
  // ones have their own kernels.
  __host__ __device__ static constexpr bool permuted_rounding(ActType t) {
    return t == ActType::F32 || t == ActType::F16;
  }
};
// Bytes of one region holding an ActBuf for up to max_tok rows of up to max_cols values,
// with mma_bytes of tensor-core scratch (ActBuf::mma) after them.
size_t act_buffer_bytes(int max_tok, int max_cols, size_t mma_bytes = 0);
// Carves an ActBuf out of `base` (act_buffer_bytes(max_tok, max_cols, mma_bytes) bytes,
// 256-aligned).
ActBuf act_buffer_at(void* base, int max_tok, int max_cols, size_t mma_bytes = 0);

// a = x [n_tok][cols] rounded for `weight_type` (cpu::quantize_activation, row by row).
// Writes a's buffers only: callers that track what `a` holds call a.holds() (linear.cuh).
void quantize_act(uint32_t weight_type, const float* x, int n_tok, int cols, const ActBuf& a,
                  cudaStream_t stream);

// rmsnorm(x, w, y, ...) then quantize_act(act_type, y, n_rows, n, a), one launch; any
// n_rows. y and a both written, exactly what the unfused sequence writes, and for F32 / F16 the
// permuted rows a.fp (where a.fp is set); a.holds() says so.
void rmsnorm_act(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                 uint32_t act_type, ActBuf& a, cudaStream_t stream);
// swiglu(g, u, n_tok, F) then quantize_act(act_type, g, n_tok, F, a), one launch: g and a
// both written, as rmsnorm_act.
void swiglu_act(float* g, const float* u, int n_tok, int F, uint32_t act_type, ActBuf& a,
                cudaStream_t stream);

}  // namespace worker::kern::exact
