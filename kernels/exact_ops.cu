// Exact kernels, see exact.cuh: the non-matmul ops, each the floats of the CPU reference
// (worker/engine/cpu/cpu_ops.{h,cpp}) bit for bit. The per-thread math is in
// exact_ops_math.cuh (shared with the host tests, which emulate these decompositions).
//
// Orders reproduced, and why each is exact:
//  - rmsnorm (cpu::rms_norm_row): the CPU sums the float squares x*x sequentially in double.
//    Here a fixed tree sums them in double (threads' strided partial sums, then warp
//    butterflies). The two double sums differ by at most ~2n * 2^-53 of the sum; the mean is
//    float(sum / n), a monotone function of the sum, so when it gives the same float at both
//    ends of that interval (math::rms_mean_certain) the tree's mean is the CPU's. Otherwise
//    (the interval straddles a float rounding boundary: probability ~n * 2^-29 per row,
//    about 4e-6 for n = 896) thread 0 redoes the sum sequentially in the CPU's order. So the
//    mean is always the CPU's; scale = 1/sqrtf(mean + eps) and y = (x*scale)*w are the same
//    IEEE ops.
//  - bias_rope_store (cpu::rope_row after the bias adds): x + b (one add), then the pair
//    rotation d0 = fma(x0, c, -(x1*s)), d1 = fma(x0, s, x1*c) with cos/sin from a table the
//    host builds with the CPU engine's own code (cpu::rope_cos_sin). Element-wise: exact.
//  - attention (cpu::attention_head), three kernels per chunk of tokens:
//    scores: one thread per (token, head, key) computes cpu::dot_vecdot literally (64 FMA
//      chains, the GGML_F32x16_REDUCE + hsum16 tree, the tail loop) times kq_scale.
//    softmax: one block per (token, head): max (order-free), ggml_expf per key (0 beyond
//      n_att up to the 16-padding), hsum16 per 16-block (one thread per block, the CPU's
//      tree). The CPU adds those block sums sequentially in double; here a double tree, with
//      the same certainty check as rmsnorm on inv = float(1/sum) and the sequential sum as
//      fallback. Probabilities e*inv are formed by the KQV kernel as it reads them.
//    KQV: the CPU's dot over the keys is 64 (vec_dot, one token) or 16 (tinyBLAS, >= 2
//      tokens) independent FMA chains over the keys; one thread runs one chain for one
//      output dim (same FMAs, same order, zeros beyond n_att as the CPU's padded buffers),
//      then one thread per dim combines the chains in the CPU's tree (vecdot_reduce64 /
//      hsum16).
//    Decode (n_tok == 1, head_dim <= 256): ex_attn_decode_kernel does all three in one
//      launch (a cluster of C blocks per head; see its comment): the same scores, the same
//      softmax tree and fallback, and the same 64 KQV chains combined in vecdot_reduce64's
//      tree. Its variants also write the output rounded for wo (attention_act) and do
//      bias_rope_store's work for the token first (rope_attention_act; exact_fused.cuh).
//  - swiglu (cpu::swiglu_row): element-wise; ggml_silu with ggml_expf (its ldexp as one
//    rounding of an exact double product) for i < F & ~15; the scalar tail calls libm's expf
//    on the CPU: here glibc's expf algorithm in double (math::expf_libm; equal to glibc 2.36's
//    on all but 2 of 3.3e8 floats checked; exact.cuh's "exp in double, rounded once" differs
//    from glibc for 6e-4 of inputs, so it is not used).
// Launch geometry never depends on n_past (read from device memory): the decode step can be
// a replayed CUDA graph. No atomics; every result is computed by one fixed order.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <cooperative_groups.h>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "engine/cpu/cpu_ops.h"  // rope_cos_sin: the CPU engine's cos/sin code, inline
#include "exact.cuh"
#include "exact_fused.cuh"
#include "exact_ops_math.cuh"
#include "gguf/ggml_types.h"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

namespace cg = cooperative_groups;

// Block-wide double sum (fixed tree: warp butterflies, then the warps' sums); every thread
// gets the same bits (a butterfly's lanes add the same two values). `sh` holds >= 32.
__device__ __forceinline__ double block_sum_double(double v, double* sh) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int nw = (blockDim.x + kWarp - 1) / kWarp;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = lane < nw ? sh[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// ---- rmsnorm -------------------------------------------------------------------------

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    ex_rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                      float* __restrict__ y, int n, float eps) {
  __shared__ double shd[32];
  __shared__ float sh_mean;
  // Norm weights are never written by a kernel: read them before the PDL wait.
  constexpr int kPre = 4;
  float wpre[kPre];
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    wpre[k] = i < n ? w[i] : 0.0f;
  }
  griddep_wait();
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* yr = y + static_cast<size_t>(blockIdx.x) * n;
  float xpre[kPre];
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    xpre[k] = i < n ? xr[i] : 0.0f;
    if (i < n) s += static_cast<double>(xpre[k] * xpre[k]);
  }
  for (int i = threadIdx.x + kPre * kNormThreads; i < n; i += kNormThreads) {
    s += static_cast<double>(xr[i] * xr[i]);
  }
  s = block_sum_double(s, shd);
  float mean;
  if (!math::rms_mean_certain(s, n, &mean)) {  // uniform: every thread has the same s
    if (threadIdx.x == 0) {
      double q = 0.0;  // the CPU's order
      for (int i = 0; i < n; ++i) q += static_cast<double>(xr[i] * xr[i]);
      sh_mean = math::rms_mean(q, n);
    }
    __syncthreads();
    mean = sh_mean;
  }
  const float scale = math::rms_scale(mean, eps);
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    if (i < n) yr[i] = (xpre[k] * scale) * wpre[k];
  }
  for (int i = threadIdx.x + kPre * kNormThreads; i < n; i += kNormThreads) {
    yr[i] = (xr[i] * scale) * w[i];
  }
}

