#include <cuda_fp16.h>

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

// ---- prompt batches over the FP16 cache: flash attention on tensor cores ---------------
// A block takes kFaQ = 64 queries of one head, 16 per warp; it walks the keys 0 ..
// n_past + (its last query) in tiles of kFaK (64, or 32 for head_dim 128), double-buffered in
// shared memory by cp.async. Per tile each warp computes S = Q K^T (mma.m16n8k16, FP16
// inputs, FP32 sums), masks the keys past each query's position, updates the running max /
// sum (exp2 of log2(e)-scaled scores) and adds P V (P rounded to FP16) to its FP32 output
// rows. Fast numerics: Q and P are rounded to FP16 (the scores and sums stay FP32); the
// kernel tests hold it to the FP64 reference at 3e-3 (relative RMS). Deterministic: no
// atomics, a fixed order of tiles and lanes.
constexpr int kFaWarps = 4;
constexpr int kFaQ = 16 * kFaWarps;

template <int HD>
__host__ __device__ constexpr int fa_keys() {
  return HD <= 64 ? 64 : 32;
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);  // lo in the low 16 bits
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c += a b (16x16 row-major FP16 times 16x8 column-major FP16, FP32 accumulators).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

template <int HD>
__global__ void __launch_bounds__(kFaWarps* kWarp)
    flash_prompt_kernel(const float* __restrict__ q, const __half* __restrict__ kc,
                        const __half* __restrict__ vc, float* __restrict__ out, int n_tok,
                        int n_head, int n_head_kv, const int32_t* __restrict__ d_n_past) {
  constexpr int kK = fa_keys<HD>();
  constexpr int kLd = HD + 8;           // halves per shared row: 16-byte rows, 4 banks apart
  constexpr int kChunks = kK * HD / 8;  // 16-byte pieces of one K (or V) tile
  __shared__ __align__(16) __half ks[2][kK * kLd];
  __shared__ __align__(16) __half vs[2][kK * kLd];
  // The blocks with the most keys (the last queries) first.
  const int t0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kFaQ;
  const int h = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarp,
            lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane >> 2, tq = lane & 3;
  const int kvh = h / (n_head / n_head_kv);
  const size_t kv_stride = static_cast<size_t>(n_head_kv) * HD;
  griddep_wait();
  const int n_past = *d_n_past;
  const int n_kv = n_past + min(t0 + kFaQ, n_tok);  // keys the block's last query sees
  const int n_tiles = (n_kv + kK - 1) / kK;
  const __half* kbase = kc + static_cast<size_t>(kvh) * HD;
  const __half* vbase = vc + static_cast<size_t>(kvh) * HD;
  auto issue = [&](int st, int p0) {
    for (int c = static_cast<int>(threadIdx.x); c < kChunks; c += kFaWarps * kWarp) {
      const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
      const int p = p0 + r;
      const size_t off = static_cast<size_t>(p < n_kv ? p : 0) * kv_stride + col;
      const int bytes = p < n_kv ? 16 : 0;  // zeros past the last key (V there must be finite)
      cp_async16(&ks[st][r * kLd + col], kbase + off, bytes);
      cp_async16(&vs[st][r * kLd + col], vbase + off, bytes);
    }
    cp_async_commit();
  };
  issue(0, 0);

  // This thread's two query rows (g and g + 8 of the warp's 16); rows past n_tok repeat the
  // last query and are not stored.
  const int r0 = t0 + warp * 16 + g, r1 = r0 + 8;
  const float qscale = 1.4426950408889634f / sqrtf(static_cast<float>(HD));  // log2(e) / sqrt(hd)
  uint32_t qa[HD / 16][4];
  {
    const float* q0 = q + (static_cast<size_t>(min(r0, n_tok - 1)) * n_head + h) * HD;
    const float* q1 = q + (static_cast<size_t>(min(r1, n_tok - 1)) * n_head + h) * HD;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int d = 16 * kk + 2 * tq;
      const float2 a = *reinterpret_cast<const float2*>(q0 + d);
      const float2 b = *reinterpret_cast<const float2*>(q1 + d);
      const float2 c = *reinterpret_cast<const float2*>(q0 + d + 8);
      const float2 e = *reinterpret_cast<const float2*>(q1 + d + 8);
      qa[kk][0] = half2_bits(a.x * qscale, a.y * qscale);
      qa[kk][1] = half2_bits(b.x * qscale, b.y * qscale);
      qa[kk][2] = half2_bits(c.x * qscale, c.y * qscale);
      qa[kk][3] = half2_bits(e.x * qscale, e.y * qscale);
    }
  }
  float o[HD / 8][4];
