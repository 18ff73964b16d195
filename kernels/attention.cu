#include <string>

#include "attention.cuh"
#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"

namespace worker::kern {
namespace {
constexpr int kWarps = 8;

// D = head_dim / 32 rounded up: lane l owns dims l, l+32, ... of the head.
template <int D>
__global__ void __launch_bounds__(kWarps * kWarp)
    attention_kernel(const float* __restrict__ q, const __half* __restrict__ kc,
                     const __half* __restrict__ vc, float* __restrict__ out, int n_head,
                     int n_head_kv, int hd, const int32_t* __restrict__ d_n_past) {
  __shared__ float sh_m[kWarps], sh_l[kWarps];
  __shared__ float sh_acc[kWarps][D * kWarp];
  const int h = blockIdx.x, t = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int kvh = h / (n_head / n_head_kv);
  const int n_kv = *d_n_past + t + 1;
  const int kv_stride = n_head_kv * hd;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));

  const float* qh = q + (static_cast<size_t>(t) * n_head + h) * hd;
  float qr[D], acc[D];
#pragma unroll
  for (int i = 0; i < D; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? qh[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int p = warp; p < n_kv; p += kWarps) {
    const __half* kp = kc + static_cast<size_t>(p) * kv_stride + kvh * hd;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) s += qr[i] * __half2float(kp[d]);
    }
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);
    const float e = expf(s - m_new);
    l = l * corr + e;
    const __half* vp = vc + static_cast<size_t>(p) * kv_stride + kvh * hd;
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < hd ? e * __half2float(vp[d]) : 0.0f);
    }
    m = m_new;
  }
  if (lane == 0) {
    sh_m[warp] = m;
    sh_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < D; ++i) sh_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  // Merge the warps in index order; warps that saw no position have m = -inf and weight 0.
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sh_m[w]);
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w) L += sh_m[w] == -INFINITY ? 0.0f : sh_l[w] * expf(sh_m[w] - M);
  float* oh = out + (static_cast<size_t>(t) * n_head + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (sh_m[w] != -INFINITY) o += sh_acc[w][d] * expf(sh_m[w] - M);
    }
    oh[d] = o / L;
  }
}
}  // namespace

void attention(const float* q, const __half* k_cache, const __half* v_cache, float* out,
               int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t* d_n_past,
               cudaStream_t stream) {
  if (n_head_kv <= 0 || n_head % n_head_kv != 0 || head_dim <= 0 || head_dim > 256) {
    throw WorkerError(ErrorCode::Internal,
                      "attention: unsupported shape n_head=" + std::to_string(n_head) +
                          " n_head_kv=" + std::to_string(n_head_kv) +
                          " head_dim=" + std::to_string(head_dim));
  }
  const dim3 grid(n_head, n_tok);
  const int threads = kWarps * kWarp;
  if (head_dim <= 32) {
    attention_kernel<1><<<grid, threads, 0, stream>>>(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, d_n_past);
  } else if (head_dim <= 64) {
    attention_kernel<2><<<grid, threads, 0, stream>>>(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, d_n_past);
  } else if (head_dim <= 128) {
    attention_kernel<4><<<grid, threads, 0, stream>>>(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, d_n_past);
  } else {
    attention_kernel<8><<<grid, threads, 0, stream>>>(q, k_cache, v_cache, out, n_head, n_head_kv, head_dim, d_n_past);
  }
  CUDA_CHECK_LAUNCH("attention_kernel");
}
}  // namespace worker::kern
