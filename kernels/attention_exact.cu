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
//  - attend, three kernels per chunk of tokens; a score / KQV block takes the rows (head, token)
//    of several heads of one KV group and several tokens, so that each K row / V element it
//    loads serves all of them (the arithmetic per row is unchanged):
//    scores: one thread per key: the query as KV::query, then KV::kq_vec (the 64 FMA chains of
//      ggml_vec_dot, its reduce tree and its leftovers) or KV::kq_tiny16 (tinyBLAS F16, 16
//      chains + hsum16), literally the CPU's loops; times kq_scale.
//    softmax: one warp per (token, head): max (order-free), ggml_expf per key (0 beyond n_att
//      up to the 16-padding), hsum16 per 16-block (one lane per block, the CPU's tree). The
//      CPU adds those block sums sequentially in double; here a double butterfly, with a
//      certainty check on inv = float(1/sum) (math::softmax_inv_certain: any order of the sum
//      rounds alike) and the sequential sum as fallback; then the weights KV::prob(e, inv)
//      written over the exps. The same floats for both cache types.
//    KQV: the CPU's dot over the keys is 64 (vec_dot over cap = n_past + n_tok rounded up to
//      64) or 16 (tinyBLAS: a batch, head_dim % 4 == 0, over n_att rounded up to 16)
//      independent FMA chains; one thread runs one chain of 4 output dims for every row of its
//      block (same FMAs, same order, FMAs of zeros in the padding as the CPU's zero-filled
//      buffers), then the chains are combined in the CPU's tree (vecdot_reduce64 / hsum16).
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
#include "attention_exact_decode.cuh"
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
// Tokens a block (threadIdx.y): one (token, head) a block was ~9,000 blocks of one round trip
// each for a 512-token prompt (13.4 us a layer on the H200).
constexpr int kRopeTokens = 4;
constexpr int kRopeBlock = kRopeThreads * kRopeTokens;

