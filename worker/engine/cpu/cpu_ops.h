#pragma once
// The CPU reference's non-matmul ops as free functions (CpuEngine calls them; the exact CUDA
// kernels are tested against them bit for bit). Each computes the floats llama.cpp's CPU
// backend computes, in its order (see cpu_engine.cpp and act_quant.h).
#include <cmath>
#include <cstdint>

#include "common/rope.h"

namespace worker::cpu {

using worker::rope_cos_sin;  // common/rope.h: the angles, shared with the CUDA backend
using worker::rope_theta_scale;

// ggml_rms_norm (sum of float squares in double) followed by the weight multiply, one row of
// n values: mean = float(sum / n), scale = 1 / sqrtf(mean + eps), y = (x * scale) * w.
void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps);

// Rotates the first n_rot dims of each of n_heads heads (head_dim apart) of v by the angles
// c/s (rope_cos_sin): NEOX pairs (i, i + n_rot/2), normal (2i, 2i+1);
// d0 = fma(x0, c, -(x1*s)), d1 = fma(x0, s, x1*c).
void rope_rotate(float* v, int64_t n_heads, int64_t head_dim, int64_t n_rot, bool neox,
                 const float* c, const float* s);

// rope_cos_sin for `pos` then rope_rotate (n_rot <= 2048).
void rope_row(float* v, int64_t n_heads, int64_t head_dim, int64_t n_rot, bool neox,
              float theta_scale, int32_t pos);

// Causal attention of one (token, head) pair over an F32 cache laid out [pos][kv_dim]:
// qh = the head's head_dim query values; k / v point at the cache's first position, already
// offset to the head's KV group (g * head_dim); n_att keys (positions 0..n_att-1).
// Scores by dot_vecdot * kq_scale, max, ggml_expf 16 at a time (zero beyond n_att) with each
// block's hsum16 added in double, probabilities * float(1 / sum), then out[d] = V^T p by
// dot_tinyblas over the 16-padded keys (kqv_tiny) or dot_vecdot over `cap` keys (zeros
// beyond). sc and col are scratch of cap floats, cap >= n_att rounded up to 16.
void attention_head(const float* qh, const float* k, const float* v, int64_t kv_dim,
                    int64_t head_dim, int64_t n_att, int64_t cap, bool kqv_tiny, float kq_scale,
                    float* sc, float* col, float* out);

// The same over an FP16 KV cache (llama.cpp's default cache type, no flash attention): k and v
// hold the cache's fp16 values as floats (each an exact fp32_to_fp16 rounding, as ggml's
// set_rows stores F32 into F16). llama.cpp's mul_mat converts its F32 operand to the F16
// weight's vec_dot_type first, so the query is rounded to fp16 (q16: head_dim floats of
// scratch) and so are the probabilities. KQ: dot_tinyblas(k row, q16) when kq_tiny (a batch of
// >= 2 tokens, head_dim % 16 == 0: llamafile's second attempt, F16 x F16, KV window m % 4 == 0),
// else dot_vecdot(.., f16 = true) (ggml_vec_dot_f16). Softmax as attention_head. KQV: V^T *
// fp16(p) by dot_tinyblas over the 16-padded keys (kqv_tiny) or dot_vecdot(.., f16 = true) over
// `cap` keys (a multiple of 64; zeros beyond n_att add nothing, as the 256-cell window's do).
void attention_head_f16(const float* qh, const float* k, const float* v, int64_t kv_dim,
                        int64_t head_dim, int64_t n_att, int64_t cap, bool kq_tiny, bool kqv_tiny,
                        float kq_scale, float* q16, float* sc, float* col, float* out);

// Whether llama.cpp's KQ (F16 cache x F32 query) and KQV (F16 cache x F32 probabilities)
// mul_mats take tinyBLAS for a batch of n_tok tokens: n_tok >= 2 and k % 16 == 0, m % 4 == 0,
// with KQ: m = the KV window (a multiple of 256), k = head_dim; KQV: m = head_dim, k = window.
inline bool kq16_tiny(int64_t head_dim, int64_t n_tok) {
  return n_tok >= 2 && head_dim % 16 == 0;
}
inline bool kqv16_tiny(int64_t head_dim, int64_t n_tok) {
  return n_tok >= 2 && head_dim % 4 == 0;
}

// ggml_vec_swiglu_f32 for one row of F: g[i] = silu(g[i]) * u[i], ggml_silu (ggml_expf) for
// i < F & ~15, g / (1 + expf(-g)) with libm's expf for the rest.
void swiglu_row(float* g, const float* u, int64_t F);

}  // namespace worker::cpu
