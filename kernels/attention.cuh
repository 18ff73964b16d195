#pragma once
// Causal multi-head attention with GQA over the FP16 KV cache, for n_tok queries at
// positions n_past..n_past+n_tok-1 (n_past from device memory): query t sees cache
// positions 0..n_past+t. One block per (head, query); each warp walks a strided subset of
// positions with an online softmax, and the warps are merged in a fixed order, so the
// result does not depend on scheduling (D15). Decode (n_tok = 1) and prefill share it.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace worker::kern {
// q, out: [n_tok][n_head][head_dim] FP32; caches: [n_ctx][n_head_kv][head_dim] FP16.
void attention(const float* q, const __half* k_cache, const __half* v_cache, float* out,
               int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t* d_n_past,
               cudaStream_t stream);
}
