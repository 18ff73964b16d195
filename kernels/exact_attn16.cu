// Exact attention over an FP16 KV cache (exact.cuh: bias_rope_store_f16, attention_f16): bit
// for bit the CPU reference's F16-KV mode (CpuEngineOptions::kv_f16, cpu::attention_head_f16),
// itself bit-identical with llama.cpp's CPU backend with type_k = type_v = F16 and no flash
// attention (reports/cpu-parity.md, "F16 KV cache"). Per-thread math in exact_attn16_math.cuh
// (shared with the host emulation test); the structure follows exact_ops.cu's F32 kernels
// (copied here, not shared, so that file can change independently).
//
// Orders reproduced, and why each is exact:
//  - bias_rope_store_f16: q/k/v + bias (one add), the RoPE pair rotation
//    d0 = fma(x0, c, -(x1*s)), d1 = fma(x0, s, x1*c) (math::rope_pair, cos/sin from the host
//    table built by the CPU engine's own code), then K and V stored as fp16 with
//    __float2half_rn (round to nearest even, as the CPU's fp32_to_fp16 and ggml's
//    _mm512_cvtps_ph(.., _MM_FROUND_TO_NEAREST_INT) in set_rows). Element-wise: exact.
//  - attention_f16, three kernels per chunk of tokens (also for one token):
//    scores: one thread per (token, head, key): the query head rounded to fp16 (mul_mat's
//      conversion of its F32 operand to F16), then attn16::kq_tiny16 (16 FMA chains + hsum16,
//      tinyBLAS F16 x F16: a batch of >= 2 tokens with head_dim % 16 == 0) or
//      attn16::kq_vecdot16 (ggml_vec_dot_f16: 64 chains, reduce, leftovers in double), literally
//      the CPU's loops; times kq_scale.
//    softmax: as exact_ops.cu's (max; ggml_expf per key, zero beyond n_att up to the
//      16-padding; hsum16 per 16-block by one thread; the block sums in a double tree with the
//      certainty check on inv = float(1/sum) and the CPU's sequential sum as fallback, see
//      exact_ops_math.cuh tree_sum_slack): the same floats as the F32 mode's softmax.
//    KQV: weight p_j = fp16(e_j * inv) (attn16::prob16); the CPU's dot over the keys is 16
//      (tinyBLAS: batch >= 2, head_dim % 4 == 0, over n_att rounded up to 16) or 64
//      (vec_dot_f16 over cap = n_past + n_tok rounded up to 64: a multiple of 64, so no
//      leftovers and its double step is an identity) independent FMA chains; one thread runs
//      one chain of one output dim (fp16 V converted exactly, same FMAs in the same order,
//      FMAs of zeros in the padding as the CPU's zero-filled buffers), then one thread per dim
//      combines the chains in the CPU's tree (hsum16 / vecdot_reduce64).
// Launch geometry never depends on n_past (read from device memory): the decode step can be a
// replayed CUDA graph. No atomics; every result is computed in one fixed order.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include <cooperative_groups.h>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_attn16_math.cuh"
#include "exact_ops_math.cuh"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

namespace a16 = attn16;
namespace cg = cooperative_groups;