#pragma unroll
  for (int j = 0; j < HD / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int first_row = n_past + t0 + warp * 16;  // the warp's first query position

  for (int kt = 0; kt < n_tiles; ++kt) {
    const int st = kt & 1, p0 = kt * kK;
    if (kt + 1 < n_tiles) {
      issue(st ^ 1, p0 + kK);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kt in shared memory for every warp
    const __half* kt_s = ks[st];
    const __half* vt_s = vs[st];
    float s[kK / 8][4];
#pragma unroll
    for (int j = 0; j < kK / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      const __half* kr = kt_s + (8 * j + g) * kLd + 2 * tq;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk + 8);
        mma16816(s[j], qa[kk], b0, b1);
      }
    }
    if (p0 + kK - 1 > first_row) {  // causal mask: key p is seen by the query at n_past + row >= p
#pragma unroll
      for (int j = 0; j < kK / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int p = p0 + 8 * j + 2 * tq + (e & 1);
          const int row = e < 2 ? r0 : r1;
          if (p > n_past + row) s[j][e] = -INFINITY;
        }
      }
    }
    // Running max over the row (the quad of lanes sharing it). Key 0 is seen by every row,
    // so the max is finite from the first tile on.
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int j = 0; j < kK / 8; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float c0 = exp2f(m0 - mx0), c1 = exp2f(m1 - mx1);  // 0 on the first tile
    m0 = mx0;
    m1 = mx1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) {
      o[j][0] *= c0;
      o[j][1] *= c0;
      o[j][2] *= c1;
      o[j][3] *= c1;
    }
    // P as the A operand of P V: score tiles 2k and 2k + 1 are the 16 keys of step k.
    uint32_t pa[kK / 16][4];
#pragma unroll
    for (int j = 0; j < kK / 8; ++j) {
      const float e0 = exp2f(s[j][0] - mx0), e1 = exp2f(s[j][1] - mx0);
      const float e2 = exp2f(s[j][2] - mx1), e3 = exp2f(s[j][3] - mx1);
      l0 += e0 + e1;
      l1 += e2 + e3;
      pa[j / 2][(j & 1) * 2] = half2_bits(e0, e1);
      pa[j / 2][(j & 1) * 2 + 1] = half2_bits(e2, e3);
    }
    // O += P V: V's 8x8 pieces transposed by ldmatrix into B fragments (lane i addresses row
    // i % 8 of piece i / 8: keys +0 / +8, dims +0 / +8).
    const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int k = 0; k < kK / 16; ++k) {
#pragma unroll
      for (int j = 0; j < HD / 8; j += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vt_s + (16 * k + (mi & 1) * 8 + rr) * kLd + 8 * (j + (mi >> 1)));
        mma16816(o[j], pa[k], b[0], b[1]);
        mma16816(o[j + 1], pa[k], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with stage st before it is refilled
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = 1.0f / l0, i1 = 1.0f / l1;
#pragma unroll
  for (int j = 0; j < HD / 8; ++j) {
    const int d = 8 * j + 2 * tq;
    if (r0 < n_tok) {
      *reinterpret_cast<float2*>(out + (static_cast<size_t>(r0) * n_head + h) * HD + d) =
          make_float2(o[j][0] * i0, o[j][1] * i0);
    }
    if (r1 < n_tok) {
      *reinterpret_cast<float2*>(out + (static_cast<size_t>(r1) * n_head + h) * HD + d) =
          make_float2(o[j][2] * i1, o[j][3] * i1);
    }
  }
}

template <int HD>
void launch_flash(const float* q, const void* k, const void* v, float* out, int n_tok, int n_head,
                  int n_head_kv, const int32_t* d_n_past, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n_tok + kFaQ - 1) / kFaQ), static_cast<unsigned>(n_head));
  launch_pdl("flash_prompt_kernel", flash_prompt_kernel<HD>, grid, dim3(kFaWarps * kWarp), stream,
             q, static_cast<const __half*>(k), static_cast<const __half*>(v), out, n_tok, n_head,
             n_head_kv, d_n_past);
  CUDA_CHECK_LAUNCH("flash_prompt_kernel");
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
  // Prompt batches over the FP16 cache: the tensor-core kernel (head_dim 32, 64 or 128).
  if (!kv_f32 && n_tok > 1) {
    switch (head_dim) {
      case 32:
        return launch_flash<32>(q, k_cache, v_cache, out, n_tok, n_head, n_head_kv, d_n_past,
                                stream);
      case 64:
        return launch_flash<64>(q, k_cache, v_cache, out, n_tok, n_head, n_head_kv, d_n_past,
                                stream);
      case 128:
        return launch_flash<128>(q, k_cache, v_cache, out, n_tok, n_head, n_head_kv, d_n_past,
                                 stream);
      default: break;
    }
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