// ---- bias + RoPE + KV store ----------------------------------------------------------

constexpr int kRopeThreads = 64;

__global__ void __launch_bounds__(kRopeThreads)
    ex_bias_rope_store_kernel(float* __restrict__ q, const float* __restrict__ k,
                              const float* __restrict__ v, const float* __restrict__ bq,
                              const float* __restrict__ bk, const float* __restrict__ bv,
                              int n_head, int n_head_kv, int hd, int n_rot, int neox,
                              const float2* __restrict__ rope, const int32_t* __restrict__ d_n_past,
                              float* __restrict__ k_cache, float* __restrict__ v_cache) {
  const int t = blockIdx.x;
  const int hy = blockIdx.y;
  const int q_dim = n_head * hd, kv_dim = n_head_kv * hd;
  // Which head of which tensor this block does: Q heads (rotated in place), K heads
  // (rotated, stored), V heads (stored).
  int kind, h;
  if (hy < n_head) {
    kind = 0;
    h = hy;
  } else if (hy < n_head + n_head_kv) {
    kind = 1;
    h = hy - n_head;
  } else {
    kind = 2;
    h = hy - n_head - n_head_kv;
  }
  const float* bias = kind == 0 ? bq : (kind == 1 ? bk : bv);
  const float* bh = bias != nullptr ? bias + static_cast<size_t>(h) * hd : nullptr;
  const int half = n_rot / 2;
  // Biases are weights: this thread's first pair's before the PDL wait.
  float b0 = 0.0f, b1 = 0.0f;
  const int i_first = threadIdx.x;
  const int f0 = neox ? i_first : 2 * i_first, f1 = neox ? i_first + half : 2 * i_first + 1;
  if (bh != nullptr && kind != 2 && i_first < half) {
    b0 = bh[f0];
    b1 = bh[f1];
  }
  griddep_wait();
  const int pos = d_n_past[0] + t;
  const float* src;
  float* dst;
  if (kind == 0) {
    src = q + static_cast<size_t>(t) * q_dim + static_cast<size_t>(h) * hd;
    dst = q + static_cast<size_t>(t) * q_dim + static_cast<size_t>(h) * hd;
  } else {
    src = (kind == 1 ? k : v) + static_cast<size_t>(t) * kv_dim + static_cast<size_t>(h) * hd;
    dst = (kind == 1 ? k_cache : v_cache) + static_cast<size_t>(pos) * kv_dim +
          static_cast<size_t>(h) * hd;
  }
  int first_plain = 0;  // dims from here on are not rotated
  if (kind != 2) {
    const float2* cs = rope + static_cast<size_t>(pos) * half;
    for (int i = threadIdx.x; i < half; i += kRopeThreads) {
      const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
      float x0 = src[i0], x1 = src[i1];
      if (bh != nullptr) {
        x0 = x0 + (i == i_first ? b0 : bh[i0]);
        x1 = x1 + (i == i_first ? b1 : bh[i1]);
      }
      const float2 c = cs[i];
      float d0, d1;
      math::rope_pair(x0, x1, c.x, c.y, d0, d1);
      dst[i0] = d0;
      dst[i1] = d1;
    }
    first_plain = n_rot;
  }
  for (int d = first_plain + threadIdx.x; d < hd; d += kRopeThreads) {
    float x = src[d];
    if (bh != nullptr) x = x + bh[d];
    dst[d] = x;
  }
}

// ---- attention -----------------------------------------------------------------------

constexpr int kScoreThreads = 128;
constexpr int kSoftmaxThreads = 256;
constexpr size_t kScratchBudget = size_t{1} << 24;  // floats per chunk of tokens (64 MiB)

// Per (token of the chunk, head): scores / exps [cap_max], 16-block sums [cap_max / 16],
// inv (1 float, padded to 16).
struct ScratchLayout {
  int cap_max = 0;  // n_ctx rounded up to 64
  size_t stride = 0;
  int chunk = 1;  // tokens per launch group
};
ScratchLayout scratch_layout(int n_ctx, int n_tok, int n_head) {
  ScratchLayout l;
  l.cap_max = (n_ctx + 63) & ~63;
  l.stride = static_cast<size_t>(l.cap_max) + static_cast<size_t>(l.cap_max) / 16 + 16;
  const size_t per_tok = l.stride * static_cast<size_t>(n_head);
  const size_t fit = std::max<size_t>(1, kScratchBudget / per_tok);
  l.chunk = static_cast<int>(std::min<size_t>(fit, static_cast<size_t>(std::max(1, n_tok))));
  return l;
}

// cpu::dot_vecdot(k row, q) with the K row read as 16-byte loads where aligned.
__device__ __forceinline__ float score_dot(const float* __restrict__ kr, const float* qs, int hd) {
  float acc[64];
#pragma unroll
  for (int l = 0; l < 64; ++l) acc[l] = 0.0f;
  const int np = hd & ~63;
  const bool aligned = (reinterpret_cast<uintptr_t>(kr) & 15) == 0;
  for (int i = 0; i < np; i += 64) {
    float kv[64];
    if (aligned) {
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        const float4 f = __ldg(reinterpret_cast<const float4*>(kr + i) + c);
        kv[4 * c] = f.x;
        kv[4 * c + 1] = f.y;
        kv[4 * c + 2] = f.z;
        kv[4 * c + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int l = 0; l < 64; ++l) kv[l] = kr[i + l];
    }
#pragma unroll
    for (int l = 0; l < 64; ++l) acc[l] = fmaf(kv[l], qs[i + l], acc[l]);
  }
  return math::vecdot_tail(kr, qs, np, hd, math::vecdot_reduce64(acc));
}