template <class KV>
__global__ void __launch_bounds__(kRopeBlock)
    ex_bias_rope_store_kernel(float* __restrict__ q, const float* __restrict__ k,
                              const float* __restrict__ v, const float* __restrict__ bq,
                              const float* __restrict__ bk, const float* __restrict__ bv,
                              int n_head, int n_head_kv, int hd, int n_rot, int neox,
                              const float2* __restrict__ rope, const int32_t* __restrict__ d_n_past,
                              typename KV::T* __restrict__ k_cache,
                              typename KV::T* __restrict__ v_cache, int n_tok) {
  const int t = static_cast<int>(blockIdx.x * kRopeTokens + threadIdx.y);
  const int hy = blockIdx.y;
  if (t >= n_tok) return;  // no block barriers below
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
constexpr size_t kScratchBudget = size_t{1} << 24;  // floats per chunk of tokens (64 MiB)

// Per (token of the chunk, head): scores, then exps, then the KQV weights [cap_max]; 16-block
// sums [cap_max / 16]; 16 more floats (the decode kernel keeps its blocks' maxima there).
// n_keys: the most keys a row attends to (n_past + n_tok for a prompt batch, n_ctx for the
// decode step, whose graph replays at every position).
struct ScratchLayout {
  int cap_max = 0;  // n_keys rounded up to 64
  size_t stride = 0;
  int chunk = 1;  // tokens per launch group
};
ScratchLayout scratch_layout(int n_keys, int n_tok, int n_head) {
  ScratchLayout l;
  l.cap_max = (n_keys + 63) & ~63;
  l.stride = static_cast<size_t>(l.cap_max) + static_cast<size_t>(l.cap_max) / 16 + 16;
  const size_t per_tok = l.stride * static_cast<size_t>(n_head);
  const size_t fit = std::max<size_t>(1, kScratchBudget / per_tok);
  l.chunk = static_cast<int>(std::min<size_t>(fit, static_cast<size_t>(std::max(1, n_tok))));
  return l;
}

// ---- prompt batches: blocks of (head, token) rows sharing the group's K / V reads ---------
//
// A block of the scores and KQV kernels takes `hn` heads of one KV group (h0 ..) times `tn`
// consecutive tokens of the chunk (tc0 ..): its rows r = tt * hn + hh (token-major). Every key
// row (scores) and V element (KQV) it loads serves all its rows; the arithmetic per (row, key)
// and per (row, dim) is the same as one row at a time.
struct Tiles {
  int hb = 1;    // heads per block (<= group)
  int n_hc = 1;  // head chunks per group
  int nt = 1;    // tokens per block
  int n_tiles = 1;
  int n_kv = 1;
  int blocks() const { return n_tiles * n_kv * n_hc; }
};
Tiles make_tiles(int group, int n_kv, int nc, int rows) {
  Tiles t;
  t.hb = std::min(group, rows);
  t.n_hc = (group + t.hb - 1) / t.hb;
  t.nt = std::max(1, rows / t.hb);
  t.n_tiles = (nc + t.nt - 1) / t.nt;
  t.n_kv = n_kv;
  return t;
}
struct TileRows {
  int g, h0, hn, tc0, tn;
  __device__ int rows() const { return hn * tn; }
};
__device__ __forceinline__ TileRows tile_rows(const Tiles& tl, int group, int nc) {
  const int bx = static_cast<int>(blockIdx.x);
  // The last tokens' tiles first: they see the most keys (causal), so the longest blocks start
  // in the first wave instead of finishing the launch alone.
  const int tile = tl.n_tiles - 1 - bx / (tl.n_kv * tl.n_hc), rem = bx % (tl.n_kv * tl.n_hc);
  TileRows r;
  r.g = rem / tl.n_hc;
  const int hc = rem % tl.n_hc;
  r.h0 = r.g * group + hc * tl.hb;
  r.hn = min(tl.hb, group - hc * tl.hb);
  r.tc0 = tile * tl.nt;
  r.tn = min(tl.nt, nc - r.tc0);
  return r;
}

constexpr int kScoreRows = 16;  // rows per score block at most

// Scores: one thread per key (blockIdx.y splits the keys), the key row converted once (into
// registers when HD > 0, the head size known at compile time), then scored against every row
// of the block whose token sees it (the query rows staged in shared memory as KV::query).
// The dot is KV::kq_tiny16 (tinyBLAS F16) or KV::kq_vec (vec_dot): the CPU's loops; times
// kq_scale.
template <class KV, bool TINY, int HD>
__global__ void __launch_bounds__(kScoreThreads)
    ex_attn_scores_kernel(const float* __restrict__ q, const typename KV::T* __restrict__ k_cache,
                          float* __restrict__ scratch, int t0, int nc, Tiles tl, int n_head,
                          int group, int hd, int kv_dim, size_t stride, float kq_scale,
                          const int32_t* __restrict__ d_n_past) {
  extern __shared__ __align__(16) float qs[];  // rows x hd
  __shared__ int row_off[kScoreRows];          // the rows' scratch offsets (< 2^31)
  const TileRows tr = tile_rows(tl, group, nc);
  const int R = tr.rows();
  if (threadIdx.x < R) {
    const int r = static_cast<int>(threadIdx.x);
    row_off[r] = static_cast<int>(
        (static_cast<size_t>(tr.tc0 + r / tr.hn) * n_head + tr.h0 + r % tr.hn) * stride);
  }
  griddep_wait();
  const int base = d_n_past[0] + t0 + tr.tc0;  // n_att of row token tt = base + tt + 1
  for_each_batched<kScoreThreads>(
      R * hd,
      [&](int i) {
        const int r = i / hd, e = i % hd;
        const int t = t0 + tr.tc0 + r / tr.hn, h = tr.h0 + r % tr.hn;
        return q[static_cast<size_t>(t) * n_head * hd + static_cast<size_t>(h) * hd + e];
      },
      [&](int i, float v) { qs[i] = KV::query(v); });
  __syncthreads();
  const typename KV::T* kbase = k_cache + static_cast<size_t>(tr.g) * hd;
  const int n_att_max = base + tr.tn;
  for (int j = blockIdx.y * kScoreThreads + threadIdx.x; j < n_att_max;
       j += gridDim.y * kScoreThreads) {
    const typename KV::T* kr = kbase + static_cast<size_t>(j) * kv_dim;
    float kf[HD > 0 ? HD : 1];
    if constexpr (HD > 0) math::load_row<HD>(kr, math::aligned16(kr), kf);
    // Rows whose token sees key j: tt >= j - base.
    for (int r = max(0, j - base) * tr.hn; r < R; ++r) {
      const float* qr = qs + static_cast<size_t>(r) * (HD > 0 ? HD : hd);
      float s;
      if constexpr (HD > 0) {
        if constexpr (TINY) {
          s = KV::kq_tiny16(static_cast<const float*>(kf), qr, HD);
        } else {
          s = KV::kq_vec(static_cast<const float*>(kf), qr, HD, false);
        }
      } else if constexpr (TINY) {
        s = KV::kq_tiny16(kr, qr, hd);
      } else {
        s = KV::kq_vec(kr, qr, hd, true);
      }
      scratch[row_off[r] + j] = s * kq_scale;
    }
  }
}

// Softmax, one warp per (token, head) row: max (order-free), ggml_expf per key (0 beyond n_att
// up to the 16-padding), hsum16 per 16-block (one lane per block, the CPU's tree); the block
// sums added in a double butterfly with a certainty check on inv (the CPU adds them one by one
// in double; sequential fallback), then the scores row overwritten by the KQV weights
// KV::prob(e, inv). Lane l takes the 16-blocks l, l + 32, ... (16-byte loads; the row stride
// is a multiple of 4 floats); the blocks of the first round (rows of up to 512 keys) stay in
// registers from the one load to the one store, later ones are read again. (Two rounds in
// registers: 82 registers a thread, 24 warps an SM, 16.6 us a layer at 512 tokens on the H200
// against 12.0 with one.)
constexpr int kSoftmaxWarps = 8;
constexpr int kSoftmaxRegRounds = 1;

// The 16 values of 16-block b of a scores row (-inf at keys >= n_att and for blocks >= nb).
__device__ __forceinline__ void softmax_load16(const float* sc, int b, int nb, int n_att,
                                               float (&v)[16]) {
  if (b < nb) {
    const float4* p = reinterpret_cast<const float4*>(sc + 16 * b);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 f = p[q];
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (16 * b + i >= n_att) v[i] = -INFINITY;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = -INFINITY;
  }
}

__device__ __forceinline__ void softmax_store16(float* sc, int b, const float (&v)[16]) {
  float4* p = reinterpret_cast<float4*>(sc + 16 * b);
#pragma unroll
  for (int q = 0; q < 4; ++q)
    p[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

template <class KV>
__global__ void __launch_bounds__(32 * kSoftmaxWarps)
    ex_attn_softmax_kernel(float* __restrict__ scratch, int t0, int n_rows, int n_head,
                           size_t stride, int cap_max, const int32_t* __restrict__ d_n_past) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int row = static_cast<int>(blockIdx.x) * kSoftmaxWarps + static_cast<int>(threadIdx.x) / 32;
  griddep_wait();
  if (row >= n_rows) return;  // the whole warp; no block barriers below
  const int n_att = d_n_past[0] + t0 + row / n_head + 1;
  const int nb = (n_att + 15) / 16;
  const int rounds = (nb + 31) / 32;
  float* sc = scratch + static_cast<size_t>(row) * stride;  // row = tc * n_head + h
  float* bs = sc + cap_max;
  float rv[kSoftmaxRegRounds][16];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kSoftmaxRegRounds; ++i) {
    softmax_load16(sc, 32 * i + lane, nb, n_att, rv[i]);
#pragma unroll
    for (int k = 0; k < 16; ++k) mx = fmaxf(mx, rv[i][k]);
  }
  for (int i = kSoftmaxRegRounds; i < rounds; ++i) {
    float v[16];
    softmax_load16(sc, 32 * i + lane, nb, n_att, v);
#pragma unroll
    for (int k = 0; k < 16; ++k) mx = fmaxf(mx, v[k]);
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
  double s = 0.0;
  // Block b's exps over its values in place (0 beyond n_att), its hsum16 into bs[b] and s.
  const auto exps = [&](int b, float(&v)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = 16 * b + i < n_att ? math::expf_ggml(v[i] - mx) : 0.0f;
    const float hs = math::hsum16(v);
    bs[b] = hs;
    s += static_cast<double>(hs);
  };
#pragma unroll
  for (int i = 0; i < kSoftmaxRegRounds; ++i) {
    if (32 * i + lane < nb) exps(32 * i + lane, rv[i]);
  }
  for (int i = kSoftmaxRegRounds; i < rounds; ++i) {
    const int b = 32 * i + lane;
    if (b < nb) {
      float v[16];
      softmax_load16(sc, b, nb, n_att, v);
      exps(b, v);
      softmax_store16(sc, b, v);
    }
  }
  // Butterfly: both partners add the same pair, so every lane ends with the same sum.
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  float inv;
  if (!math::softmax_inv_certain(s, nb, &inv)) {  // uniform over the warp
    __syncwarp();                                 // bs[] of every lane visible
    if (lane == 0) {
      double qd = 0.0;  // the CPU's order: block sums added one by one
      for (int b = 0; b < nb; ++b) qd += static_cast<double>(bs[b]);
      inv = math::softmax_inv(qd);
    }
    inv = __shfl_sync(0xffffffffu, inv, 0);
  }
  // The weights over each lane's blocks (the exps of the later rounds: this lane's stores).
#pragma unroll
  for (int i = 0; i < kSoftmaxRegRounds; ++i) {
    const int b = 32 * i + lane;
    if (b < nb) {
#pragma unroll
      for (int k = 0; k < 16; ++k) rv[i][k] = KV::prob(rv[i][k], inv);
      softmax_store16(sc, b, rv[i]);
    }
  }
  for (int i = kSoftmaxRegRounds; i < rounds; ++i) {
    const int b = 32 * i + lane;
    if (b < nb) {
      float v[16];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 f = reinterpret_cast<const float4*>(sc + 16 * b)[q];
        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = KV::prob(v[k], inv);
      softmax_store16(sc, b, v);
    }
  }
}

// KQV: out[d] = sum over keys j of v[j][d] * p[j] (p: the softmax kernel's weights) as LANES
// independent FMA chains (lane l takes keys l, l + LANES, ...) over `len` keys, combined in the
// CPU's tree: LANES 16, tinyBLAS over n_att rounded up to 16, hsum16; LANES 64, vec_dot over
// cap = (n_past + n_tok) rounded up to 64, vecdot_reduce64. Keys in [n_att, len) are FMAs of
// zeros, as the CPU's zero-filled buffers (they can still turn a -0 sum into +0).
// Thread (dq, l) runs chain l of 4 consecutive dims for every row of the block (4 x ROWS
// accumulators): one V load serves 4 x ROWS FMAs, one weight (staged in shared memory,
// kKqvKeys keys at a time) 4. The chains are then combined through shared memory. ROWS 16 for
// long batches, 4 for short ones (more blocks).
constexpr int kKqvThreads = 256;
constexpr int kKqvKeys = 256;  // keys per staged chunk (a multiple of 64): one a thread
static_assert(kKqvKeys == kKqvThreads, "the chunk's weights: one key a thread");
constexpr int kKqvAhead = 4;  // V rows in flight a thread (keys ahead of its FMAs)

template <int LANES, int ROWS>
struct KqvGeom {
  static constexpr int kDq = kKqvThreads / LANES;  // dim quads per pass
  static constexpr int kDims = 4 * kDq;            // dims per pass: 64 (LANES 16), 16 (64)
  static constexpr int kRound = (LANES == 16 ? 8 : 4) < ROWS ? (LANES == 16 ? 8 : 4) : ROWS;
  static constexpr int kStride = kDims + 4;  // floats per (row, lane): conflict-free
  static constexpr int kCombine = kRound * LANES * kStride;
  static constexpr int kStage = ROWS * kKqvKeys;
  static constexpr int kSmem = kCombine > kStage ? kCombine : kStage;
};

// V[j][d .. d + 3] as floats (0 for dims >= hd).
template <class KV>
__device__ __forceinline__ void load_v4(const typename KV::T* __restrict__ p, int d, int hd,
                                        float (&v)[4]) {
  using T = typename KV::T;
  if (d + 4 <= hd && (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T))) == 0) {
    if constexpr (sizeof(T) == 2) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
      v[0] = KV::load(static_cast<T>(u.x & 0xFFFFu));
      v[1] = KV::load(static_cast<T>(u.x >> 16));
      v[2] = KV::load(static_cast<T>(u.y & 0xFFFFu));
      v[3] = KV::load(static_cast<T>(u.y >> 16));
    } else {
      const float4 u = __ldg(reinterpret_cast<const float4*>(p));
      v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = d + k < hd ? KV::load(p[k]) : 0.0f;
}

// Key j's FMAs into every row's chains (p: the row weights of key j, kKqvKeys apart; v: its V
// elements). Rows whose token sees j (j <= base: all) take v * p; beyond, a row runs FMAs of
// zeros up to its padded length (tinyBLAS: n_att rounded up to 16; vec_dot: len_max) and none
// after.
template <int LANES, int ROWS>
__device__ __forceinline__ void kqv_key(const float* p, int j, int base, int len_max,
                                        const int (&row_att)[ROWS], const float (&v)[4],
                                        float (&acc)[ROWS][4]) {
  if (j <= base) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float pr = p[r * kKqvKeys];
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[r][k] = fmaf(v[k], pr, acc[r][k]);
    }
  } else {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int na = row_att[r];
      const int len = LANES == 64 ? len_max : ((na + 15) & ~15);
      if (j < len) {
        const bool in = j < na;
        const float pr = in ? p[r * kKqvKeys] : 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[r][k] = fmaf(in ? v[k] : 0.0f, pr, acc[r][k]);
      }
    }
  }
}

