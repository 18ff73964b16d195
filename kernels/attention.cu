#include <algorithm>
#include <string>

#include "attention.cuh"
#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "launch.cuh"

namespace worker::kern {
namespace {
constexpr int kWarps = 8;
constexpr int kMaxSplits = 16;  // decode: 16 blocks x 8 warps share one head's positions

// D = head_dim / 32 rounded up: lane l owns dims l, l+32, ... of the head.
// Split s (blockIdx.z) of n_split walks positions p = (s*kWarps + w) + k*kWarps*n_split.
// With n_split == 1 the block writes the output; otherwise it writes its partial
// (max, sum, unnormalized accumulator) and attention_combine merges the splits in order.
__device__ __forceinline__ float kv_load(const __half* p) {
  return __half2float(*p);
}
__device__ __forceinline__ float kv_load(const float* p) {
  return *p;
}

template <int D, typename KV>
__global__ void __launch_bounds__(kWarps* kWarp)
    attention_kernel(const float* __restrict__ q, const KV* __restrict__ kc,
                     const KV* __restrict__ vc, float* __restrict__ out, int n_head, int n_head_kv,
                     int hd, const int32_t* __restrict__ d_n_past, float* __restrict__ partial) {
  griddep_wait();
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
  const int n_split = gridDim.z, split = blockIdx.z;
  for (int p = split * kWarps + warp; p < n_kv; p += kWarps * n_split) {
    const KV* kp = kc + static_cast<size_t>(p) * kv_stride + kvh * hd;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) s += qr[i] * kv_load(kp + d);
    }
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);
    const float e = expf(s - m_new);
    l = l * corr + e;
    const KV* vp = vc + static_cast<size_t>(p) * kv_stride + kvh * hd;
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < hd ? e * kv_load(vp + d) : 0.0f);
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
  if (n_split == 1) {
    float* oh = out + (static_cast<size_t>(t) * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        if (sh_m[w] != -INFINITY) o += sh_acc[w][d] * expf(sh_m[w] - M);
      }
      oh[d] = o / L;
    }
    return;
  }
  // partial layout: [t][h][split][2 + hd] = (M, L, acc[hd])
  float* ph = partial + ((static_cast<size_t>(t) * n_head + h) * n_split + split) * (2 + hd);
  if (threadIdx.x == 0) {
    ph[0] = M;
    ph[1] = L;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (sh_m[w] != -INFINITY) o += sh_acc[w][d] * expf(sh_m[w] - M);
    }
    ph[2 + d] = o;
  }
}

__global__ void attention_combine_kernel(const float* __restrict__ partial, float* __restrict__ out,
                                         int n_head, int hd, int n_split) {
  griddep_wait();
  const int h = blockIdx.x, t = blockIdx.y;
  const float* ph = partial + (static_cast<size_t>(t) * n_head + h) * n_split * (2 + hd);
  float M = -INFINITY;
  for (int s = 0; s < n_split; ++s) M = fmaxf(M, ph[s * (2 + hd)]);
  float L = 0.0f;
  for (int s = 0; s < n_split; ++s) {
    const float m = ph[s * (2 + hd)];
    if (m != -INFINITY) L += ph[s * (2 + hd) + 1] * expf(m - M);
  }
  float* oh = out + (static_cast<size_t>(t) * n_head + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < n_split; ++s) {
      const float m = ph[s * (2 + hd)];
      if (m != -INFINITY) o += ph[s * (2 + hd) + 2 + d] * expf(m - M);
    }
    oh[d] = o / L;
  }
}
}  // namespace

static int attention_splits(int n_tok, int n_head) {
  return n_tok * n_head < 256 ? kMaxSplits : 1;
}

size_t attention_partial_floats(int n_tok, int n_head, int head_dim) {
  return attention_splits(n_tok, n_head) == 1
             ? 0
             : static_cast<size_t>(n_tok) * n_head * kMaxSplits * (2 + head_dim);
}

template <int D, typename KV>
void launch_attention(dim3 grid, const float* q, const void* k, const void* v, float* out,
                      int n_head, int n_head_kv, int hd, const int32_t* d_n_past, float* partial,
                      cudaStream_t stream) {
  launch_pdl("attention_kernel", attention_kernel<D, KV>, dim3(grid), dim3(kWarps * kWarp), stream,
             q, static_cast<const KV*>(k), static_cast<const KV*>(v), out, n_head, n_head_kv, hd,
             d_n_past, partial);
}

template <int D>
void launch_attention(bool kv_f32, dim3 grid, const float* q, const void* k, const void* v,
                      float* out, int n_head, int n_head_kv, int hd, const int32_t* d_n_past,
                      float* partial, cudaStream_t stream) {
  if (kv_f32) {
    launch_attention<D, float>(grid, q, k, v, out, n_head, n_head_kv, hd, d_n_past, partial,
                               stream);
  } else {
    launch_attention<D, __half>(grid, q, k, v, out, n_head, n_head_kv, hd, d_n_past, partial,
                                stream);
  }
}

void attention(const float* q, const void* k_cache, const void* v_cache, bool kv_f32, float* out,
               int n_tok, int n_head, int n_head_kv, int head_dim, const int32_t* d_n_past,
               float* partial, cudaStream_t stream) {
  if (n_head_kv <= 0 || n_head % n_head_kv != 0 || head_dim <= 0 || head_dim > 256) {
    throw WorkerError(ErrorCode::Internal,
                      "attention: unsupported shape n_head=" + std::to_string(n_head) +
                          " n_head_kv=" + std::to_string(n_head_kv) +
                          " head_dim=" + std::to_string(head_dim));
  }
  const int splits = attention_splits(n_tok, n_head);
  if (splits > 1 && partial == nullptr) {
    throw WorkerError(ErrorCode::Internal, "attention: split-KV needs a partial buffer");
  }
  const dim3 grid(n_head, n_tok, splits);
  if (head_dim <= 32) {
    launch_attention<1>(kv_f32, grid, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim,
                        d_n_past, partial, stream);
  } else if (head_dim <= 64) {
    launch_attention<2>(kv_f32, grid, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim,
                        d_n_past, partial, stream);
  } else if (head_dim <= 128) {
    launch_attention<4>(kv_f32, grid, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim,
                        d_n_past, partial, stream);
  } else {
    launch_attention<8>(kv_f32, grid, q, k_cache, v_cache, out, n_head, n_head_kv, head_dim,
                        d_n_past, partial, stream);
  }
  CUDA_CHECK_LAUNCH("attention_kernel");
  if (splits > 1) {
    launch_pdl("attention_combine_kernel", attention_combine_kernel, dim3(dim3(n_head, n_tok)),
               dim3(std::min(256, ((head_dim + 31) / 32) * 32)), stream, partial, out, n_head,
               head_dim, splits);
    CUDA_CHECK_LAUNCH("attention_combine_kernel");
  }
}
}  // namespace worker::kern