__global__ void __launch_bounds__(kScoreThreads)
    ex_attn_scores_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                          float* __restrict__ scratch, int t0, int n_head, int group, int hd,
                          int kv_dim, size_t stride, float kq_scale,
                          const int32_t* __restrict__ d_n_past) {
  extern __shared__ float qs[];  // hd floats
  const int tc = blockIdx.x / n_head, h = blockIdx.x % n_head, t = t0 + tc, g = h / group;
  griddep_wait();
  const int n_att = d_n_past[0] + t + 1;
  const float* qh = q + static_cast<size_t>(t) * n_head * hd + static_cast<size_t>(h) * hd;
  for (int i = threadIdx.x; i < hd; i += kScoreThreads) qs[i] = qh[i];
  __syncthreads();
  float* sc = scratch + (static_cast<size_t>(tc) * n_head + h) * stride;
  const float* kbase = k_cache + static_cast<size_t>(g) * hd;
  for (int j = blockIdx.y * kScoreThreads + threadIdx.x; j < n_att;
       j += gridDim.y * kScoreThreads) {
    sc[j] = score_dot(kbase + static_cast<size_t>(j) * kv_dim, qs, hd) * kq_scale;
  }
}

__global__ void __launch_bounds__(kSoftmaxThreads)
    ex_attn_softmax_kernel(float* __restrict__ scratch, int t0, int n_head, size_t stride,
                           int cap_max, const int32_t* __restrict__ d_n_past) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ float sh_inv;
  const int tc = blockIdx.x / n_head, h = blockIdx.x % n_head, t = t0 + tc;
  griddep_wait();
  const int n_att = d_n_past[0] + t + 1;
  const int nb = (n_att + 15) / 16;
  float* sc = scratch + (static_cast<size_t>(tc) * n_head + h) * stride;
  float* bs = sc + cap_max;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n_att; j += kSoftmaxThreads) mx = fmaxf(mx, sc[j]);
  mx = block_max(mx, shf);
  double s = 0.0;
  for (int b = threadIdx.x; b < nb; b += kSoftmaxThreads) {
    float e[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * b + i;
      e[i] = j < n_att ? math::expf_ggml(sc[j] - mx) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) sc[16 * b + i] = e[i];
    const float hs = math::hsum16(e);
    bs[b] = hs;
    s += static_cast<double>(hs);
  }
  s = block_sum_double(s, shd);  // its __syncthreads also publish bs[] to the block
  float inv;
  if (!math::softmax_inv_certain(s, nb, &inv)) {  // uniform over the block
    if (threadIdx.x == 0) {
      double q = 0.0;  // the CPU's order: block sums added one by one
      for (int b = 0; b < nb; ++b) q += static_cast<double>(bs[b]);
      sh_inv = math::softmax_inv(q);
    }
    __syncthreads();
    inv = sh_inv;
  }
  if (threadIdx.x == 0) bs[cap_max / 16] = inv;
}

// out[d] = sum over keys of v[j][d] * p[j] as LANES independent FMA chains (lane l takes keys
// l, l + LANES, ...) over `len` keys, combined in the CPU's tree. Thread (l, dl): chain l of
// dim d0 + dl. LANES 64: vec_dot over cap = (n_past + n_tok) rounded up to 64 keys;
// LANES 16: tinyBLAS over n_att rounded up to 16.
template <int LANES, int DCH>
__global__ void __launch_bounds__(LANES* DCH)
    ex_attn_kqv_kernel(const float* __restrict__ v_cache, const float* __restrict__ scratch,
                       float* __restrict__ out, int t0, int n_head, int group, int hd, int kv_dim,
                       size_t stride, int cap_max, int n_tok_total,
                       const int32_t* __restrict__ d_n_past) {
  __shared__ float accs[LANES][DCH + 1];
  const int tc = blockIdx.x / n_head, h = blockIdx.x % n_head, t = t0 + tc, g = h / group;
  const int dl = threadIdx.x % DCH, l = threadIdx.x / DCH;
  const int d = blockIdx.y * DCH + dl;
  griddep_wait();
  const int n_past = d_n_past[0];
  const int n_att = n_past + t + 1;
  const int len = LANES == 64 ? ((n_past + n_tok_total + 63) & ~63) : ((n_att + 15) & ~15);
  const float* e = scratch + (static_cast<size_t>(tc) * n_head + h) * stride;
  const float inv = e[cap_max + cap_max / 16];
  float acc = 0.0f;
  if (d < hd) {
    const float* vcol = v_cache + static_cast<size_t>(g) * hd + d;
    int j = l;
#pragma unroll 4
    for (; j < n_att; j += LANES) {
      const float p = e[j] * inv;
      acc = fmaf(vcol[static_cast<size_t>(j) * kv_dim], p, acc);
    }
    // The padding: zero values times zero weights, as the CPU's zero-filled buffers (an FMA
    // of zeros can still turn a -0 sum into +0).
    for (; j < len; j += LANES) acc = fmaf(0.0f, 0.0f, acc);
  }
  accs[l][dl] = acc;
  __syncthreads();
  if (l == 0 && d < hd) {
    float a[LANES];
#pragma unroll
    for (int i = 0; i < LANES; ++i) a[i] = accs[i][dl];
    const float r = LANES == 64 ? math::vecdot_reduce64(a) : math::hsum16(a);
    out[static_cast<size_t>(t) * n_head * hd + static_cast<size_t>(h) * hd + d] = r;
  }
}