template <class KV, int LANES, int ROWS>
__global__ void __launch_bounds__(kKqvThreads)
    ex_attn_kqv_kernel(const typename KV::T* __restrict__ v_cache,
                       const float* __restrict__ scratch, float* __restrict__ out, int t0, int nc,
                       Tiles tl, int n_head, int group, int hd, int kv_dim, size_t stride,
                       int n_tok_total, const int32_t* __restrict__ d_n_past) {
  using Geo = KqvGeom<LANES, ROWS>;
  __shared__ __align__(16) float sm[Geo::kSmem];
  __shared__ int row_att[ROWS], row_off[ROWS];
  const TileRows tr = tile_rows(tl, group, nc);
  const int R = tr.rows();
  const int l = static_cast<int>(threadIdx.x) % LANES, dq = static_cast<int>(threadIdx.x) / LANES;
  griddep_wait();
  const int n_past = d_n_past[0];
  const int base = n_past + t0 + tr.tc0;  // keys j <= base are seen by every row
  const int n_att_max = base + tr.tn;
  const int len_max = LANES == 64 ? ((n_past + n_tok_total + 63) & ~63) : ((n_att_max + 15) & ~15);
  if (threadIdx.x < ROWS) {
    const int r = static_cast<int>(threadIdx.x), tt = r / tr.hn;
    row_att[r] = r < R ? base + tt + 1 : 0;  // offsets < 2^24 (kScratchBudget)
    row_off[r] = r < R
                     ? static_cast<int>(
                           (static_cast<size_t>(tr.tc0 + tt) * n_head + tr.h0 + r % tr.hn) * stride)
                     : 0;
  }
  const typename KV::T* vbase = v_cache + static_cast<size_t>(tr.g) * hd;
  for (int d0 = 0; d0 < hd; d0 += Geo::kDims) {
    const int d = d0 + 4 * dq;  // this thread's dims d .. d + 3 (those < hd)
    float acc[ROWS][4];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[r][k] = 0.0f;
    }
    for (int c0 = 0; c0 < len_max; c0 += kKqvKeys) {
      __syncthreads();  // row tables written; the previous chunk's / combine's readers done
      const int c1 = min(c0 + kKqvKeys, len_max), ncol = c1 - c0;
      {  // the chunk's weights: thread jj takes key c0 + jj of every row, loads before stores
        const int jj = static_cast<int>(threadIdx.x);
        float pv[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          pv[r] = jj < ncol && c0 + jj < row_att[r] ? scratch[row_off[r] + c0 + jj] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) sm[r * kKqvKeys + jj] = pv[r];
      }
      __syncthreads();
      // V rows kKqvAhead keys ahead in registers (zeros at keys >= n_att_max): the loads fly
      // during the FMAs of the keys before. ncol is a multiple of LANES: every lane runs n_it.
      const int vend = min(c1, n_att_max), n_it = ncol / LANES;
      float vr[kKqvAhead][4];
#pragma unroll
      for (int u = 0; u < kKqvAhead; ++u) {
        const int j = c0 + l + u * LANES;
#pragma unroll
        for (int k = 0; k < 4; ++k) vr[u][k] = 0.0f;
        if (j < vend) load_v4<KV>(vbase + static_cast<size_t>(j) * kv_dim + d, d, hd, vr[u]);
      }
      for (int i0 = 0; i0 < n_it; i0 += kKqvAhead) {
#pragma unroll
        for (int u = 0; u < kKqvAhead; ++u) {
          if (i0 + u >= n_it) break;
          const int j = c0 + l + (i0 + u) * LANES, jn = j + kKqvAhead * LANES;
          float v[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) v[k] = vr[u][k], vr[u][k] = 0.0f;
          if (jn < vend) load_v4<KV>(vbase + static_cast<size_t>(jn) * kv_dim + d, d, hd, vr[u]);
          kqv_key<LANES, ROWS>(sm + (j - c0), j, base, len_max, row_att, v, acc);
        }
      }
    }
    // Combine the LANES chains of each (row, dim), kRound rows at a time.
#pragma unroll
    for (int r0 = 0; r0 < ROWS; r0 += Geo::kRound) {
      if (r0 >= R) break;  // uniform
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < Geo::kRound; ++rr) {
        *reinterpret_cast<float4*>(sm + (rr * LANES + l) * Geo::kStride + 4 * dq) =
            make_float4(acc[r0 + rr][0], acc[r0 + rr][1], acc[r0 + rr][2], acc[r0 + rr][3]);
      }
      __syncthreads();
      for (int i = threadIdx.x; i < Geo::kRound * Geo::kDims; i += kKqvThreads) {
        const int rr = i / Geo::kDims, c = i % Geo::kDims, r = r0 + rr, dd = d0 + c;
        if (r >= R || dd >= hd) continue;
        float a[LANES];
#pragma unroll
        for (int k = 0; k < LANES; ++k) a[k] = sm[(rr * LANES + k) * Geo::kStride + c];
        const float res = LANES == 64 ? math::vecdot_reduce64(a) : math::hsum16(a);
        const int t = t0 + tr.tc0 + r / tr.hn, h = tr.h0 + r % tr.hn;
        out[static_cast<size_t>(t) * n_head * hd + static_cast<size_t>(h) * hd + dd] = res;
      }
    }
  }
}

