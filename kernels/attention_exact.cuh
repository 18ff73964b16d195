#pragma once
// Exact attention (attention_exact.cu): bias + RoPE + KV store + causal GQA attention + the
// output's rounding for the next matmul, bit for bit the CPU reference (CpuEngine::eval with
// cpu::attention_head over an FP32 cache, cpu::attention_head_f16 over an FP16 one: llama.cpp's
// CPU backend, no flash attention). One set of kernels templated over the cache element type;
// the per-element differences are in attention_exact_math.cuh (KvF32, KvF16).
//
// All pointers are device memory; n_past is read from device memory (d_n_past[0]) so the
// decode step can be a replayed CUDA graph. Caches: [n_ctx][n_head_kv * head_dim] elements.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "exact.cuh"  // ActBuf, quantize_act

namespace worker::kern::exact {

struct AttnShape {
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  bool neox = false;
};

enum class KvType : uint8_t { F32, F16 };

// One layer's K and V caches: F32 floats or F16 bits (uint16_t).
struct KvCache {
  void* k = nullptr;
  void* v = nullptr;
  KvType type = KvType::F16;
};

// This step's projections: q [n_tok][n_head * head_dim] (rotated in place), k and v
// [n_tok][n_head_kv * head_dim] (read), and their biases (nullptr: none).
struct QkvIn {
  float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
};

// Floats of `scratch` for up to max_tok tokens a call and n_keys <= n_ctx (either cache type).
size_t attention_scratch_floats(int n_ctx, int max_tok, int n_head);

// n_keys (below): a bound on the keys any row of the call attends to, n_past + n_tok <= n_keys
// <= the cache's rows. It lays out the scratch (a row's scores at a stride of ~n_keys, as many
// rows a launch as fit 64 MiB), so a prompt batch passes n_past + n_tok, and its launches do
// not shrink as the context grows; a call captured in a graph that replays at other positions
// (the decode step) passes the cache's rows.

// The attention block of one layer: for t < n_tok at position n_past + t, q/k/v + bias, RoPE
// on the first n_rot dims of every Q and K head, K and V stored to the cache rows, causal
// attention of the rotated q over the cache into out [n_tok][n_head * head_dim], then out
// rounded for `act_type` (a weight type, as quantize_act) into `a`. One launch at decode
// (n_tok == 1, head_dim <= 256, act_type rounding F32 / F16 / BF16); otherwise the pieces
// below, one after the other (the Q8_0 / Q8_K quantization always runs as quantize_act).
void attention(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
               const int32_t* d_n_past, const KvCache& kv, float* out, int n_keys, float* scratch,
               uint32_t act_type, const ActBuf& a, cudaStream_t stream);

// The pieces, T = float (FP32 cache) or uint16_t (FP16 cache):
// q/k/v + bias, RoPE (d0 = fma(x0, c, -(x1*s)), d1 = fma(x0, s, x1*c)), K and V stored.
template <class T>
void bias_rope_store(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
                     const int32_t* d_n_past, T* k_cache, T* v_cache, cudaStream_t stream);
// Causal attention over the cache in the CPU's order: scores (KvF32 / KvF16::kq_*) *
// (1/sqrtf(head_dim)), max, ggml_expf 16 at a time with each block's hsum16 added in double,
// probabilities * float(1/sum), then V^T * p in tinyBLAS or vec_dot order (math::kqv_tiny).
template <class T>
void attend(const float* q, const T* k_cache, const T* v_cache, float* out, int n_tok,
            const AttnShape& s, int n_keys, const int32_t* d_n_past, float* scratch,
            cudaStream_t stream);
// attend() then quantize_act(act_type, out, ..): one launch at decode, as attention().
template <class T>
void attend_act(const float* q, const T* k_cache, const T* v_cache, float* out, int n_tok,
                const AttnShape& s, int n_keys, const int32_t* d_n_past, float* scratch,
                uint32_t act_type, const ActBuf& a, cudaStream_t stream);

// Test hooks. Blocks per head of the decode kernel (1, 2, 4 or 8; 0 restores the choice from
// n_head) for every later decode launch, both cache types.
void set_decode_cluster_for_tests(int cluster);
// Keys up to which the decode kernel runs in local mode (0: never, i.e. always the cluster
// exchange; at most 768; -1 restores the default: 768 for an FP16 cache, 384 for FP32).
void set_decode_local_keys_for_tests(int keys);
// The floats of `scratch` that attend() / attend_act() lay out for a call of n_tok tokens
// with this keys bound (the layout's row stride x n_head x the tokens a launch group takes).
size_t attention_scratch_used_for_tests(int n_keys, int n_tok, int n_head);
// y[i] = fp16 bits of x[i] on the device (the cache store's rounding), i < n.
void device_f16_bits_for_tests(const float* x, uint16_t* y, size_t n);

}  // namespace worker::kern::exact