// ---- attention, one token (decode): one launch --------------------------------------
//
// ex_attn_decode_kernel: a cluster of C blocks per head (C = 1: one block), all three
// phases in one launch, bit for bit the three kernels above for n_tok == 1:
//  1. scores: block r of the cluster takes the keys of 16-blocks [b_lo, b_hi) (one thread
//     per key, score_dot as ex_attn_scores_kernel) and its max; cluster barrier; the max of
//     the C block maxima (max: exact in any order).
//  2. exps of its own 16-blocks and their hsum16 (as ex_attn_softmax_kernel); cluster
//     barrier; every block sums all block sums in the softmax kernel's tree (256 threads,
//     thread k summing blocks k, k + 256, ..., then block_sum_double), the same certainty
//     check and sequential fallback: every block gets the CPU's inv.
//  3. KQV for its share of the dims: 64 FMA chains per dim over cap = n_att rounded up to 64
//     keys (vec_dot's order, zero FMAs in the padding), one thread running chains l and
//     l + 32 (l < 32) of a dim and adding them (vecdot_reduce64's first level,
//     acc[l] + acc[l + 32]), then per dim its second level (t[l] + t[l + 16], l < 16) and
//     hsum16: vecdot_reduce64 exactly (float + is commutative).
// Scores and exps live in the scratch (the chunk layout of the batch path, token 0), read
// across blocks only after a cluster barrier (release / acquire at cluster scope, after a
// __threadfence) and with L2 loads (__ldcg). Geometry: n_head * C blocks, independent of
// n_past; any n_att up to n_ctx (every phase loops).

constexpr int kDecThreads = 256;
constexpr int kDecMaxHd = 256;
constexpr int kDecMaxCluster = 8;
// attention_act's rounding of the output (0: none).
constexpr int kDecActNone = 0, kDecActF32 = 1, kDecActF16 = 2, kDecActBF16 = 3, kDecActQ8_0 = 4;
static_assert(kDecThreads == kSoftmaxThreads, "the decode kernel reproduces the softmax tree");

// rope_attention_act: the decode kernel also does bias_rope_store's work for its token.
struct DecRope {
  const float* k_new = nullptr;  // this token's K and V rows (kv_dim each), before bias / RoPE
  const float* v_new = nullptr;
  const float* bq = nullptr;  // biases or nullptr
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float2* table = nullptr;  // rope_table_host's {cos, sin} pairs
  int n_rot = 0;
  int neox = 0;
  float* q_out = nullptr;  // q rotated in place (bias_rope_store's output)
  float* k_cache = nullptr;
  float* v_cache = nullptr;
};

// One head of bias_rope_store (ex_bias_rope_store_kernel's ops): dst = RoPE(src + bias) for
// the first n_rot dims, src + bias for the rest; cs: the position's {cos, sin} pairs.
__device__ __forceinline__ void dec_rope_head(const float* src, const float* bias, const float2* cs,
                                              int hd, int n_rot, int neox, float* dst) {
  const int half = n_rot / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float x0 = src[i0], x1 = src[i1];
    if (bias != nullptr) {
      x0 = x0 + bias[i0];
      x1 = x1 + bias[i1];
    }
    const float2 c = cs[i];
    float d0, d1;
    math::rope_pair(x0, x1, c.x, c.y, d0, d1);
    dst[i0] = d0;
    dst[i1] = d1;
  }
  for (int d = n_rot + threadIdx.x; d < hd; d += blockDim.x) {
    float x = src[d];
    if (bias != nullptr) x = x + bias[d];
    dst[d] = x;
  }
}

__device__ __forceinline__ void dec_cluster_sync(int C) {
  if (C > 1) {
    __threadfence();
    cg::this_cluster().sync();
  } else {
    __syncthreads();
  }
}

