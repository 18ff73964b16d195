// Exact attention (attention_exact.cuh), one set of kernels for both cache types: the floats of
// the CPU reference (cpu::attention_head over an FP32 cache, cpu::attention_head_f16 over an
// FP16 one) bit for bit. The per-thread math is attention_exact_math.cuh (shared with the host
// emulation tests); KV (math::KvF32 / KvF16) supplies the per-element steps.
//
// Orders reproduced, and why each is exact:
//  - bias_rope_store: x + b (one add), the pair rotation math::rope_pair with cos/sin from the
//    host table built by the CPU engine's own code (common/rope.h), K and V stored as
//    KV::store (fp16: __float2half_rn, round to nearest even as the CPU's fp32_to_fp16).
//    Element-wise: exact.
//  - attend, three kernels per chunk of tokens:
//    scores: one thread per (token, head, key): the query as KV::query, then KV::kq_vec (the
//      64 FMA chains of ggml_vec_dot, its reduce tree and its leftovers) or KV::kq_tiny16
//      (tinyBLAS F16, 16 chains + hsum16), literally the CPU's loops; times kq_scale.
//    softmax: one block per (token, head): max (order-free), ggml_expf per key (0 beyond n_att
//      up to the 16-padding), hsum16 per 16-block (one thread per block, the CPU's tree). The
//      CPU adds those block sums sequentially in double; here a double tree, with a certainty
//      check on inv = float(1/sum) (math::softmax_inv_certain: the tree and the sequential sum
//      round alike) and the sequential sum as fallback. The same floats for both cache types.
//    KQV: weights KV::prob(e, inv); the CPU's dot over the keys is 64 (vec_dot over cap =
//      n_past + n_tok rounded up to 64) or 16 (tinyBLAS: a batch, head_dim % 4 == 0, over n_att
//      rounded up to 16) independent FMA chains; one thread runs one chain of one output dim
//      (same FMAs, same order, FMAs of zeros in the padding as the CPU's zero-filled buffers),
//      then one thread per dim combines the chains in the CPU's tree (vecdot_reduce64 / hsum16).
//  - decode (n_tok == 1, head_dim <= 256): ex_attn_decode_kernel does all three in one launch,
//    and optionally bias_rope_store's work before and the output's rounding for the next
//    matmul after (see its comment).
// Launch geometry never depends on n_past (read from device memory): the decode step can be a
// replayed CUDA graph. No atomics; every result is computed in one fixed order.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <cooperative_groups.h>

#include "attention_exact.cuh"
#include "attention_exact_math.cuh"
#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "gguf/ggml_types.h"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

namespace cg = cooperative_groups;
using math::KvF16;
using math::KvF32;

template <class T>
struct KvOf;
template <>
struct KvOf<float> {
  using type = KvF32;
};
template <>
struct KvOf<uint16_t> {
  using type = KvF16;
};

// ---- bias + RoPE + KV store ------------------------------------------------------------

constexpr int kRopeThreads = 64;

template <class KV>
__global__ void __launch_bounds__(kRopeThreads)
    ex_bias_rope_store_kernel(float* __restrict__ q, const float* __restrict__ k,
                              const float* __restrict__ v, const float* __restrict__ bq,
                              const float* __restrict__ bk, const float* __restrict__ bv,
                              int n_head, int n_head_kv, int hd, int n_rot, int neox,
                              const float2* __restrict__ rope, const int32_t* __restrict__ d_n_past,
                              typename KV::T* __restrict__ k_cache,
                              typename KV::T* __restrict__ v_cache) {
  const int t = blockIdx.x;
  const int hy = blockIdx.y;
  const int q_dim = n_head * hd, kv_dim = n_head_kv * hd;
  // This block's head: Q heads (rotated in place), K heads (rotated, stored), V heads (stored).
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
  float* qdst = nullptr;
  typename KV::T* cdst = nullptr;
  if (kind == 0) {
    src = q + static_cast<size_t>(t) * q_dim + static_cast<size_t>(h) * hd;
    qdst = q + static_cast<size_t>(t) * q_dim + static_cast<size_t>(h) * hd;
  } else {
    src = (kind == 1 ? k : v) + static_cast<size_t>(t) * kv_dim + static_cast<size_t>(h) * hd;
    cdst = (kind == 1 ? k_cache : v_cache) + static_cast<size_t>(pos) * kv_dim +
           static_cast<size_t>(h) * hd;
  }
  auto store = [&](int d, float x) {
    if (qdst != nullptr) {
      qdst[d] = x;
    } else {
      cdst[d] = KV::store(x);
    }
  };
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
      store(i0, d0);
      store(i1, d1);
    }
    first_plain = n_rot;
  }
  for (int d = first_plain + threadIdx.x; d < hd; d += kRopeThreads) {
    float x = src[d];
    if (bh != nullptr) x = x + bh[d];
    store(d, x);
  }
}

