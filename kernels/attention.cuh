#pragma once
// Causal multi-head attention with GQA over the FP16 KV cache, for n_tok queries at
// positions n_past..n_past+n_tok-1 (n_past from device memory): query t sees cache
// positions 0..n_past+t. Prompt batches over the FP16 cache with head_dim 32, 64 or 128:
// flash attention on tensor cores (64 queries a block, FP16 Q and P, FP32 scores and sums).
// Otherwise (decode, the FP32 cache, other head sizes) FP32 throughout: one block per
// (head, query); each warp walks a strided subset of positions with an online softmax, and
// the warps are merged in a fixed order. Both are deterministic (D15).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace worker::kern {
// Few (token, head) pairs (decode) would leave most of the GPU idle and each warp walking
// hundreds of positions one dependent load at a time, so then the positions are split
// over 16 blocks per pair (flash-decoding) and a second kernel merges the 16 partial
// softmaxes in a fixed order. `partial` must hold attention_partial_floats() floats.
// q, out: [n_tok][n_head][head_dim] FP32; caches: [n_ctx][n_head_kv][head_dim].
size_t attention_partial_floats(int n_tok, int n_head, int head_dim);
// kv_f32: the caches hold FP32 instead of FP16 (exact::bias_rope_store writes either).
void attention(const float* q, const void* k_cache, const void* v_cache, bool kv_f32, float* out,
               int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t* d_n_past,
               float* partial, cudaStream_t stream);
}  // namespace worker::kern