template <bool ROPE>
__global__ void __launch_bounds__(kDecThreads)
    ex_attn_decode_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                          const float* __restrict__ v_cache, float* __restrict__ scratch,
                          float* __restrict__ out, int n_head, int group, int hd, int kv_dim,
                          size_t stride, int cap_max, int C, float kq_scale,
                          const int32_t* __restrict__ d_n_past, ActBuf act, int act_mode,
                          DecRope rp) {
  __shared__ float qs[kDecMaxHd];
  // ROPE: this token's rotated K row and V row of the head's KV group. The cache rows at
  // n_past are written here (by one block per KV group) and never read in this kernel:
  // every block uses these copies for key n_past (the same floats).
  __shared__ float knew[ROPE ? kDecMaxHd : 1];
  __shared__ float vnew[ROPE ? kDecMaxHd : 1];
  __shared__ float r32[32 * kDecMaxHd];
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ float sh_inv;
  const int h = blockIdx.x / C, r = blockIdx.x % C, g = h / group;
  const int tid = threadIdx.x;
  griddep_wait();
  const int n_att = d_n_past[0] + 1;
  const int nb = (n_att + 15) / 16;
  const int cap = (n_att + 63) & ~63;
  const float* qh = q + static_cast<size_t>(h) * hd;
  // Keys below n_cached are read from the cache; (ROPE) key n_past from knew / vnew.
  const int n_cached = ROPE ? n_att - 1 : n_att;
  if constexpr (ROPE) {
    const float2* cs = rp.table + static_cast<size_t>(n_att - 1) * (rp.n_rot / 2);
    const size_t go = static_cast<size_t>(g) * hd;
    dec_rope_head(qh, rp.bq != nullptr ? rp.bq + static_cast<size_t>(h) * hd : nullptr, cs, hd,
                  rp.n_rot, rp.neox, qs);
    dec_rope_head(rp.k_new + go, rp.bk != nullptr ? rp.bk + go : nullptr, cs, hd, rp.n_rot, rp.neox,
                  knew);
    for (int d = tid; d < hd; d += kDecThreads) {
      float x = rp.v_new[go + d];
      if (rp.bv != nullptr) x = x + rp.bv[go + d];
      vnew[d] = x;
    }
  } else {
    for (int i = tid; i < hd; i += kDecThreads) qs[i] = qh[i];
  }
  __syncthreads();
  if constexpr (ROPE) {
    if (r == 0 && h % group == 0) {  // one block per KV group stores the cache rows
      const size_t row = static_cast<size_t>(n_att - 1) * kv_dim + static_cast<size_t>(g) * hd;
      for (int d = tid; d < hd; d += kDecThreads) {
        rp.k_cache[row + d] = knew[d];
        rp.v_cache[row + d] = vnew[d];
      }
    }
  }
  float* sc = scratch + static_cast<size_t>(h) * stride;
  float* bs = sc + cap_max;
  float* pmax = bs + cap_max / 16 + 1;  // C <= 8 slots after inv's (the 16 spare floats)
  const int per = (nb + C - 1) / C;
  const int b_lo = min(nb, r * per), b_hi = min(nb, b_lo + per);
  const int j_lo = 16 * b_lo, j_hi = min(n_att, 16 * b_hi);
  // 1. scores of this block's keys
  const float* kbase = k_cache + static_cast<size_t>(g) * hd;
  float mx = -INFINITY;
  for (int j = j_lo + tid; j < j_hi; j += kDecThreads) {
    float d;
    if (ROPE && j >= n_cached) {
      d = math::dot_vecdot(knew, qs, hd);  // score_dot's ops, from shared memory
    } else {
      d = score_dot(kbase + static_cast<size_t>(j) * kv_dim, qs, hd);
    }
    const float s = d * kq_scale;
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, shf);
  if (tid == 0) pmax[r] = mx;
  dec_cluster_sync(C);
  if constexpr (ROPE) {
    // bias_rope_store's q output; every block of the cluster has read q by now.
    if (r == 0) {
      for (int i = tid; i < hd; i += kDecThreads) rp.q_out[static_cast<size_t>(h) * hd + i] = qs[i];
    }
  }
  mx = -INFINITY;
  for (int i = 0; i < C; ++i) mx = fmaxf(mx, __ldcg(pmax + i));
  // 2. exps and 16-block sums of this block's keys
  for (int b = b_lo + tid; b < b_hi; b += kDecThreads) {
    float e[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * b + i;
      e[i] = j < n_att ? math::expf_ggml(sc[j] - mx) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) sc[16 * b + i] = e[i];
    bs[b] = math::hsum16(e);
  }
  dec_cluster_sync(C);
  double s = 0.0;
  for (int b = tid; b < nb; b += kDecThreads) s += static_cast<double>(__ldcg(bs + b));
  s = block_sum_double(s, shd);
  float inv;
  if (!math::softmax_inv_certain(s, nb, &inv)) {  // uniform over the block (and the cluster)
    if (tid == 0) {
      double qd = 0.0;  // the CPU's order: block sums added one by one
      for (int b = 0; b < nb; ++b) qd += static_cast<double>(__ldcg(bs + b));
      sh_inv = math::softmax_inv(qd);
    }
    __syncthreads();
    inv = sh_inv;
  }
  // 3. KQV for dims [d_lo, d_lo + dn): task (l, d), l < 32, runs chains l and l + 32.
  const int dper = (hd + C - 1) / C;
  const int d_lo = min(hd, r * dper), dn = min(hd, d_lo + dper) - d_lo;
  const float* vbase = v_cache + static_cast<size_t>(g) * hd + d_lo;
  const int full = n_cached & ~63;
  for (int task = tid; task < 32 * dn; task += kDecThreads) {
    const int dl = task % dn, l = task / dn;
    const float* vcol = vbase + dl;
    float a0 = 0.0f, a1 = 0.0f;  // chains l and l + 32
    int base = 0;
    // Whole 64-key groups below n_att: no bounds checks, so the loads of several groups
    // are in flight together.
#pragma unroll 8
    for (; base < full; base += 64) {
      const size_t j0 = static_cast<size_t>(base + l), j1 = j0 + 32;
      a0 = fmaf(vcol[j0 * kv_dim], __ldcg(sc + j0) * inv, a0);
      a1 = fmaf(vcol[j1 * kv_dim], __ldcg(sc + j1) * inv, a1);
    }
    for (; base < cap; base += 64) {  // the last group (at most one)
      const int j0 = base + l, j1 = j0 + 32;
      // Beyond n_att: the CPU's zero-padded values times zero weights.
      float v0 = 0.0f, v1 = 0.0f;  // cache rows at or beyond n_att are never read
      if (j0 < n_att) {
        v0 = ROPE && j0 >= n_cached ? vnew[d_lo + dl] : vcol[static_cast<size_t>(j0) * kv_dim];
      }
      if (j1 < n_att) {
        v1 = ROPE && j1 >= n_cached ? vnew[d_lo + dl] : vcol[static_cast<size_t>(j1) * kv_dim];
      }
      a0 = j0 < n_att ? fmaf(v0, __ldcg(sc + j0) * inv, a0) : fmaf(0.0f, 0.0f, a0);
      a1 = j1 < n_att ? fmaf(v1, __ldcg(sc + j1) * inv, a1) : fmaf(0.0f, 0.0f, a1);
    }
    r32[l * dn + dl] = a0 + a1;  // vecdot_reduce64's first level: acc[l] + acc[32 + l]
  }
  __syncthreads();
  for (int dl = tid; dl < dn; dl += kDecThreads) {
    float rr[16];  // second level: (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l])
#pragma unroll
    for (int i = 0; i < 16; ++i) rr[i] = r32[i * dn + dl] + r32[(i + 16) * dn + dl];
    const float o = math::hsum16(rr);
    const size_t oi = static_cast<size_t>(h) * hd + d_lo + dl;
    out[oi] = o;
    // attention_act: the output rounded for the next matmul, as quantize_act.
    if (act_mode == kDecActF32) {
      act.f[oi] = o;
    } else if (act_mode == kDecActF16) {
      act.f[oi] = math::act_round_fp16(o);
    } else if (act_mode == kDecActBF16) {
      act.f[oi] = math::act_round_bf16(o);
    }
  }
  if (act_mode == kDecActQ8_0) {  // uniform; hd % 32 == 0: the head's dims are whole blocks
    // The head's outputs come from the C blocks of the cluster: after the barrier, block 0
    // quantizes them, one warp per 32-block (quantize_act's Q8_0 formulas, amax exact).
    __threadfence();
    dec_cluster_sync(C);
    const int lane = tid % kWarp, w = tid / kWarp;
    if (r == 0 && w < hd / 32) {  // warp-uniform
      const size_t i0 = static_cast<size_t>(h) * hd + 32 * w;
      const float v = __ldcg(out + i0 + lane);
      float amax = fabsf(v);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      act.q[i0 + lane] = math::act_q8_0_quant(v, math::act_q8_0_id(amax));
      if (lane == 0) act.d[i0 / 32] = math::act_q8_0_d(amax);
    }
  }
}