// ---- attention, one token (decode): one launch (attention_exact_decode.cuh) ------------

// Block blockIdx.x % C of head blockIdx.x / C; a hardware cluster of C blocks when C > 1.
// Dynamic shared memory: DecSmem, then the K / V stage (dec_kv_stage_bytes, or none).
template <class KV, bool ROPE>
__global__ void __launch_bounds__(kDecThreads)
    ex_attn_decode_kernel(DecArgs<typename KV::T> a, int C) {
  extern __shared__ __align__(16) uint8_t dsm[];
  auto& sm = *reinterpret_cast<DecSmem*>(dsm);
  uint32_t* const kst =
      dec_kv_stage_bytes<KV>() != 0 ? reinterpret_cast<uint32_t*>(dsm + sizeof(DecSmem)) : nullptr;
  const int blk = static_cast<int>(blockIdx.x);
  attn_decode_block<KV, ROPE>(
      a, blk / C, blk % C, C, true, sm, kst, false,
      [qkv = dec_ld_l2<ROPE>(a, blk / C)] {
        griddep_wait();
        return qkv;
      },
      [](int) {}, [C] { dec_cluster_sync(C); }, dec_put(a));
}
static_assert(sizeof(DecSmem) % 16 == 0, "the key stage after DecSmem: 16-byte aligned");

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

