// The CPU reference's non-matmul ops (cpu_ops.h), moved out of CpuEngine unchanged: same
// operations, same order, so the engine's floats (bit-identical with llama.cpp) are as before.
#include "engine/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>

#include "engine/cpu/act_quant.h"
#include "gguf/ggml_types.h"

namespace worker::cpu {

void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// The rotation as GCC compiled ggml's rotate_pairs (-ffp-contract=fast, FMA) in the loop
// llama.cpp runs: d0 = fma(x0, c, -(x1*s)), d1 = fma(x0, s, x1*c), for NEOX and normal RoPE
// alike. Plain x0*c - x1*s differs in the last bit; the vectorised loop's
// d1 = fma(x1, c, x0*s) was measured not to be the one taken (reports/cpu-parity.md).
void rope_rotate(float* v, int64_t n_heads, int64_t head_dim, int64_t n_rot, bool neox,
                 const float* c, const float* s) {
  for (int64_t h = 0; h < n_heads; ++h) {
    float* x = v + h * head_dim;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const int64_t i0 = neox ? i : 2 * i;
      const int64_t i1 = neox ? i + n_rot / 2 : 2 * i + 1;
      const float x0 = x[i0], x1 = x[i1];
      x[i0] = std::fma(x0, c[i], -(x1 * s[i]));
      x[i1] = std::fma(x0, s[i], x1 * c[i]);
    }
  }
}

void rope_row(float* v, int64_t n_heads, int64_t head_dim, int64_t n_rot, bool neox,
              float theta_scale, int32_t pos) {
  float c[1024], s[1024];
  rope_cos_sin(pos, n_rot, theta_scale, c, s);
  rope_rotate(v, n_heads, head_dim, n_rot, neox, c, s);
}

namespace {
// ggml's scores and softmax, shared by both cache types: sc[j] = score(j) * kq_scale for j <
// n_att, ggml_expf 16 at a time with each block's hsum16 added in double, probabilities *
// float(1 / sum), zeros from n_att up to cap.
template <class Score>
void softmax_scores(const Score& score, int64_t n_att, int64_t cap, float kq_scale, float* sc) {
  const int64_t n16 = (n_att + 15) & ~int64_t{15};
  float mx = -INFINITY;
  for (int64_t j = 0; j < n_att; ++j) {
    sc[j] = score(j) * kq_scale;
    mx = std::max(mx, sc[j]);
  }
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < n16; j0 += 16) {
    for (int64_t j = j0; j < j0 + 16; ++j) {
      sc[j] = j < n_att ? ggml_expf(sc[j] - mx) : 0.0f;
    }
    sum += static_cast<double>(hsum16(sc + j0));
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n16; ++j) sc[j] *= inv;
  std::fill(sc + n16, sc + cap, 0.0f);
}

// KQV for one head: out[d] = V column d (gathered into col, zeros from n_att up to cap) . sc, as
// tinyBLAS over n16 (llama.cpp's KV window is a multiple of 256 cells, so tinyBLAS takes every
// batch of >= 2 tokens, m = head_dim permitting) or ggml_vec_dot over cap (f16: the F16 cache's
// ggml_vec_dot_f16).
void kqv_columns(const float* v, int64_t kv_dim, int64_t hd, int64_t n_att, int64_t cap,
                 bool kqv_tiny, bool f16, const float* sc, float* col, float* out) {
  const int64_t n16 = (n_att + 15) & ~int64_t{15};
  std::fill(col + n_att, col + cap, 0.0f);
  for (int64_t d = 0; d < hd; ++d) {
    for (int64_t j = 0; j < n_att; ++j) col[j] = v[j * kv_dim + d];
    out[d] = kqv_tiny ? dot_tinyblas(col, sc, n16) : dot_vecdot(col, sc, cap, f16);
  }
}

float round_f16(float x) {
  return fp16_to_fp32(fp32_to_fp16(x));
}
}  // namespace

void attention_head(const float* qh, const float* k, const float* v, int64_t kv_dim,
                    int64_t head_dim, int64_t n_att, int64_t cap, bool kqv_tiny, float kq_scale,
                    float* sc, float* col, float* out) {
  softmax_scores([&](int64_t j) { return dot_vecdot(k + j * kv_dim, qh, head_dim); }, n_att, cap,
                 kq_scale, sc);
  kqv_columns(v, kv_dim, head_dim, n_att, cap, kqv_tiny, false, sc, col, out);
}

void attention_head_f16(const float* qh, const float* k, const float* v, int64_t kv_dim,
                        int64_t head_dim, int64_t n_att, int64_t cap, bool kq_tiny, bool kqv_tiny,
                        float kq_scale, float* q16, float* sc, float* col, float* out) {
  const int64_t hd = head_dim;
  const int64_t n16 = (n_att + 15) & ~int64_t{15};
  for (int64_t d = 0; d < hd; ++d) q16[d] = round_f16(qh[d]);
  softmax_scores(
      [&](int64_t j) {
        return kq_tiny ? dot_tinyblas(k + j * kv_dim, q16, hd)
                       : dot_vecdot(k + j * kv_dim, q16, hd, true);
      },
      n_att, cap, kq_scale, sc);
  for (int64_t j = 0; j < n16; ++j) sc[j] = round_f16(sc[j]);
  kqv_columns(v, kv_dim, hd, n_att, cap, kqv_tiny, true, sc, col, out);
}

void swiglu_row(float* g, const float* u, int64_t F) {
  const int64_t f16 = F & ~int64_t{15};
  for (int64_t i = 0; i < f16; ++i) g[i] = ggml_silu(g[i]) * u[i];
  for (int64_t i = f16; i < F; ++i) g[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
}

}  // namespace worker::cpu