// ---- swiglu --------------------------------------------------------------------------

constexpr int kSwigluThreads = 256;

using math::swiglu_one;  // shared with exact_fused.cu's swiglu_act

__global__ void __launch_bounds__(kSwigluThreads)
    ex_swiglu_kernel(float* __restrict__ g, const float* __restrict__ u, int n_tok, int F) {
  griddep_wait();
  const int f16 = F & ~15;
  const size_t total = static_cast<size_t>(n_tok) * F;
  const size_t stride = static_cast<size_t>(gridDim.x) * kSwigluThreads;
  if (F % 4 == 0) {  // 16-byte accesses; a group of 4 never straddles a row or the tail
    for (size_t v4 = static_cast<size_t>(blockIdx.x) * kSwigluThreads + threadIdx.x; v4 < total / 4;
         v4 += stride) {
      const int i = static_cast<int>((v4 * 4) % static_cast<size_t>(F));
      float4 gv = reinterpret_cast<const float4*>(g)[v4];
      const float4 uv = reinterpret_cast<const float4*>(u)[v4];
      gv.x = swiglu_one(gv.x, uv.x, i, f16);
      gv.y = swiglu_one(gv.y, uv.y, i + 1, f16);
      gv.z = swiglu_one(gv.z, uv.z, i + 2, f16);
      gv.w = swiglu_one(gv.w, uv.w, i + 3, f16);
      reinterpret_cast<float4*>(g)[v4] = gv;
    }
  } else {
    for (size_t k = static_cast<size_t>(blockIdx.x) * kSwigluThreads + threadIdx.x; k < total;
         k += stride) {
      g[k] = swiglu_one(g[k], u[k], static_cast<int>(k % static_cast<size_t>(F)), f16);
    }
  }
}

__global__ void ex_map_kernel(int which, const float* __restrict__ x, float* __restrict__ y,
                              size_t n) {
  griddep_wait();
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = which == 0 ? math::expf_ggml(v) : (which == 1 ? math::silu_ggml(v) : math::expf_libm(v));
  }
}

}  // namespace

namespace math {
void device_map_for_tests(int which, const float* x, float* y, size_t n) {
  launch_pdl("ex_map_kernel", ex_map_kernel, dim3(1024), dim3(256), cudaStream_t{}, which, x, y, n);
  CUDA_CHECK_LAUNCH("ex_map_kernel");
}
}  // namespace math

void rmsnorm(const float* x, const float* w, float* y, int n_rows, int n, float eps,
             cudaStream_t stream) {
  if (n_rows <= 0 || n <= 0) return;
  launch_pdl("ex_rmsnorm_kernel", ex_rmsnorm_kernel, dim3(n_rows), dim3(kNormThreads), stream, x, w,
             y, n, eps);
  CUDA_CHECK_LAUNCH("ex_rmsnorm_kernel");
}

void rope_table_host(int n_ctx, int n_rot, float theta_scale, float* out) {
  const int half = n_rot / 2;
  std::vector<float> c(static_cast<size_t>(std::max(half, 1))),
      s(static_cast<size_t>(std::max(half, 1)));
  for (int pos = 0; pos < n_ctx; ++pos) {
    cpu::rope_cos_sin(pos, n_rot, theta_scale, c.data(), s.data());
    float* o = out + 2 * static_cast<size_t>(pos) * half;
    for (int i = 0; i < half; ++i) {
      o[2 * i] = c[static_cast<size_t>(i)];
      o[2 * i + 1] = s[static_cast<size_t>(i)];
    }
  }
}

namespace {
void check_shape(const AttnShape& s, const char* what) {
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0 || s.head_dim <= 0 ||
      s.n_rot < 0 || s.n_rot > s.head_dim || s.n_rot % 2 != 0) {
    throw WorkerError(ErrorCode::Internal, std::string(what) + ": bad attention shape (n_head " +
                                               std::to_string(s.n_head) + ", n_head_kv " +
                                               std::to_string(s.n_head_kv) + ", head_dim " +
                                               std::to_string(s.head_dim) + ", n_rot " +
                                               std::to_string(s.n_rot) + ")");
  }
}
}  // namespace

void bias_rope_store(float* q, const float* k, const float* v, const float* bq, const float* bk,
                     const float* bv, const AttnShape& s, const float* rope_table, int n_tok,
                     const int32_t* d_n_past, float* k_cache, float* v_cache, cudaStream_t stream) {
  check_shape(s, "exact::bias_rope_store");
  if (n_tok <= 0) return;
  launch_pdl("ex_bias_rope_store_kernel", ex_bias_rope_store_kernel,
             dim3(n_tok, s.n_head + 2 * s.n_head_kv), dim3(kRopeThreads), stream, q, k, v, bq, bk,
             bv, s.n_head, s.n_head_kv, s.head_dim, s.n_rot, s.neox ? 1 : 0,
             reinterpret_cast<const float2*>(rope_table), d_n_past, k_cache, v_cache);
  CUDA_CHECK_LAUNCH("ex_bias_rope_store_kernel");
}