template <class T>
DecArgs<T> dec_args(const float* q, const T* k_cache, const T* v_cache, float* out,
                    const AttnShape& s, int n_keys, const int32_t* d_n_past, float* scratch,
                    const ActBuf& act, int act_mode, const DecRope<T>& rope) {
  using KV = typename KvOf<T>::type;
  static_assert(local_keys_of<KV>() <= kDecLocalKeys, "the decode kernel's local arrays");
  const ScratchLayout lay = scratch_layout(n_keys, 1, s.n_head);
  DecArgs<T> a;
  a.q = q;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.scratch = scratch;
  a.out = out;
  a.n_head = s.n_head;
  a.group = s.n_head / s.n_head_kv;
  a.hd = s.head_dim;
  a.kv_dim = s.n_head_kv * s.head_dim;
  a.stride = lay.stride;
  a.cap_max = lay.cap_max;
  a.local_keys = g_local_keys_for_tests >= 0 ? g_local_keys_for_tests : local_keys_of<KV>();
  a.kq_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  a.d_n_past = d_n_past;
  a.act = act;
  a.act_mode = act_mode;
  a.rp = rope;
  return a;
}

template <class T>
DecRope<T> dec_rope(const QkvIn& x, const AttnShape& s, const float* rope_table, T* k_cache,
                    T* v_cache) {
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
  return rp;
}

