#pragma once
// RoPE's angles, shared by the CPU reference (cpu_ops.cpp) and the CUDA backend's host-built
// table (rope_table), so that both run the very same host code: theta_0 = pos,
// theta_{i+1} = theta_i * theta_scale in float (ggml_rope_cache_init), cos and sin by the
// host's libm.
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace worker {

// theta_scale = base^(-2 / n_rot), as ggml computes it.
inline float rope_theta_scale(float base, int64_t n_rot) {
  return std::pow(base, -2.0f / static_cast<float>(n_rot));
}

// cos/sin of the n_rot / 2 angles of position `pos`.
inline void rope_cos_sin(int32_t pos, int64_t n_rot, float theta_scale, float* c, float* s) {
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    c[i] = std::cos(theta);
    s[i] = std::sin(theta);
    theta *= theta_scale;
  }
}

// The table the exact attention kernels index by position: [n_ctx][n_rot / 2] pairs
// {cos, sin} (2 * n_ctx * (n_rot / 2) floats), rope_cos_sin's values.
inline void rope_table(int n_ctx, int n_rot, float theta_scale, float* out) {
  const int half = n_rot / 2;
  float c[1024], s[1024];  // n_rot <= 2048
  for (int pos = 0; pos < n_ctx; ++pos) {
    rope_cos_sin(pos, n_rot, theta_scale, c, s);
    float* o = out + 2 * static_cast<size_t>(pos) * static_cast<size_t>(half);
    for (int i = 0; i < half; ++i) {
      o[2 * i] = c[i];
      o[2 * i + 1] = s[i];
    }
  }
}

}  // namespace worker