size_t attention_scratch_floats(int n_ctx, int max_tok, int n_head) {
  const ScratchLayout l = scratch_layout(n_ctx, max_tok, n_head);
  return l.stride * static_cast<size_t>(n_head) * static_cast<size_t>(l.chunk);
}

namespace {
// Blocks per head of the decode kernel: enough to spread the heads over the SMs (14 heads:
// 8 -> 112 blocks), a power of two <= 8 (the portable cluster size). WORKER_EXACT_ATTN_CLUSTER
// (1, 2, 4 or 8) overrides it (A/B measurements; 1 launches without clusters).
int g_cluster_for_tests = 0;  // math::set_decode_cluster_for_tests
int decode_cluster(int n_head) {
  if (g_cluster_for_tests != 0) return g_cluster_for_tests;
  static const int forced = [] {
    const char* e = std::getenv("WORKER_EXACT_ATTN_CLUSTER");
    if (e == nullptr) return 0;
    const int v = std::atoi(e);
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
  }();
  if (forced != 0) return forced;
  int c = kDecMaxCluster;
  while (c > 1 && n_head * c > 160) c /= 2;
  return c;
}

void launch_attn_decode(const float* q, const float* k_cache, const float* v_cache, float* out,
                        const AttnShape& s, int n_ctx, const int32_t* d_n_past, float* scratch,
                        int cluster, cudaStream_t stream, const ActBuf& act = ActBuf{},
                        int act_mode = kDecActNone, const DecRope* rope = nullptr) {
  const ScratchLayout lay = scratch_layout(n_ctx, 1, s.n_head);
  const int hd = s.head_dim, kv_dim = s.n_head_kv * hd, group = s.n_head / s.n_head_kv;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(s.n_head * cluster));
  cfg.blockDim = dim3(kDecThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2] = {};
  unsigned na = 0;
  if (cluster > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  const char* name = "ex_attn_decode_kernel";
  if (pdl_enabled() && !pdl_skipped(name)) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  if (rope != nullptr) {
    cuda_check(cudaLaunchKernelEx(&cfg, ex_attn_decode_kernel<true>, q, k_cache, v_cache, scratch,
                                  out, s.n_head, group, hd, kv_dim, lay.stride, lay.cap_max,
                                  cluster, kq_scale, d_n_past, act, act_mode, *rope),
               name, __FILE__, __LINE__);
  } else {
    cuda_check(cudaLaunchKernelEx(&cfg, ex_attn_decode_kernel<false>, q, k_cache, v_cache, scratch,
                                  out, s.n_head, group, hd, kv_dim, lay.stride, lay.cap_max,
                                  cluster, kq_scale, d_n_past, act, act_mode, DecRope{}),
               name, __FILE__, __LINE__);
  }
  CUDA_CHECK_LAUNCH(name);
}
}  // namespace

namespace math {
void set_decode_cluster_for_tests(int cluster) {
  if (cluster != 0 && cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) {
    throw WorkerError(ErrorCode::Internal, "set_decode_cluster_for_tests: 0, 1, 2, 4 or 8");
  }
  g_cluster_for_tests = cluster;
}
void attention_decode_for_tests(const float* q, const float* k_cache, const float* v_cache,
                                float* out, int n_head, int n_head_kv, int head_dim, int n_ctx,
                                const int32_t* d_n_past, float* scratch, int cluster) {
  AttnShape s;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.head_dim = head_dim;
  s.n_rot = 0;
  check_shape(s, "attention_decode_for_tests");
  if (head_dim > kDecMaxHd || (cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8)) {
    throw WorkerError(ErrorCode::Internal, "attention_decode_for_tests: unsupported shape");
  }
  launch_attn_decode(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch, cluster,
                     cudaStream_t{});
}
void attention_act_decode_for_tests(const float* q, const float* k_cache, const float* v_cache,
                                    float* out, int n_head, int n_head_kv, int head_dim, int n_ctx,
                                    const int32_t* d_n_past, float* scratch, int cluster,
                                    uint32_t act_type, float* act_f, int8_t* act_q, float* act_d) {
  AttnShape s;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.head_dim = head_dim;
  s.n_rot = 0;
  check_shape(s, "attention_act_decode_for_tests");
  const GgmlType t = static_cast<GgmlType>(act_type);
  const int mode = t == GgmlType::F32    ? kDecActF32
                   : t == GgmlType::F16  ? kDecActF16
                   : t == GgmlType::BF16 ? kDecActBF16
                                         : kDecActQ8_0;
  const bool q8 = t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q5_0;
  if (head_dim > kDecMaxHd || (cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) ||
      (mode == kDecActQ8_0 && (!q8 || head_dim % 32 != 0))) {
    throw WorkerError(ErrorCode::Internal, "attention_act_decode_for_tests: unsupported shape");
  }
  ActBuf a;
  a.f = act_f;
  a.q = act_q;
  a.d = act_d;
  launch_attn_decode(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch, cluster, cudaStream_t{},
                     a, mode);
}
}  // namespace math