template <class T, bool ROPE>
void launch_decode(const DecArgs<T>& a, cudaStream_t stream) {
  using KV = typename KvOf<T>::type;
  const int cluster = decode_cluster(a.n_head);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.n_head * cluster));
  cfg.blockDim = dim3(kDecThreads);
  constexpr size_t kSmem = sizeof(DecSmem) + dec_kv_stage_bytes<KV>();
  static const bool attr_set = [] {
    CUDA_CHECK(cudaFuncSetAttribute(ex_attn_decode_kernel<KV, ROPE>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSmem)));
    return true;
  }();
  (void)attr_set;
  cfg.dynamicSmemBytes = kSmem;
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
  cuda_check(cudaLaunchKernelEx(&cfg, ex_attn_decode_kernel<KV, ROPE>, a, cluster), name, __FILE__,
             __LINE__);
  CUDA_CHECK_LAUNCH(name);
}

// bias_rope_store + attend_act: at decode one launch (+ quantize_act for the block
// quantizations, which have no fused form).
template <class T>
void rope_attend_act(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
                     const int32_t* d_n_past, T* k_cache, T* v_cache, float* out, int n_keys,
                     float* scratch, uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  check_shape(s, "exact::attention");
  if (n_tok <= 0) return;
  const int mode = dec_act_mode(act_type);
  if (n_tok == 1 && s.head_dim <= kDecMaxHd) {
    launch_decode<T, true>(dec_args(x.q, k_cache, v_cache, out, s, n_keys, d_n_past, scratch, a,
                                    mode, dec_rope(x, s, rope_table, k_cache, v_cache)),
                           stream);
    if (mode == kDecActNone) quantize_act(act_type, out, 1, s.n_head * s.head_dim, a, stream);
    return;
  }
  bias_rope_store(x, s, rope_table, n_tok, d_n_past, k_cache, v_cache, stream);
  attend_act<T>(x.q, k_cache, v_cache, out, n_tok, s, n_keys, d_n_past, scratch, act_type, a,
                stream);
}

}  // namespace