// ---- attention -------------------------------------------------------------------------

constexpr int kScoreThreads = 128;
constexpr int kSoftmaxThreads = 256;
constexpr size_t kScratchBudget = size_t{1} << 24;  // floats per chunk of tokens (64 MiB)

// Per (token of the chunk, head): scores / exps [cap_max], 16-block sums [cap_max / 16], inv
// (1 float, padded to 16: the decode kernel keeps its blocks' maxima there).
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

template <class KV, bool TINY>
__global__ void __launch_bounds__(kScoreThreads)
    ex_attn_scores_kernel(const float* __restrict__ q, const typename KV::T* __restrict__ k_cache,
                          float* __restrict__ scratch, int t0, int n_head, int group, int hd,
                          int kv_dim, size_t stride, float kq_scale,
                          const int32_t* __restrict__ d_n_past) {
  extern __shared__ float qs[];  // hd floats: the query head as KQ reads it
  const int tc = blockIdx.x / n_head, h = blockIdx.x % n_head, t = t0 + tc, g = h / group;
  griddep_wait();
  const int n_att = d_n_past[0] + t + 1;
  const float* qh = q + static_cast<size_t>(t) * n_head * hd + static_cast<size_t>(h) * hd;
  for (int i = threadIdx.x; i < hd; i += kScoreThreads) qs[i] = KV::query(qh[i]);
  __syncthreads();
  float* sc = scratch + (static_cast<size_t>(tc) * n_head + h) * stride;
  const typename KV::T* kbase = k_cache + static_cast<size_t>(g) * hd;
  for (int j = blockIdx.y * kScoreThreads + threadIdx.x; j < n_att;
       j += gridDim.y * kScoreThreads) {
    const typename KV::T* kr = kbase + static_cast<size_t>(j) * kv_dim;
    float s;
    if constexpr (TINY) {
      s = KV::kq_tiny16(kr, qs, hd);
    } else {
      s = KV::kq_vec(kr, qs, hd, true);
    }
    sc[j] = s * kq_scale;
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
  s = math::block_sum_double(s, shd);  // its __syncthreads also publish bs[] to the block
  float inv;
  if (!math::softmax_inv_certain(s, nb, &inv)) {  // uniform over the block
    if (threadIdx.x == 0) {
      double qd = 0.0;  // the CPU's order: block sums added one by one
      for (int b = 0; b < nb; ++b) qd += static_cast<double>(bs[b]);
      sh_inv = math::softmax_inv(qd);
    }
    __syncthreads();
    inv = sh_inv;
  }
  if (threadIdx.x == 0) bs[cap_max / 16] = inv;
}

// out[d] = sum over keys of v[j][d] * KV::prob(e[j], inv) as LANES independent FMA chains (lane
// l takes keys l, l + LANES, ...) over `len` keys, combined in the CPU's tree. Thread (l, dl):
// chain l of dim d0 + dl. LANES 64: vec_dot over cap = (n_past + n_tok) rounded up to 64 keys;
// LANES 16: tinyBLAS over n_att rounded up to 16.
template <class KV, int LANES, int DCH>
__global__ void __launch_bounds__(LANES* DCH)
    ex_attn_kqv_kernel(const typename KV::T* __restrict__ v_cache,
                       const float* __restrict__ scratch, float* __restrict__ out, int t0,
                       int n_head, int group, int hd, int kv_dim, size_t stride, int cap_max,
                       int n_tok_total, const int32_t* __restrict__ d_n_past) {
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
    const typename KV::T* vcol = v_cache + static_cast<size_t>(g) * hd + d;
    int j = l;
#pragma unroll 4
    for (; j < n_att; j += LANES) {
      acc = fmaf(KV::load(vcol[static_cast<size_t>(j) * kv_dim]), KV::prob(e[j], inv), acc);
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

// ---- attention, one token (decode): one launch -----------------------------------------
//
// ex_attn_decode_kernel: a cluster of C blocks per head (C = 1: one block), bit for bit the
// three kernels above for n_tok == 1 (vec_dot orders for KQ and KQV):
//  0. (ROPE) every block does bias_rope_store's ops for its head and KV group: q + bq, RoPE
//     (the q output), then KV::query of it; k + bk, RoPE, v + bv, each stored as KV::store and
//     kept as the exact floats of the stored values. One block per KV group (r == 0, the
//     group's first head) writes the two cache rows at n_past; no block reads them: key n_past
//     uses the shared copies (the values the unfused kernels would read back).
//  1. scores: block r of the cluster takes the keys of 16-blocks [b_lo, b_hi) (one thread per
//     key, KV::kq_vec) and its max; cluster barrier; the max of the C block maxima (max: exact
//     in any order). Local mode (n_att <= local_keys_of<KV>()): every block takes all keys, into
//     its own shared memory, and no cluster barrier is needed in steps 1-2.
//  2. exps of its own 16-blocks and their hsum16; cluster barrier; every block sums all block
//     sums in the softmax kernel's tree (256 threads, thread k summing blocks k, k + 256, ...,
//     then block_sum_double), the same certainty check and sequential fallback: every block
//     gets the CPU's inv. (Local mode: the same from its own arrays.)
//  3. KQV for its share of the dims: 64 FMA chains per dim over cap = n_att rounded up to 64
//     keys (zero FMAs in the padding), one thread running chains l and l + 32 (l < 32) of a dim
//     and adding them (vecdot_reduce64's first level, acc[l] + acc[l + 32]), then per dim its
//     second level (t[l] + t[l + 16], l < 16) and hsum16: vecdot_reduce64 exactly (float + is
//     commutative).
//  4. (act_mode) the output rounded as quantize_act, element-wise: F32 / F16 / BF16. (A Q8_0
//     rounding fused here, by block 0 of the cluster after one more cluster barrier, measured
//     slower than the separate quantize_act launch: bench/kernel_bench, reports/perf-notes.md.)
// Scores and exps live in the scratch (token 0's slots of the batch layout), read across blocks
// only after a cluster barrier (its release / acquire) and through L2 (__ldcg). Before its
// PDL wait each block reads n_past and prefetches its cache rows below n_past into L2.
// Geometry: n_head * C blocks, independent of n_past.

constexpr int kDecThreads = 256;
constexpr int kDecMaxHd = 256;
constexpr int kDecMaxCluster = 8;
// Up to local_keys_of<KV>() keys (n_past + 1) the decode kernel runs in local mode: each
// block of a head's cluster computes all scores and the softmax itself (the cluster's blocks
// then differ only in their share of KQV's output dims), no barriers across blocks, no scratch;
// beyond, the blocks split the keys and exchange maxima and sums through the scratch. The
// redundant score work grows with the context: the switch is where the two modes measured
// alike (bench/kernel_bench, H100, 0.5B shape: FP16 cache 6.8 vs 10.2 us at n_past 100, 10.0
// vs 11.3 at 500, 13.7 vs 13.1 at 1000; FP32 cache 7.3 vs 10.0 at 100, 12.0 vs 11.3 at 500).
constexpr int kDecLocalKeys = 768;  // the shared arrays' size: the larger of the two
template <class KV>
constexpr int local_keys_of() {
  return sizeof(typename KV::T) == 2 ? 768 : 384;
}
// The rounding of the output for the next matmul: an ActType, or kDecActNone.
constexpr int kDecActNone = -1;
static_assert(kDecThreads == kSoftmaxThreads, "the decode kernel reproduces the softmax tree");

// ROPE: the decode kernel also does bias_rope_store's work for its token.
template <class T>
struct DecRope {
  const float* k_new = nullptr;  // this token's K and V rows (kv_dim each), before bias / RoPE
  const float* v_new = nullptr;
  const float* bq = nullptr;  // biases or nullptr
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float2* table = nullptr;  // common/rope.h rope_table's {cos, sin} pairs
  int n_rot = 0;
  int neox = 0;
  float* q_out = nullptr;  // q rotated in place (bias_rope_store's output)
  T* k_cache = nullptr;
  T* v_cache = nullptr;
};

// One head of bias_rope_store's ops before the store: dst = RoPE(src + bias) for the first
// n_rot dims, src + bias for the rest; cs: the position's {cos, sin} pairs.
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

// The cluster barrier's arrive has release and its wait acquire semantics at cluster scope
// (PTX barrier.cluster defaults), which covers the scratch writes the other blocks of the
// cluster read after it: no __threadfence() (a GPU-wide fence, ~1 us) before it.
__device__ __forceinline__ void dec_cluster_sync(int C) {
  if (C > 1) {
    cg::this_cluster().sync();
  } else {
    __syncthreads();
  }
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// q, k_cache and v_cache are not __restrict__: with ROPE the kernel writes q (rp.q_out) and this
// token's cache rows (rp.k_cache / v_cache) through other pointers; plain coherent loads also
// measured faster here than the read-only path restrict allows.
template <class KV, bool ROPE>
__global__ void __launch_bounds__(kDecThreads)
    ex_attn_decode_kernel(const float* q, const typename KV::T* k_cache,
                          const typename KV::T* v_cache, float* __restrict__ scratch,
                          float* __restrict__ out, int n_head, int group, int hd, int kv_dim,
                          size_t stride, int cap_max, int C, int local_keys, float kq_scale,
                          const int32_t* __restrict__ d_n_past, ActBuf act, int act_mode,
                          DecRope<typename KV::T> rp) {
  using T = typename KV::T;
  __shared__ float qs[kDecMaxHd];  // the query as KQ reads it
  // ROPE: the rotated q (the q output) and this token's K and V rows as stored.
  __shared__ float qr[ROPE ? kDecMaxHd : 1];
  __shared__ float knew[ROPE ? kDecMaxHd : 1];
  __shared__ float vnew[ROPE ? kDecMaxHd : 1];
  __shared__ float r32[32 * kDecMaxHd];
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ float sh_inv;
  // Local mode (n_att <= local_keys): every block of the cluster computes all scores, exps
  // and block sums itself, here; no data crosses blocks.
  __shared__ float sc_l[kDecLocalKeys];
  __shared__ float bs_l[kDecLocalKeys / 16];
  const int h = blockIdx.x / C, r = blockIdx.x % C, g = h / group;
  const int tid = threadIdx.x;
  // Before the wait: n_past (the step's io, written by a copy before the step's first kernel)
  // and L2 prefetches of the cache rows below n_past this block reads (K rows of its keys, the
  // V rows of the same keys: the cluster's blocks together cover every key), which earlier
  // steps wrote; nothing this kernel's predecessors may still write.
  const int n_past = d_n_past[0];
  const int n_att = n_past + 1;
  const int nb = (n_att + 15) / 16;
  const int cap = (n_att + 63) & ~63;
  const bool local = n_att <= local_keys;  // uniform over the grid
  // This block's share of the cluster's 16-blocks of keys, [s_lo, s_hi); it computes the
  // scores of all of them (local) or of its share, and prefetches its share either way (the
  // other blocks' loads then hit L2).
  const int per = (nb + C - 1) / C;
  const int s_lo = min(nb, r * per), s_hi = min(nb, r * per + per);
  const int b_lo = local ? 0 : s_lo, b_hi = local ? nb : s_hi;
  const int j_lo = 16 * b_lo, j_hi = min(n_att, 16 * b_hi);
  {
    const int p_lo = 16 * s_lo, p_hi = min(n_att, 16 * s_hi);
    const size_t go = static_cast<size_t>(g) * hd;
    for (int j = p_lo + tid; j < min(p_hi, n_past); j += kDecThreads) {
      prefetch_l2(k_cache + static_cast<size_t>(j) * kv_dim + go);
      prefetch_l2(v_cache + static_cast<size_t>(j) * kv_dim + go);
    }
  }
  griddep_wait();
  const float* qh = q + static_cast<size_t>(h) * hd;
  // Keys below n_cached are read from the cache; (ROPE) key n_past from knew / vnew.
  const int n_cached = ROPE ? n_past : n_att;
  if constexpr (ROPE) {
    const float2* cs = rp.table + static_cast<size_t>(n_past) * (rp.n_rot / 2);
    const size_t go = static_cast<size_t>(g) * hd;
    dec_rope_head(qh, rp.bq != nullptr ? rp.bq + static_cast<size_t>(h) * hd : nullptr, cs, hd,
                  rp.n_rot, rp.neox, qr);
    dec_rope_head(rp.k_new + go, rp.bk != nullptr ? rp.bk + go : nullptr, cs, hd, rp.n_rot, rp.neox,
                  knew);
    for (int d = tid; d < hd; d += kDecThreads) {
      float x = rp.v_new[go + d];
      if (rp.bv != nullptr) x = x + rp.bv[go + d];
      vnew[d] = x;
    }
    __syncthreads();
    const bool store = r == 0 && h % group == 0;  // one block per KV group
    const size_t row = static_cast<size_t>(n_past) * kv_dim + go;
    for (int d = tid; d < hd; d += kDecThreads) {  // element d: this thread only
      qs[d] = KV::query(qr[d]);
      const T kb = KV::store(knew[d]), vb = KV::store(vnew[d]);
      knew[d] = KV::load(kb);
      vnew[d] = KV::load(vb);
      if (store) {
        rp.k_cache[row + d] = kb;
        rp.v_cache[row + d] = vb;
      }
    }
  } else {
    for (int i = tid; i < hd; i += kDecThreads) qs[i] = KV::query(qh[i]);
  }
  __syncthreads();
  // Scores, exps and block sums: this block's shared arrays (local mode) or the head's scratch
  // (scores, then block sums, then C <= 8 block maxima in the 16 spare floats).
  float* const hs = scratch + static_cast<size_t>(h) * stride;
  float* const sc = local ? sc_l : hs;
  float* const bs = local ? bs_l : hs + cap_max;
  float* const pmax = hs + cap_max + cap_max / 16 + 1;  // exchange mode only
  // Reads of them: other blocks wrote the scratch (through L2); the shared ones are this block's.
  const auto ld = [local](const float* p) { return local ? *p : __ldcg(p); };
  // Local mode with a cluster: the blocks' reads of q are done; the q output is written after
  // the wait at the end.
  const bool split_barrier = ROPE && local && C > 1;
  if (split_barrier) asm volatile("barrier.cluster.arrive;" ::: "memory");
  // 1. scores of this block's keys
  const T* kbase = k_cache + static_cast<size_t>(g) * hd;
  float mx = -INFINITY;
  for (int j = j_lo + tid; j < j_hi; j += kDecThreads) {
    const float d = ROPE && j >= n_cached
                        ? KV::kq_vec(knew, qs, hd, false)
                        : KV::kq_vec(kbase + static_cast<size_t>(j) * kv_dim, qs, hd, true);
    const float s = d * kq_scale;
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, shf);
  if (!local) {  // the max of the cluster's block maxima (exact in any order)
    if (tid == 0) pmax[r] = mx;
    dec_cluster_sync(C);
    mx = -INFINITY;
    for (int i = 0; i < C; ++i) mx = fmaxf(mx, __ldcg(pmax + i));
  }
  // 2. exps and 16-block sums of this block's keys
  for (int b = b_lo + tid; b < b_hi; b += kDecThreads) {
    float e[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * b + i;
      e[i] = j < n_att ? math::expf_ggml(ld(sc + j) - mx) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) sc[16 * b + i] = e[i];
    bs[b] = math::hsum16(e);
  }
  if (local) {
    __syncthreads();
  } else {
    dec_cluster_sync(C);
  }
  double s = 0.0;
  for (int b = tid; b < nb; b += kDecThreads) s += static_cast<double>(ld(bs + b));
  s = math::block_sum_double(s, shd);
  float inv;
  if (!math::softmax_inv_certain(s, nb, &inv)) {  // uniform over the block (and the cluster)
    if (tid == 0) {
      double qd = 0.0;  // the CPU's order: block sums added one by one
      for (int b = 0; b < nb; ++b) qd += static_cast<double>(ld(bs + b));
      sh_inv = math::softmax_inv(qd);
    }
    __syncthreads();
    inv = sh_inv;
  }
  // 3. KQV for dims [d_lo, d_lo + dn): task (l, d), l < 32, runs chains l and l + 32.
  const int dper = (hd + C - 1) / C;
  const int d_lo = min(hd, r * dper), dn = min(hd, d_lo + dper) - d_lo;
  const T* vbase = v_cache + static_cast<size_t>(g) * hd + d_lo;
  const int full = n_cached & ~63;
  for (int task = tid; task < 32 * dn; task += kDecThreads) {
    const int dl = task % dn, l = task / dn;
    const T* vcol = vbase + dl;
    float a0 = 0.0f, a1 = 0.0f;  // chains l and l + 32
    int base = 0;
    // Whole 64-key groups of cached keys: no bounds checks, so the loads of several groups
    // are in flight together.
#pragma unroll 8
    for (; base < full; base += 64) {
      const size_t j0 = static_cast<size_t>(base + l), j1 = j0 + 32;
      a0 = fmaf(KV::load(vcol[j0 * kv_dim]), KV::prob(ld(sc + j0), inv), a0);
      a1 = fmaf(KV::load(vcol[j1 * kv_dim]), KV::prob(ld(sc + j1), inv), a1);
    }
    for (; base < cap; base += 64) {  // the last group (at most one)
      const int j0 = base + l, j1 = j0 + 32;
      float v0 = 0.0f, v1 = 0.0f;  // cache rows at or beyond n_cached are never read
      if (j0 < n_att) {
        v0 = ROPE && j0 >= n_cached ? vnew[d_lo + dl]
                                    : KV::load(vcol[static_cast<size_t>(j0) * kv_dim]);
      }
      if (j1 < n_att) {
        v1 = ROPE && j1 >= n_cached ? vnew[d_lo + dl]
                                    : KV::load(vcol[static_cast<size_t>(j1) * kv_dim]);
      }
      // Beyond n_att: the CPU's zero-padded values times zero weights.
      a0 = j0 < n_att ? fmaf(v0, KV::prob(ld(sc + j0), inv), a0) : fmaf(0.0f, 0.0f, a0);
      a1 = j1 < n_att ? fmaf(v1, KV::prob(ld(sc + j1), inv), a1) : fmaf(0.0f, 0.0f, a1);
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
    if (act_mode == static_cast<int>(ActType::F32)) {
      act.f[oi] = o;
    } else if (act_mode == static_cast<int>(ActType::F16)) {
      act.f[oi] = math::act_round_fp16(o);
    } else if (act_mode == static_cast<int>(ActType::BF16)) {
      act.f[oi] = math::act_round_bf16(o);
    }
  }
  if constexpr (ROPE) {
    // bias_rope_store's q output (it may be q itself), once every block of the head's cluster
    // has read q: after the cluster barriers of exchange mode, the split barrier of local
    // mode, or (one block per head) this block's own barriers.
    if (split_barrier) asm volatile("barrier.cluster.wait;" ::: "memory");
    if (r == 0) {
      for (int i = tid; i < hd; i += kDecThreads) rp.q_out[static_cast<size_t>(h) * hd + i] = qr[i];
    }
  }
}

__global__ void ex_f16_bits_kernel(const float* __restrict__ x, uint16_t* __restrict__ y,
                                   size_t n) {
  griddep_wait();
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] = math::f2h(x[i]);
  }
}

// ---- host side ----------------------------------------------------------------------------

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

// Blocks per head of the decode kernel: enough to spread the heads over the SMs (14 heads:
// 8 -> 112 blocks), a power of two <= 8 (the portable cluster size). WORKER_EXACT_ATTN_CLUSTER
// (1, 2, 4 or 8) overrides it (A/B measurements; 1 launches without clusters), and
// set_decode_cluster_for_tests both.
int g_cluster_for_tests = 0;
int g_local_keys_for_tests = -1;  // -1: local_keys_of<KV>()
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

// The decode kernel's act_mode for quantize_act(weight_type) of the output: the element-wise
// roundings (F32 / F16 / BF16); kDecActNone for the block quantizations (Q8_0, Q8_K), which
// run as quantize_act after the kernel.
int dec_act_mode(uint32_t weight_type) {
  const ActType a = act_type_of(weight_type);
  return a == ActType::Q8_0 || a == ActType::Q8_K ? kDecActNone : static_cast<int>(a);
}

template <class KV>
void launch_decode(const float* q, const typename KV::T* k_cache, const typename KV::T* v_cache,
                   float* out, const AttnShape& s, int n_ctx, const int32_t* d_n_past,
                   float* scratch, cudaStream_t stream, const ActBuf& act = ActBuf{},
                   int act_mode = kDecActNone, const DecRope<typename KV::T>* rope = nullptr) {
  const int cluster = decode_cluster(s.n_head);
  static_assert(local_keys_of<KV>() <= kDecLocalKeys, "the decode kernel's local arrays");
  const int local_keys = g_local_keys_for_tests >= 0 ? g_local_keys_for_tests : local_keys_of<KV>();
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
    cuda_check(
        cudaLaunchKernelEx(&cfg, ex_attn_decode_kernel<KV, true>, q, k_cache, v_cache, scratch, out,
                           s.n_head, group, hd, kv_dim, lay.stride, lay.cap_max, cluster,
                           local_keys, kq_scale, d_n_past, act, act_mode, *rope),
        name, __FILE__, __LINE__);
  } else {
    cuda_check(cudaLaunchKernelEx(&cfg, ex_attn_decode_kernel<KV, false>, q, k_cache, v_cache,
                                  scratch, out, s.n_head, group, hd, kv_dim, lay.stride,
                                  lay.cap_max, cluster, local_keys, kq_scale, d_n_past, act,
                                  act_mode, DecRope<typename KV::T>{}),
               name, __FILE__, __LINE__);
  }
  CUDA_CHECK_LAUNCH(name);
}

// bias_rope_store + attend_act: at decode one launch (+ quantize_act for the block
// quantizations, which have no fused form).
template <class T>
void rope_attend_act(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
                     const int32_t* d_n_past, T* k_cache, T* v_cache, float* out, int n_ctx,
                     float* scratch, uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  check_shape(s, "exact::attention");
  if (n_tok <= 0) return;
  const int mode = dec_act_mode(act_type);
  if (n_tok == 1 && s.head_dim <= kDecMaxHd) {
    DecRope<T> rp;
    rp.k_new = x.k;
    rp.v_new = x.v;
    rp.bq = x.bq;
    rp.bk = x.bk;
    rp.bv = x.bv;
    rp.table = reinterpret_cast<const float2*>(rope_table);
    rp.n_rot = s.n_rot;
    rp.neox = s.neox ? 1 : 0;
    rp.q_out = x.q;
    rp.k_cache = k_cache;
    rp.v_cache = v_cache;
    launch_decode<typename KvOf<T>::type>(x.q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch,
                                          stream, a, mode, &rp);
    if (mode == kDecActNone) quantize_act(act_type, out, 1, s.n_head * s.head_dim, a, stream);
    return;
  }
  bias_rope_store(x, s, rope_table, n_tok, d_n_past, k_cache, v_cache, stream);
  attend_act<T>(x.q, k_cache, v_cache, out, n_tok, s, n_ctx, d_n_past, scratch, act_type, a,
                stream);
}

}  // namespace

size_t attention_scratch_floats(int n_ctx, int max_tok, int n_head) {
  const ScratchLayout l = scratch_layout(n_ctx, max_tok, n_head);
  return l.stride * static_cast<size_t>(n_head) * static_cast<size_t>(l.chunk);
}

template <class T>
void bias_rope_store(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
                     const int32_t* d_n_past, T* k_cache, T* v_cache, cudaStream_t stream) {
  check_shape(s, "exact::bias_rope_store");
  if (n_tok <= 0) return;
  launch_pdl("ex_bias_rope_store_kernel", ex_bias_rope_store_kernel<typename KvOf<T>::type>,
             dim3(n_tok, s.n_head + 2 * s.n_head_kv), dim3(kRopeThreads), stream, x.q, x.k, x.v,
             x.bq, x.bk, x.bv, s.n_head, s.n_head_kv, s.head_dim, s.n_rot, s.neox ? 1 : 0,
             reinterpret_cast<const float2*>(rope_table), d_n_past, k_cache, v_cache);
  CUDA_CHECK_LAUNCH("ex_bias_rope_store_kernel");
}

template <class T>
void attend(const float* q, const T* k_cache, const T* v_cache, float* out, int n_tok,
            const AttnShape& s, int n_ctx, const int32_t* d_n_past, float* scratch,
            cudaStream_t stream) {
  using KV = typename KvOf<T>::type;
  check_shape(s, "exact::attend");
  if (n_tok <= 0) return;
  if (n_tok == 1 && s.head_dim <= kDecMaxHd) {  // decode: one launch
    launch_decode<KV>(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch, stream);
    return;
  }
  const ScratchLayout lay = scratch_layout(n_ctx, n_tok, s.n_head);
  const int hd = s.head_dim, kv_dim = s.n_head_kv * hd, group = s.n_head / s.n_head_kv;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto scores = KV::kq_tiny(hd, n_tok) ? ex_attn_scores_kernel<KV, KV::kTinyKq>
                                             : ex_attn_scores_kernel<KV, false>;
  const bool kqv_tiny = math::kqv_tiny(hd, n_tok);
  for (int t0 = 0; t0 < n_tok; t0 += lay.chunk) {
    const int nc = std::min(lay.chunk, n_tok - t0);
    const int pairs = nc * s.n_head;
    // Enough score blocks to fill the GPU at decode (one token, few heads), independent of
    // n_past: each block strides over the keys.
    const int splits = std::clamp((4 * 132 + pairs - 1) / pairs, 1, 16);
    launch_pdl_smem("ex_attn_scores_kernel", scores, dim3(pairs, splits), dim3(kScoreThreads),
                    static_cast<size_t>(hd) * sizeof(float), stream, q, k_cache, scratch, t0,
                    s.n_head, group, hd, kv_dim, lay.stride, kq_scale, d_n_past);
    CUDA_CHECK_LAUNCH("ex_attn_scores_kernel");
    launch_pdl("ex_attn_softmax_kernel", ex_attn_softmax_kernel, dim3(pairs), dim3(kSoftmaxThreads),
               stream, scratch, t0, s.n_head, lay.stride, lay.cap_max, d_n_past);
    CUDA_CHECK_LAUNCH("ex_attn_softmax_kernel");
    if (kqv_tiny) {
      constexpr int kL = 16, kD = 32;
      launch_pdl("ex_attn_kqv_kernel", ex_attn_kqv_kernel<KV, kL, kD>,
                 dim3(pairs, (hd + kD - 1) / kD), dim3(kL * kD), stream, v_cache, scratch, out, t0,
                 s.n_head, group, hd, kv_dim, lay.stride, lay.cap_max, n_tok, d_n_past);
    } else {
      constexpr int kL = 64, kD = 8;
      launch_pdl("ex_attn_kqv_kernel", ex_attn_kqv_kernel<KV, kL, kD>,
                 dim3(pairs, (hd + kD - 1) / kD), dim3(kL * kD), stream, v_cache, scratch, out, t0,
                 s.n_head, group, hd, kv_dim, lay.stride, lay.cap_max, n_tok, d_n_past);
    }
    CUDA_CHECK_LAUNCH("ex_attn_kqv_kernel");
  }
}

template <class T>
void attend_act(const float* q, const T* k_cache, const T* v_cache, float* out, int n_tok,
                const AttnShape& s, int n_ctx, const int32_t* d_n_past, float* scratch,
                uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  check_shape(s, "exact::attend_act");
  if (n_tok <= 0) return;
  const int mode = dec_act_mode(act_type);
  if (n_tok == 1 && s.head_dim <= kDecMaxHd && mode != kDecActNone) {
    launch_decode<typename KvOf<T>::type>(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch,
                                          stream, a, mode);
    return;
  }
  attend(q, k_cache, v_cache, out, n_tok, s, n_ctx, d_n_past, scratch, stream);
  quantize_act(act_type, out, n_tok, s.n_head * s.head_dim, a, stream);
}

void attention(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
               const int32_t* d_n_past, const KvCache& kv, float* out, int n_ctx, float* scratch,
               uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  switch (kv.type) {
    case KvType::F32:
      return rope_attend_act(x, s, rope_table, n_tok, d_n_past, static_cast<float*>(kv.k),
                             static_cast<float*>(kv.v), out, n_ctx, scratch, act_type, a, stream);
    case KvType::F16:
      return rope_attend_act(x, s, rope_table, n_tok, d_n_past, static_cast<uint16_t*>(kv.k),
                             static_cast<uint16_t*>(kv.v), out, n_ctx, scratch, act_type, a,
                             stream);
  }
}

#define ATTN_EXACT_INSTANTIATE(T)                                                               \
  template void bias_rope_store<T>(const QkvIn&, const AttnShape&, const float*, int,           \
                                   const int32_t*, T*, T*, cudaStream_t);                       \
  template void attend<T>(const float*, const T*, const T*, float*, int, const AttnShape&, int, \
                          const int32_t*, float*, cudaStream_t);                                \
  template void attend_act<T>(const float*, const T*, const T*, float*, int, const AttnShape&,  \
                              int, const int32_t*, float*, uint32_t, const ActBuf&, cudaStream_t);
ATTN_EXACT_INSTANTIATE(float)
ATTN_EXACT_INSTANTIATE(uint16_t)
#undef ATTN_EXACT_INSTANTIATE

void set_decode_cluster_for_tests(int cluster) {
  if (cluster != 0 && cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) {
    throw WorkerError(ErrorCode::Internal, "set_decode_cluster_for_tests: 0, 1, 2, 4 or 8");
  }
  g_cluster_for_tests = cluster;
}

void set_decode_local_keys_for_tests(int keys) {
  if (keys < -1 || keys > kDecLocalKeys) {
    throw WorkerError(ErrorCode::Internal,
                      "set_decode_local_keys_for_tests: -1 .. " + std::to_string(kDecLocalKeys));
  }
  g_local_keys_for_tests = keys;
}

void device_f16_bits_for_tests(const float* x, uint16_t* y, size_t n) {
  launch_pdl("ex_f16_bits_kernel", ex_f16_bits_kernel, dim3(1024), dim3(256), cudaStream_t{}, x, y,
             n);
  CUDA_CHECK_LAUNCH("ex_f16_bits_kernel");
}

}  // namespace worker::kern::exact