// Block-wide double sum (fixed tree: warp butterflies, then the warps' sums); every thread
// gets the same bits. `sh` holds >= 32. (exact_ops.cu's, copied.)
__device__ __forceinline__ double a16_block_sum_double(double v, double* sh) {
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

// ---- bias + RoPE + fp16 KV store ---------------------------------------------------------

constexpr int kRopeThreads = 64;

__global__ void __launch_bounds__(kRopeThreads)
    a16_bias_rope_store_kernel(float* __restrict__ q, const float* __restrict__ k,
                               const float* __restrict__ v, const float* __restrict__ bq,
                               const float* __restrict__ bk, const float* __restrict__ bv,
                               int n_head, int n_head_kv, int hd, int n_rot, int neox,
                               const float2* __restrict__ rope,
                               const int32_t* __restrict__ d_n_past, uint16_t* __restrict__ k_cache,
                               uint16_t* __restrict__ v_cache) {
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
  uint16_t* cdst = nullptr;
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
      cdst[d] = a16::f2h(x);
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

// ---- attention ---------------------------------------------------------------------------

constexpr int kScoreThreads = 128;
constexpr int kSoftmaxThreads = 256;
constexpr size_t kScratchBudget = size_t{1} << 24;  // floats per chunk of tokens (64 MiB)

// Per (token of the chunk, head): scores / exps [cap_max], 16-block sums [cap_max / 16], inv
// (1 float, padded to 16).
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

template <bool TINY>
__global__ void __launch_bounds__(kScoreThreads)
    a16_scores_kernel(const float* __restrict__ q, const uint16_t* __restrict__ k_cache,
                      float* __restrict__ scratch, int t0, int n_head, int group, int hd,
                      int kv_dim, size_t stride, float kq_scale,
                      const int32_t* __restrict__ d_n_past) {
  extern __shared__ float qs[];  // hd floats: the query head rounded to fp16
  const int tc = blockIdx.x / n_head, h = blockIdx.x % n_head, t = t0 + tc, g = h / group;
  griddep_wait();
  const int n_att = d_n_past[0] + t + 1;
  const float* qh = q + static_cast<size_t>(t) * n_head * hd + static_cast<size_t>(h) * hd;
  for (int i = threadIdx.x; i < hd; i += kScoreThreads) qs[i] = a16::round_f16(qh[i]);
  __syncthreads();
  float* sc = scratch + (static_cast<size_t>(tc) * n_head + h) * stride;
  const uint16_t* kbase = k_cache + static_cast<size_t>(g) * hd;
  for (int j = blockIdx.y * kScoreThreads + threadIdx.x; j < n_att;
       j += gridDim.y * kScoreThreads) {
    const uint16_t* kr = kbase + static_cast<size_t>(j) * kv_dim;
    const float s = TINY ? a16::kq_tiny16(kr, qs, hd) : a16::kq_vecdot16(kr, qs, hd);
    sc[j] = s * kq_scale;
  }
}

__global__ void __launch_bounds__(kSoftmaxThreads)
    a16_softmax_kernel(float* __restrict__ scratch, int t0, int n_head, size_t stride, int cap_max,
                       const int32_t* __restrict__ d_n_past) {
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
  s = a16_block_sum_double(s, shd);  // its __syncthreads also publish bs[] to the block
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

// out[d] = sum over keys of v[j][d] * fp16(e[j] * inv) as LANES independent FMA chains (lane l
// takes keys l, l + LANES, ...) over `len` keys, combined in the CPU's tree. Thread (l, dl):
// chain l of dim d0 + dl. LANES 64: vec_dot_f16 over cap = (n_past + n_tok) rounded up to 64;
// LANES 16: tinyBLAS over n_att rounded up to 16.
template <int LANES, int DCH>
__global__ void __launch_bounds__(LANES* DCH)
    a16_kqv_kernel(const uint16_t* __restrict__ v_cache, const float* __restrict__ scratch,
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
    const uint16_t* vcol = v_cache + static_cast<size_t>(g) * hd + d;
    int j = l;
#pragma unroll 4
    for (; j < n_att; j += LANES) {
      const float p = a16::prob16(e[j], inv);
      acc = fmaf(a16::h2f(vcol[static_cast<size_t>(j) * kv_dim]), p, acc);
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

// ---- attention, one token (decode): one launch -------------------------------------------
//
// a16_decode_kernel: a cluster of C blocks per head (C = 1: one block), all three phases in
// one launch, bit for bit the three kernels above for n_tok == 1 (KQ and KQV by vec_dot_f16):
//  1. scores: block r of the cluster takes the keys of 16-blocks [b_lo, b_hi) (one thread per
//     key, attn16::kq_vecdot16 on the fp16-rounded query) and its max; cluster barrier; the max
//     of the C block maxima (max: exact in any order).
//  2. exps of its own 16-blocks and their hsum16; cluster barrier; every block sums all block
//     sums in the softmax kernel's tree (256 threads, thread k summing blocks k, k + 256, ...,
//     then the block's double tree), the same certainty check and sequential fallback: every
//     block gets the CPU's inv.
//  3. KQV for its share of the dims: 64 FMA chains per dim over cap = n_att rounded up to 64
//     keys (vec_dot_f16's order; weights fp16(e * inv); zero FMAs in the padding), one thread
//     running chains l and l + 32 (l < 32) of a dim and adding them (vecdot_reduce64's first
//     level), then per dim the second level and hsum16: vecdot_reduce64 exactly (float + is
//     commutative).
// Scores and exps live in the scratch (token 0's slots of the batch layout), read across blocks
// only after a cluster barrier (__threadfence, then the cluster barrier's release / acquire)
// and through L2 (__ldcg). Geometry: n_head * C blocks, independent of n_past.

constexpr int kDecThreads = 256;
constexpr int kDecMaxHd = 256;
constexpr int kDecMaxCluster = 8;
static_assert(kDecThreads == kSoftmaxThreads, "the decode kernel reproduces the softmax tree");

__device__ __forceinline__ void a16_cluster_sync(int C) {
  if (C > 1) {
    __threadfence();
    cg::this_cluster().sync();
  } else {
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kDecThreads)
    a16_decode_kernel(const float* __restrict__ q, const uint16_t* __restrict__ k_cache,
                      const uint16_t* __restrict__ v_cache, float* __restrict__ scratch,
                      float* __restrict__ out, int n_head, int group, int hd, int kv_dim,
                      size_t stride, int cap_max, int C, float kq_scale,
                      const int32_t* __restrict__ d_n_past) {
  __shared__ float qs[kDecMaxHd];
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
  for (int i = tid; i < hd; i += kDecThreads) qs[i] = a16::round_f16(qh[i]);
  __syncthreads();
  float* sc = scratch + static_cast<size_t>(h) * stride;
  float* bs = sc + cap_max;
  float* pmax = bs + cap_max / 16 + 1;  // C <= 8 slots after inv's (the 16 spare floats)
  const int per = (nb + C - 1) / C;
  const int b_lo = min(nb, r * per), b_hi = min(nb, b_lo + per);
  const int j_lo = 16 * b_lo, j_hi = min(n_att, 16 * b_hi);
  // 1. scores of this block's keys
  const uint16_t* kbase = k_cache + static_cast<size_t>(g) * hd;
  float mx = -INFINITY;
  for (int j = j_lo + tid; j < j_hi; j += kDecThreads) {
    const float s = a16::kq_vecdot16(kbase + static_cast<size_t>(j) * kv_dim, qs, hd) * kq_scale;
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, shf);
  if (tid == 0) pmax[r] = mx;
  a16_cluster_sync(C);
  mx = -INFINITY;
  for (int i = 0; i < C; ++i) mx = fmaxf(mx, __ldcg(pmax + i));
  // 2. exps and 16-block sums of this block's keys
  for (int b = b_lo + tid; b < b_hi; b += kDecThreads) {
    float e[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * b + i;
      e[i] = j < n_att ? math::expf_ggml(__ldcg(sc + j) - mx) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) sc[16 * b + i] = e[i];
    bs[b] = math::hsum16(e);
  }
  a16_cluster_sync(C);
  double s = 0.0;
  for (int b = tid; b < nb; b += kDecThreads) s += static_cast<double>(__ldcg(bs + b));
  s = a16_block_sum_double(s, shd);
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
  const uint16_t* vbase = v_cache + static_cast<size_t>(g) * hd + d_lo;
  for (int task = tid; task < 32 * dn; task += kDecThreads) {
    const int dl = task % dn, l = task / dn;
    const uint16_t* vcol = vbase + dl;
    float a0 = 0.0f, a1 = 0.0f;  // chains l and l + 32
    for (int base = 0; base < cap; base += 64) {
      const int j0 = base + l, j1 = j0 + 32;
      // Beyond n_att: the CPU's zero-padded values times zero weights.
      a0 = j0 < n_att ? fmaf(a16::h2f(vcol[static_cast<size_t>(j0) * kv_dim]),
                             a16::prob16(__ldcg(sc + j0), inv), a0)
                      : fmaf(0.0f, 0.0f, a0);
      a1 = j1 < n_att ? fmaf(a16::h2f(vcol[static_cast<size_t>(j1) * kv_dim]),
                             a16::prob16(__ldcg(sc + j1), inv), a1)
                      : fmaf(0.0f, 0.0f, a1);
    }
    r32[l * dn + dl] = a0 + a1;  // vecdot_reduce64's first level: acc[l] + acc[32 + l]
  }
  __syncthreads();
  for (int dl = tid; dl < dn; dl += kDecThreads) {
    float rr[16];  // second level: (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l])
#pragma unroll
    for (int i = 0; i < 16; ++i) rr[i] = r32[i * dn + dl] + r32[(i + 16) * dn + dl];
    out[static_cast<size_t>(h) * hd + d_lo + dl] = math::hsum16(rr);
  }
}

__global__ void a16_f16_bits_kernel(const float* __restrict__ x, uint16_t* __restrict__ y,
                                    size_t n) {
  griddep_wait();
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] = a16::f2h(x[i]);
  }
}

void check_shape16(const AttnShape& s, const char* what) {
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0 || s.head_dim <= 0 ||
      s.n_rot < 0 || s.n_rot > s.head_dim || s.n_rot % 2 != 0) {
    throw WorkerError(ErrorCode::Internal, std::string(what) + ": bad attention shape (n_head " +
                                               std::to_string(s.n_head) + ", n_head_kv " +
                                               std::to_string(s.n_head_kv) + ", head_dim " +
                                               std::to_string(s.head_dim) + ", n_rot " +
                                               std::to_string(s.n_rot) + ")");
  }
}

// Blocks per head of the decode kernel: enough to spread the heads over the SMs (14 heads: 8 ->
// 112 blocks), a power of two <= 8 (the portable cluster size).
int decode_cluster16(int n_head) {
  int c = kDecMaxCluster;
  while (c > 1 && n_head * c > 160) c /= 2;
  return c;
}

void launch_decode16(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, float* out,
                     const AttnShape& s, int n_ctx, const int32_t* d_n_past, float* scratch,
                     int cluster, cudaStream_t stream) {
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
  const char* name = "a16_decode_kernel";
  if (pdl_enabled() && !pdl_skipped(name)) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  cuda_check(
      cudaLaunchKernelEx(&cfg, a16_decode_kernel, q, k_cache, v_cache, scratch, out, s.n_head,
                         group, hd, kv_dim, lay.stride, lay.cap_max, cluster, kq_scale, d_n_past),
      name, __FILE__, __LINE__);
  CUDA_CHECK_LAUNCH(name);
}

}  // namespace

namespace attn16 {
void attention_f16_decode_for_tests(const float* q, const uint16_t* k_cache,
                                    const uint16_t* v_cache, float* out, int n_head, int n_head_kv,
                                    int head_dim, int n_ctx, const int32_t* d_n_past,
                                    float* scratch, int cluster) {
  AttnShape s;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.head_dim = head_dim;
  s.n_rot = 0;
  check_shape16(s, "attention_f16_decode_for_tests");
  if (head_dim > kDecMaxHd || (cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8)) {
    throw WorkerError(ErrorCode::Internal, "attention_f16_decode_for_tests: unsupported shape");
  }
  launch_decode16(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch, cluster, cudaStream_t{});
}

void device_f16_bits_for_tests(const float* x, uint16_t* y, size_t n) {
  launch_pdl("a16_f16_bits_kernel", a16_f16_bits_kernel, dim3(1024), dim3(256), cudaStream_t{}, x,
             y, n);
  CUDA_CHECK_LAUNCH("a16_f16_bits_kernel");
}
}  // namespace attn16

void bias_rope_store_f16(float* q, const float* k, const float* v, const float* bq, const float* bk,
                         const float* bv, const AttnShape& s, const float* rope_table, int n_tok,
                         const int32_t* d_n_past, uint16_t* k_cache, uint16_t* v_cache,
                         cudaStream_t stream) {
  check_shape16(s, "exact::bias_rope_store_f16");
  if (n_tok <= 0) return;
  launch_pdl("a16_bias_rope_store_kernel", a16_bias_rope_store_kernel,
             dim3(n_tok, s.n_head + 2 * s.n_head_kv), dim3(kRopeThreads), stream, q, k, v, bq, bk,
             bv, s.n_head, s.n_head_kv, s.head_dim, s.n_rot, s.neox ? 1 : 0,
             reinterpret_cast<const float2*>(rope_table), d_n_past, k_cache, v_cache);
  CUDA_CHECK_LAUNCH("a16_bias_rope_store_kernel");
}

size_t attention_f16_scratch_floats(int n_ctx, int max_tok, int n_head) {
  const ScratchLayout l = scratch_layout(n_ctx, max_tok, n_head);
  return l.stride * static_cast<size_t>(n_head) * static_cast<size_t>(l.chunk);
}

void attention_f16(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, float* out,
                   int n_tok, const AttnShape& s, int n_ctx, const int32_t* d_n_past,
                   float* scratch, cudaStream_t stream) {
  check_shape16(s, "exact::attention_f16");
  if (n_tok <= 0) return;
  if (n_tok == 1 && s.head_dim <= kDecMaxHd) {  // decode: one launch
    launch_decode16(q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch,
                    decode_cluster16(s.n_head), stream);
    return;
  }
  const ScratchLayout lay = scratch_layout(n_ctx, n_tok, s.n_head);
  const int hd = s.head_dim, kv_dim = s.n_head_kv * hd, group = s.n_head / s.n_head_kv;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // cpu::kq16_tiny / kqv16_tiny: llamafile's F16 x F16 tinyBLAS takes the batch's KQ when
  // head_dim % 16 == 0 and its KQV when head_dim % 4 == 0 (n_tok >= 2); else vec_dot_f16.
  const bool kq_tiny = n_tok >= 2 && hd % 16 == 0;
  const bool kqv_tiny = n_tok >= 2 && hd % 4 == 0;
  for (int t0 = 0; t0 < n_tok; t0 += lay.chunk) {
    const int nc = std::min(lay.chunk, n_tok - t0);
    const int pairs = nc * s.n_head;
    // Enough score blocks to fill the GPU at decode (one token, few heads), independent of
    // n_past: each block strides over the keys.
    const int splits = std::clamp((4 * 132 + pairs - 1) / pairs, 1, 16);
    const size_t smem = static_cast<size_t>(hd) * sizeof(float);
    if (kq_tiny) {
      launch_pdl_smem("a16_scores_kernel", a16_scores_kernel<true>, dim3(pairs, splits),
                      dim3(kScoreThreads), smem, stream, q, k_cache, scratch, t0, s.n_head, group,
                      hd, kv_dim, lay.stride, kq_scale, d_n_past);
    } else {
      launch_pdl_smem("a16_scores_kernel", a16_scores_kernel<false>, dim3(pairs, splits),
                      dim3(kScoreThreads), smem, stream, q, k_cache, scratch, t0, s.n_head, group,
                      hd, kv_dim, lay.stride, kq_scale, d_n_past);
    }
    CUDA_CHECK_LAUNCH("a16_scores_kernel");
    launch_pdl("a16_softmax_kernel", a16_softmax_kernel, dim3(pairs), dim3(kSoftmaxThreads), stream,
               scratch, t0, s.n_head, lay.stride, lay.cap_max, d_n_past);
    CUDA_CHECK_LAUNCH("a16_softmax_kernel");
    if (kqv_tiny) {
      constexpr int kL = 16, kD = 32;
      launch_pdl("a16_kqv_kernel", a16_kqv_kernel<kL, kD>, dim3(pairs, (hd + kD - 1) / kD),
                 dim3(kL * kD), stream, v_cache, scratch, out, t0, s.n_head, group, hd, kv_dim,
                 lay.stride, lay.cap_max, n_tok, d_n_past);
    } else {
      constexpr int kL = 64, kD = 8;
      launch_pdl("a16_kqv_kernel", a16_kqv_kernel<kL, kD>, dim3(pairs, (hd + kD - 1) / kD),
                 dim3(kL * kD), stream, v_cache, scratch, out, t0, s.n_head, group, hd, kv_dim,
                 lay.stride, lay.cap_max, n_tok, d_n_past);
    }
    CUDA_CHECK_LAUNCH("a16_kqv_kernel");
  }
}

}  // namespace worker::kern::exact