template <class T>
DecArgs<T> decode_attention_args(const QkvIn& x, const AttnShape& s, const float* rope_table,
                                 const int32_t* d_n_past, T* k_cache, T* v_cache, float* out,
                                 int n_ctx, float* scratch, uint32_t act_type, const ActBuf& a) {
  check_shape(s, "exact::decode_attention_args");
  DecRope<T> rp = dec_rope(x, s, rope_table, k_cache, v_cache);
  rp.q_out = nullptr;
  return dec_args(x.q, k_cache, v_cache, out, s, n_ctx, d_n_past, scratch, a,
                  dec_act_mode(act_type), rp);
}
template DecArgs<float> decode_attention_args(const QkvIn&, const AttnShape&, const float*,
                                              const int32_t*, float*, float*, float*, int, float*,
                                              uint32_t, const ActBuf&);
template DecArgs<uint16_t> decode_attention_args(const QkvIn&, const AttnShape&, const float*,
                                                 const int32_t*, uint16_t*, uint16_t*, float*, int,
                                                 float*, uint32_t, const ActBuf&);

size_t attention_scratch_floats(int n_ctx, int max_tok, int n_head) {
  // Enough for scratch_layout(n_keys, n_tok) at every n_keys <= n_ctx, n_tok <= max_tok: a
  // layout uses per_tok(n_keys) * n_tok floats when they fit the budget, at most the budget
  // when it chunks, and one token's when even that is over it.
  const ScratchLayout l = scratch_layout(n_ctx, max_tok, n_head);
  const size_t per_tok = l.stride * static_cast<size_t>(n_head);
  const size_t all = per_tok * static_cast<size_t>(std::max(1, max_tok));
  return std::max(per_tok, std::min(all, kScratchBudget));
}

template <class T>
void bias_rope_store(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
                     const int32_t* d_n_past, T* k_cache, T* v_cache, cudaStream_t stream) {
  check_shape(s, "exact::bias_rope_store");
  if (n_tok <= 0) return;
  launch_pdl("ex_bias_rope_store_kernel", ex_bias_rope_store_kernel<typename KvOf<T>::type>,
             dim3((n_tok + kRopeTokens - 1) / kRopeTokens, s.n_head + 2 * s.n_head_kv),
             dim3(kRopeThreads, kRopeTokens), stream, x.q, x.k, x.v, x.bq, x.bk, x.bv, s.n_head,
             s.n_head_kv, s.head_dim, s.n_rot, s.neox ? 1 : 0,
             reinterpret_cast<const float2*>(rope_table), d_n_past, k_cache, v_cache, n_tok);
  CUDA_CHECK_LAUNCH("ex_bias_rope_store_kernel");
}

