#pragma once
// Fused attention-input step for n_tok tokens at positions n_past..n_past+n_tok-1, n_past
// read from device memory (graph replay): adds the optional Q/K/V biases (qwen2), rotates
// the first n_rot dims of every Q and K head (RoPE; neox = rotate halves (qwen2), else
// adjacent pairs (llama)), and stores K and V into this layer's cache
// [n_ctx][n_head_kv][head_dim], FP16 (the product) or FP32 (kv_f32: the exactness mode the
// parity tests use next to the CPU reference's FP32 cache). Q is rotated in place.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace worker::kern {

struct VecView {
  const void* data = nullptr;  // nullptr: absent
  uint32_t type = 0;           // F32/F16/BF16
};

struct RopeParams {
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  float base = 10000.0f;
  // base^(-2/n_rot), computed on the host with std::pow exactly as the CPU reference (and
  // ggml) do; theta_i = pos * theta_scale^i by repeated float multiplication, so both
  // backends use bit-identical angles.
  float theta_scale = 1.0f;
  bool neox = false;
};

void qkv_rope_store(float* q, float* k, float* v, VecView bq, VecView bk, VecView bv,
                    const RopeParams& p, int n_tok, const int32_t* d_n_past, void* k_cache,
                    void* v_cache, bool kv_f32, cudaStream_t stream);
}  // namespace worker::kern
