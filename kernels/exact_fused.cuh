#pragma once
// Decode-step fusions of the exact attention with the rounding of its output for Wo (the
// norm and SwiGLU ones are in act_round.cuh). Each writes exactly what the unfused sequence
// writes.
#include <cuda_runtime.h>
#include <stdint.h>

#include "exact.cuh"

namespace worker::kern::exact {

// attention(...) then quantize_act(act_type, out, n_tok, n_head * head_dim, a): out and a
// both written. One launch at decode (n_tok == 1, head_dim <= 256) for F32 / F16 / BF16
// activations, and for Q8_0 ones (Q8_0 / Q4_0 / Q5_0 weights) when head_dim % 32 == 0;
// otherwise the two unfused calls (exact_ops.cu).
void attention_act(const float* q, const float* k_cache, const float* v_cache, float* out,
                   int n_tok, const AttnShape& s, int n_ctx, const int32_t* d_n_past,
                   float* scratch, uint32_t act_type, const ActBuf& a, cudaStream_t stream);

// bias_rope_store(q, k, v, bq, bk, bv, s, rope_table, n_tok, d_n_past, k_cache, v_cache)
// then attention_act(q, k_cache, v_cache, out, n_tok, s, n_ctx, d_n_past, scratch, act_type,
// a): q (rotated in place), the cache rows at n_past, out and a all written. One launch at
// decode under attention_act's conditions (the decode kernel rotates q and this token's K
// row itself and uses its own copies of the new K / V rows; one block per KV group stores
// them); otherwise the unfused calls.
void rope_attention_act(float* q, const float* k, const float* v, const float* bq, const float* bk,
                        const float* bv, const AttnShape& s, const float* rope_table, int n_tok,
                        const int32_t* d_n_past, float* k_cache, float* v_cache, float* out,
                        int n_ctx, float* scratch, uint32_t act_type, const ActBuf& a,
                        cudaStream_t stream);

// bias_rope_store_f16 + attention_f16 + quantize_act(act_type, out, n_tok, n_head * head_dim, a)
// over the FP16 KV cache (h9, exact_attn16_fused.cu): q (rotated in place), the fp16 cache rows
// at n_past, out and a all written, bit for bit the unfused sequence. One launch at decode
// (n_tok == 1, head_dim <= 256) for F32 / F16 / BF16 activations, and Q8_0 ones (Q8_0 / Q4_0 /
// Q5_0 weights) when head_dim % 32 == 0; otherwise the three unfused calls. `scratch` holds
// attention_f16_scratch_floats(n_ctx, n_tok, n_head) floats.
void rope_attention_act_f16(float* q, const float* k, const float* v, const float* bq,
                            const float* bk, const float* bv, const AttnShape& s,
                            const float* rope_table, int n_tok, const int32_t* d_n_past,
                            uint16_t* k_cache, uint16_t* v_cache, float* out, int n_ctx,
                            float* scratch, uint32_t act_type, const ActBuf& a,
                            cudaStream_t stream);

namespace attn16 {
// Test hook (exact_attn16_fused.cu): blocks per head of rope_attention_act_f16's decode kernel
// (1, 2, 4 or 8; 0 restores the choice from n_head).
void set_fused_cluster_for_tests(int cluster);
}  // namespace attn16

}  // namespace worker::kern::exact