template <class T>
void attend(const float* q, const T* k_cache, const T* v_cache, float* out, int n_tok,
            const AttnShape& s, int n_keys, const int32_t* d_n_past, float* scratch,
            cudaStream_t stream) {
  using KV = typename KvOf<T>::type;
  check_shape(s, "exact::attend");
  if (n_tok <= 0) return;
  if (n_tok == 1 && s.head_dim <= kDecMaxHd) {  // decode: one launch
    launch_decode<T, false>(dec_args(q, k_cache, v_cache, out, s, n_keys, d_n_past, scratch,
                                     ActBuf{}, kDecActNone, DecRope<T>{}),
                            stream);
    return;
  }
  const ScratchLayout lay = scratch_layout(n_keys, n_tok, s.n_head);
  const int hd = s.head_dim, kv_dim = s.n_head_kv * hd, group = s.n_head / s.n_head_kv;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool kq_tiny = KV::kq_tiny(hd, n_tok);
  // The key row in registers for the common head size (the dot's loops then unroll fully).
  const auto scores = hd == 64 ? (kq_tiny ? ex_attn_scores_kernel<KV, KV::kTinyKq, 64>
                                          : ex_attn_scores_kernel<KV, false, 64>)
                               : (kq_tiny ? ex_attn_scores_kernel<KV, KV::kTinyKq, 0>
                                          : ex_attn_scores_kernel<KV, false, 0>);
  const bool kqv_tiny = math::kqv_tiny(hd, n_tok);
  // Rows per score block: few for short batches (more blocks, fewer dots a thread in series),
  // 16 for long ones (H100, 512 tokens: 16 rows 25.3k tok/s F16 prompt, 32 rows 25.1k, 64
  // rows 24.8k); the query rows <= 32 KiB of shared memory.
  const int score_rows = std::clamp(std::min(n_tok / 32, 8192 / hd), 1, kScoreRows);
  for (int t0 = 0; t0 < n_tok; t0 += lay.chunk) {
    const int nc = std::min(lay.chunk, n_tok - t0);
    const Tiles st = make_tiles(group, s.n_head_kv, nc, score_rows);
    // Enough score blocks to fill the GPU for short batches, independent of n_past: each
    // block strides over the keys.
    const int splits = std::clamp((4 * 132 + st.blocks() - 1) / st.blocks(), 1, 16);
    launch_pdl_smem("ex_attn_scores_kernel", scores, dim3(st.blocks(), splits), dim3(kScoreThreads),
                    static_cast<size_t>(st.hb * st.nt) * hd * sizeof(float), stream, q, k_cache,
                    scratch, t0, nc, st, s.n_head, group, hd, kv_dim, lay.stride, kq_scale,
                    d_n_past);
    CUDA_CHECK_LAUNCH("ex_attn_scores_kernel");
    const int n_rows = nc * s.n_head;
    launch_pdl("ex_attn_softmax_kernel", ex_attn_softmax_kernel<KV>,
               dim3((n_rows + kSoftmaxWarps - 1) / kSoftmaxWarps), dim3(32 * kSoftmaxWarps), stream,
               scratch, t0, n_rows, s.n_head, lay.stride, lay.cap_max, d_n_past);
    CUDA_CHECK_LAUNCH("ex_attn_softmax_kernel");
    const bool long_batch = nc >= 256;
    const Tiles kt = make_tiles(group, s.n_head_kv, nc, long_batch ? 16 : 4);
    const auto kqv =
        kqv_tiny ? (long_batch ? ex_attn_kqv_kernel<KV, 16, 16> : ex_attn_kqv_kernel<KV, 16, 4>)
                 : (long_batch ? ex_attn_kqv_kernel<KV, 64, 16> : ex_attn_kqv_kernel<KV, 64, 4>);
    launch_pdl("ex_attn_kqv_kernel", kqv, dim3(kt.blocks()), dim3(kKqvThreads), stream, v_cache,
               scratch, out, t0, nc, kt, s.n_head, group, hd, kv_dim, lay.stride, n_tok, d_n_past);
    CUDA_CHECK_LAUNCH("ex_attn_kqv_kernel");
  }
}

template <class T>
void attend_act(const float* q, const T* k_cache, const T* v_cache, float* out, int n_tok,
                const AttnShape& s, int n_keys, const int32_t* d_n_past, float* scratch,
                uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  check_shape(s, "exact::attend_act");
  if (n_tok <= 0) return;
  const int mode = dec_act_mode(act_type);
  if (n_tok == 1 && s.head_dim <= kDecMaxHd && mode != kDecActNone) {
    launch_decode<T, false>(
        dec_args(q, k_cache, v_cache, out, s, n_keys, d_n_past, scratch, a, mode, DecRope<T>{}),
        stream);
    return;
  }
  attend(q, k_cache, v_cache, out, n_tok, s, n_keys, d_n_past, scratch, stream);
  quantize_act(act_type, out, n_tok, s.n_head * s.head_dim, a, stream);
}

void attention(const QkvIn& x, const AttnShape& s, const float* rope_table, int n_tok,
               const int32_t* d_n_past, const KvCache& kv, float* out, int n_keys, float* scratch,
               uint32_t act_type, const ActBuf& a, cudaStream_t stream) {
  switch (kv.type) {
    case KvType::F32:
      return rope_attend_act(x, s, rope_table, n_tok, d_n_past, static_cast<float*>(kv.k),
                             static_cast<float*>(kv.v), out, n_keys, scratch, act_type, a, stream);
    case KvType::F16:
      return rope_attend_act(x, s, rope_table, n_tok, d_n_past, static_cast<uint16_t*>(kv.k),
                             static_cast<uint16_t*>(kv.v), out, n_keys, scratch, act_type, a,
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

size_t attention_scratch_used_for_tests(int n_keys, int n_tok, int n_head) {
  const ScratchLayout l = scratch_layout(n_keys, n_tok, n_head);
  return l.stride * static_cast<size_t>(n_head) * static_cast<size_t>(l.chunk);
}

void device_f16_bits_for_tests(const float* x, uint16_t* y, size_t n) {
  launch_pdl("ex_f16_bits_kernel", ex_f16_bits_kernel, dim3(1024), dim3(256), cudaStream_t{}, x, y,
             n);
  CUDA_CHECK_LAUNCH("ex_f16_bits_kernel");
}

}  // namespace worker::kern::exact