void attention(const float* q, const float* k_cache, const float* v_cache, float* out, int n_tok,
               const AttnShape& s, int n_ctx, const int32_t* d_n_past, float* scratch,
               cudaStream_t stream) {
  check_shape(s, "exact::attention");
  if (n_tok <= 0) return;
  if (n_tok == 1 && s.head_dim <= kDecMaxHd) {  // decode: one launch
    launch_attn_decode(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch,
                       decode_cluster(s.n_head), stream);
    return;
  }
  const ScratchLayout lay = scratch_layout(n_ctx, n_tok, s.n_head);
  const int hd = s.head_dim, kv_dim = s.n_head_kv * hd, group = s.n_head / s.n_head_kv;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // cpu::tinyblas_takes(F32, head_dim, n_tok, 256): the KQV product of a batch of >= 2
  // tokens runs in tinyBLAS's order when head_dim % 4 == 0.
  const bool tiny = n_tok >= 2 && hd % 4 == 0;
  for (int t0 = 0; t0 < n_tok; t0 += lay.chunk) {
    const int nc = std::min(lay.chunk, n_tok - t0);
    const int pairs = nc * s.n_head;
    // Enough score blocks to fill the GPU at decode (one token, few heads), independent of
    // n_past: each block strides over the keys.
    const int splits = std::clamp((4 * 132 + pairs - 1) / pairs, 1, 16);
    launch_pdl_smem("ex_attn_scores_kernel", ex_attn_scores_kernel, dim3(pairs, splits),
                    dim3(kScoreThreads), static_cast<size_t>(hd) * sizeof(float), stream, q,
                    k_cache, scratch, t0, s.n_head, group, hd, kv_dim, lay.stride, kq_scale,
                    d_n_past);
    CUDA_CHECK_LAUNCH("ex_attn_scores_kernel");
    launch_pdl("ex_attn_softmax_kernel", ex_attn_softmax_kernel, dim3(pairs), dim3(kSoftmaxThreads),
               stream, scratch, t0, s.n_head, lay.stride, lay.cap_max, d_n_past);
    CUDA_CHECK_LAUNCH("ex_attn_softmax_kernel");
    if (tiny) {
      constexpr int kL = 16, kD = 32;
      launch_pdl("ex_attn_kqv_kernel", ex_attn_kqv_kernel<kL, kD>, dim3(pairs, (hd + kD - 1) / kD),
                 dim3(kL * kD), stream, v_cache, scratch, out, t0, s.n_head, group, hd, kv_dim,
                 lay.stride, lay.cap_max, n_tok, d_n_past);
    } else {
      constexpr int kL = 64, kD = 8;
      launch_pdl("ex_attn_kqv_kernel", ex_attn_kqv_kernel<kL, kD>, dim3(pairs, (hd + kD - 1) / kD),
                 dim3(kL * kD), stream, v_cache, scratch, out, t0, s.n_head, group, hd, kv_dim,
                 lay.stride, lay.cap_max, n_tok, d_n_past);
    }
    CUDA_CHECK_LAUNCH("ex_attn_kqv_kernel");
  }
}

namespace {
// The decode kernel's act_mode for quantize_act(act_type) of the attention output; -1 where
// it has no fused form (Q8_K, or Q8_0 blocks that straddle heads).
int dec_act_mode(uint32_t act_type, int head_dim) {
  switch (static_cast<GgmlType>(act_type)) {
    case GgmlType::F32: return kDecActF32;
    case GgmlType::F16: return kDecActF16;
    case GgmlType::BF16: return kDecActBF16;
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: return head_dim % 32 == 0 ? kDecActQ8_0 : -1;
    default: return -1;
  }
}
}  // namespace

void attention_act(const float* q, const float* k_cache, const float* v_cache, float* out,
                   int n_tok, const AttnShape& s, int n_ctx, const int32_t* d_n_past,
                   float* scratch, uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  check_shape(s, "exact::attention_act");
  if (n_tok <= 0) return;
  const int mode = dec_act_mode(act_type, s.head_dim);
  if (n_tok == 1 && s.head_dim <= kDecMaxHd && mode >= 0) {
    launch_attn_decode(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch,
                       decode_cluster(s.n_head), stream, a, mode);
    return;
  }
  attention(q, k_cache, v_cache, out, n_tok, s, n_ctx, d_n_past, scratch, stream);
  quantize_act(act_type, out, n_tok, s.n_head * s.head_dim, a, stream);
}

void rope_attention_act(float* q, const float* k, const float* v, const float* bq, const float* bk,
                        const float* bv, const AttnShape& s, const float* rope_table, int n_tok,
                        const int32_t* d_n_past, float* k_cache, float* v_cache, float* out,
                        int n_ctx, float* scratch, uint32_t act_type, const ActBuf& a,
                        cudaStream_t stream) {
  check_shape(s, "exact::rope_attention_act");
  if (n_tok <= 0) return;
  const int mode = dec_act_mode(act_type, s.head_dim);
  if (n_tok == 1 && s.head_dim <= kDecMaxHd && mode >= 0) {
    DecRope rp;
    rp.k_new = k;
    rp.v_new = v;
    rp.bq = bq;
    rp.bk = bk;
    rp.bv = bv;
    rp.table = reinterpret_cast<const float2*>(rope_table);
    rp.n_rot = s.n_rot;
    rp.neox = s.neox ? 1 : 0;
    rp.q_out = q;
    rp.k_cache = k_cache;
    rp.v_cache = v_cache;
    launch_attn_decode(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch,
                       decode_cluster(s.n_head), stream, a, mode, &rp);
    return;
  }
  bias_rope_store(q, k, v, bq, bk, bv, s, rope_table, n_tok, d_n_past, k_cache, v_cache, stream);
  attention_act(q, k_cache, v_cache, out, n_tok, s, n_ctx, d_n_past, scratch, act_type, a, stream);
}

void swiglu(float* g, const float* u, int n_tok, int F, cudaStream_t stream) {
  if (n_tok <= 0 || F <= 0) return;
  const size_t total = static_cast<size_t>(n_tok) * F;
  const size_t per = F % 4 == 0 ? total / 4 : total;
  const int blocks =
      static_cast<int>(std::min<size_t>((per + kSwigluThreads - 1) / kSwigluThreads, 132 * 8));
  launch_pdl("ex_swiglu_kernel", ex_swiglu_kernel, dim3(blocks), dim3(kSwigluThreads), stream, g, u,
             n_tok, F);
  CUDA_CHECK_LAUNCH("ex_swiglu_kernel");
}

}  // namespace worker::kern::exact
