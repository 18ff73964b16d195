#pragma once
// The exact decode attention of one head as a block-level device function, shared by
// ex_attn_decode_kernel (attention_exact.cu) and the persistent decode kernel
// (decode_step.cu). Bit for bit attention_exact.cu's three-kernel path for one token.
#include <cooperative_groups.h>
#include <stddef.h>
#include <stdint.h>

#include "act_round.cuh"
#include "attention_exact.cuh"
#include "attention_exact_math.cuh"
#include "common.cuh"

namespace worker::kern::exact {

// ---- attention, one token (decode): one launch -----------------------------------------
//
// attn_decode_block (ex_attn_decode_kernel, and the persistent decode kernel): a cluster of C
// blocks per head (C = 1: one block), bit for bit the three kernels above for n_tok == 1 (vec_dot
// orders for KQ and KQV):
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
//     sums in one tree (256 threads, thread k summing blocks k, k + 256, ..., then
//     block_sum_double), the prompt softmax's certainty check and sequential fallback: every
//     block gets the CPU's inv. (Local mode: the same from its own arrays.)
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
static_assert(kDecMaxHd <= kDecThreads, "dec_rope_qkv: one element of a head a thread");
// Up to local_keys_of<KV>() keys (n_past + 1) the decode kernel runs in local mode: each
// block of a head's cluster computes all scores and the softmax itself (the cluster's blocks
// then differ only in their share of KQV's output dims), no barriers across blocks, no scratch;
// beyond, the blocks split the keys and exchange maxima and sums through the scratch. The
// redundant score work grows with the context: the switch is where the two modes measured
// alike (bench/kernel_bench, H100, 0.5B shape: FP16 cache 6.8 vs 10.2 us at n_past 100, 10.0
// vs 11.3 at 500, 13.7 vs 13.1 at 1000; FP32 cache 7.3 vs 10.0 at 100, 12.0 vs 11.3 at 500).
constexpr int kDecLocalKeys = 768;  // the shared arrays' size: the larger of the two
// Keys a thread scores with all their rows loaded at once (local mode: kDecLocalKeys keys).
constexpr int kDecKeysAtOnce = (kDecLocalKeys + kDecThreads - 1) / kDecThreads;
template <class KV>
constexpr int local_keys_of() {
  return sizeof(typename KV::T) == 2 ? 768 : 384;
}
// Words of a staged FP16 key row of head_dim 64 (32 words of data, 4 of padding).
constexpr int kDecKeyRowWords = 36;
// The rounding of the output for the next matmul: an ActType, or kDecActNone.
constexpr int kDecActNone = -1;

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

// The projections q / k / v are read through L2 (ld.global.cg): in the persistent decode kernel
// other blocks of the same launch wrote them, and an SM's L1 may hold an earlier layer's values.
//
// One head's bias_rope_store ops before the store, for q (query head h) and k / v (its KV
// group at offset go): dst = RoPE(src + bias) for the first n_rot dims, src + bias for the
// rest; v + bias. cs: the position's {cos, sin} pairs. Every load (through L2: other blocks
// wrote q / k / v) is issued before the first is used: one memory round trip, not three.
// hd <= kDecThreads (kDecMaxHd): one element (or pair) a thread.
struct DecRopeSrc {
  const float *src, *bias;
  float* dst;
};
__device__ __forceinline__ void dec_rope_qkv(DecRopeSrc q, DecRopeSrc k, DecRopeSrc v,
                                             const float2* cs, int hd, int n_rot, int neox) {
  const int tid = static_cast<int>(threadIdx.x), half = n_rot / 2;
  const bool pair = tid < half, tail = n_rot + tid < hd, vt = tid < hd;
  const int i0 = neox ? tid : 2 * tid, i1 = neox ? tid + half : 2 * tid + 1, it = n_rot + tid;
  float q0 = 0.0f, q1 = 0.0f, k0 = 0.0f, k1 = 0.0f, qt = 0.0f, kt = 0.0f, vv = 0.0f;
  if (pair) {
    q0 = __ldcg(q.src + i0);
    q1 = __ldcg(q.src + i1);
    k0 = __ldcg(k.src + i0);
    k1 = __ldcg(k.src + i1);
  }
  if (tail) {
    qt = __ldcg(q.src + it);
    kt = __ldcg(k.src + it);
  }
  if (vt) vv = __ldcg(v.src + tid);
  if (pair) {
    const float2 c = cs[tid];
    const auto rot = [&](const DecRopeSrc& o, float x0, float x1) {
      if (o.bias != nullptr) {
        x0 = x0 + o.bias[i0];
        x1 = x1 + o.bias[i1];
      }
      float d0, d1;
      math::rope_pair(x0, x1, c.x, c.y, d0, d1);
      o.dst[i0] = d0;
      o.dst[i1] = d1;
    };
    rot(q, q0, q1);
    rot(k, k0, k1);
  }
  if (tail) {
    q.dst[it] = q.bias != nullptr ? qt + q.bias[it] : qt;
    k.dst[it] = k.bias != nullptr ? kt + k.bias[it] : kt;
  }
  if (vt) v.dst[tid] = v.bias != nullptr ? vv + v.bias[tid] : vv;
}

// The cluster barrier's arrive has release and its wait acquire semantics at cluster scope
// (PTX barrier.cluster defaults), which covers the scratch writes the other blocks of the
// cluster read after it: no __threadfence() (a GPU-wide fence, ~1 us) before it.
__device__ __forceinline__ void dec_cluster_sync(int C) {
  if (C > 1) {
    cooperative_groups::this_cluster().sync();
  } else {
    __syncthreads();
  }
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// The arguments of one head's decode attention (the kernel's parameters).
template <class T>
struct DecArgs {
  const float* q = nullptr;
  const T* k_cache = nullptr;
  const T* v_cache = nullptr;
  float* scratch = nullptr;
  float* out = nullptr;
  int n_head = 0, group = 1, hd = 0, kv_dim = 0;
  size_t stride = 0;
  int cap_max = 0, local_keys = 0;
  float kq_scale = 0.0f;
  const int32_t* d_n_past = nullptr;
  ActBuf act;
  int act_mode = kDecActNone;
  DecRope<T> rp;
};

// The shared memory of one block of the decode attention.
struct DecSmem {
  float qs[kDecMaxHd];  // the query as KQ reads it
  // ROPE: the rotated q (the q output) and this token's K and V rows as stored.
  float qr[kDecMaxHd];
  float knew[kDecMaxHd];
  float vnew[kDecMaxHd];
  union {
    float r32[32 * kDecMaxHd];  // KQV's partial chains
    // The scores' FP16 key rows (head_dim 64), kDecThreads at a time, padded to
    // kDecKeyRowWords words so that a quarter warp's 16-byte reads of 8 rows hit distinct banks.
    uint32_t krows[kDecThreads * kDecKeyRowWords];
  };
  float shf[32];
  double shd[32];
  float sh_inv;
  // Local mode (n_att <= local_keys): every block of the cluster computes all scores, exps
  // and block sums itself, here; no data crosses blocks.
  float sc_l[kDecLocalKeys];
  float bs_l[kDecLocalKeys / 16];
};

// q, k_cache and v_cache are not __restrict__: with ROPE the block writes q (rp.q_out) and this
// token's cache rows (rp.k_cache / v_cache) through other pointers; plain coherent loads also
// measured faster here than the read-only path restrict allows.
//
// Block r (< C) of head h. `wait()` is called once, after the loads of data no earlier op of
// the step writes (n_past, L2 prefetches of cache rows below n_past) and before anything an
// earlier op wrote is read: griddep_wait() in ex_attn_decode_kernel, the persistent decode
// kernel's barrier there. `hw_cluster`: the C blocks of the head are a hardware cluster
// (C > 1); without one, C > 1 is allowed in local mode only (the blocks exchange nothing),
// and rp.q_out must then be nullptr (no block may write q while another reads it).
// `mark(k)` is called by every thread after phase k (profiling: 0 RoPE, 1 scores, 2 exps,
// 3 the softmax sum, 4 KQV).
template <class KV, bool ROPE, class Wait, class Mark>
__device__ __forceinline__ void attn_decode_block(const DecArgs<typename KV::T>& a, int h, int r,
                                                  int C, bool hw_cluster, DecSmem& sm, Wait&& wait,
                                                  Mark&& mark) {
  using T = typename KV::T;
  float* const qs = sm.qs;
  float* const qr = sm.qr;
  float* const knew = sm.knew;
  float* const vnew = sm.vnew;
  float* const r32 = sm.r32;
  float* const sc_l = sm.sc_l;
  float* const bs_l = sm.bs_l;
  const float* const q = a.q;
  const T* const k_cache = a.k_cache;
  const T* const v_cache = a.v_cache;
  float* const scratch = a.scratch;
  float* const out = a.out;
  const int hd = a.hd, kv_dim = a.kv_dim, group = a.group;
  const int g = h / group;
  const DecRope<T>& rp = a.rp;
  const int tid = threadIdx.x;
  // Before the wait: n_past (the step's io, written by a copy before the step's first kernel)
  // and L2 prefetches of the cache rows below n_past this block reads (K rows of its keys, the
  // V rows of the same keys: the cluster's blocks together cover every key), which earlier
  // steps wrote; nothing this kernel's predecessors may still write.
  const int n_past = a.d_n_past[0];
  const int n_att = n_past + 1;
  const int nb = (n_att + 15) / 16;
  const int cap = (n_att + 63) & ~63;
  const bool local = n_att <= a.local_keys;  // uniform over the grid
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
  wait();
  const float* qh = q + static_cast<size_t>(h) * hd;
  // Keys below n_cached are read from the cache; (ROPE) key n_past from knew / vnew.
  const int n_cached = ROPE ? n_past : n_att;
  if constexpr (ROPE) {
    const float2* cs = rp.table + static_cast<size_t>(n_past) * (rp.n_rot / 2);
    const size_t go = static_cast<size_t>(g) * hd;
    dec_rope_qkv({qh, rp.bq != nullptr ? rp.bq + static_cast<size_t>(h) * hd : nullptr, qr},
                 {rp.k_new + go, rp.bk != nullptr ? rp.bk + go : nullptr, knew},
                 {rp.v_new + go, rp.bv != nullptr ? rp.bv + go : nullptr, vnew}, cs, hd, rp.n_rot,
                 rp.neox);
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
    for (int i = tid; i < hd; i += kDecThreads) qs[i] = KV::query(__ldcg(qh + i));
  }
  __syncthreads();
  mark(0);
  // Scores, exps and block sums: this block's shared arrays (local mode) or the head's scratch
  // (scores, then block sums, then C <= 8 block maxima in the 16 spare floats).
  float* const hs = scratch + static_cast<size_t>(h) * a.stride;
  float* const sc = local ? sc_l : hs;
  float* const bs = local ? bs_l : hs + a.cap_max;
  float* const pmax = hs + a.cap_max + a.cap_max / 16 + 1;  // exchange mode only
  // Reads of them: other blocks wrote the scratch (through L2); the shared ones are this block's.
  const auto ld = [local](const float* p) { return local ? *p : __ldcg(p); };
  // Local mode with a cluster: the blocks' reads of q are done; the q output is written after
  // the wait at the end.
  const bool split_barrier = ROPE && local && C > 1 && hw_cluster;
  if (split_barrier) asm volatile("barrier.cluster.arrive;" ::: "memory");
  // 1. scores of this block's keys
  const T* kbase = k_cache + static_cast<size_t>(g) * hd;
  float mx = -INFINITY;
  const auto score = [&](int j, float d) {
    const float s = d * a.kq_scale;
    sc[j] = s;
    mx = fmaxf(mx, s);
  };
  if (sizeof(T) == 2 && hd == 64 && j_hi - j_lo <= kDecKeysAtOnce * kDecThreads &&
      math::aligned16(kbase) && kv_dim % 8 == 0) {
    // FP16 cache, head_dim 64, at most kDecKeysAtOnce keys a thread (local mode): every load
    // of the block's key rows is issued before the first is used (one memory round trip, not
    // one a key), coalesced (8 threads a 128-byte row: a warp's 16-byte loads touch 4 lines,
    // where a thread a row touched 32: 8x the L1 wavefronts), then staged kDecThreads rows at
    // a time in shared memory, where each thread runs KvF16::kq_vec's arithmetic on its own
    // key: 64 chains of one FMA each and vecdot_reduce64.
    uint4 kr[kDecKeysAtOnce][8];
    const int prow = tid >> 3, pc = tid & 7;  // this thread's 16 bytes: rows prow + 32 i
#pragma unroll
    for (int t = 0; t < kDecKeysAtOnce; ++t) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int j = j_lo + t * kDecThreads + prow + 32 * i;
        kr[t][i] = make_uint4(0u, 0u, 0u, 0u);
        if (j < j_hi && j < n_cached) {
          kr[t][i] =
              __ldg(reinterpret_cast<const uint4*>(kbase + static_cast<size_t>(j) * kv_dim) + pc);
        }
      }
    }
    uint32_t* const krows = sm.krows;
#pragma unroll
    for (int t = 0; t < kDecKeysAtOnce; ++t) {
      const int j0 = j_lo + t * kDecThreads;
      if (j0 >= j_hi) break;  // uniform over the block
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        *reinterpret_cast<uint4*>(krows + (prow + 32 * i) * kDecKeyRowWords + 4 * pc) = kr[t][i];
      }
      __syncthreads();
      const int j = j0 + tid;
      if (j < j_hi) {
        if (ROPE && j >= n_cached) {
          score(j, KV::kq_vec(knew, qs, hd, false));
        } else {
          const uint32_t* row = krows + tid * kDecKeyRowWords;
          float acc[64];
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            const uint4 w4 = *reinterpret_cast<const uint4*>(row + 4 * c);
            const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int l = 8 * c + 2 * i;
              acc[l] = fmaf(math::h2f(static_cast<uint16_t>(w[i] & 0xFFFFu)), qs[l], 0.0f);
              acc[l + 1] = fmaf(math::h2f(static_cast<uint16_t>(w[i] >> 16)), qs[l + 1], 0.0f);
            }
          }
          score(j, math::vecdot_reduce64(acc));
        }
      }
      __syncthreads();  // krows is refilled by the next 256 keys (or reused as r32)
    }
  } else {
    for (int j = j_lo + tid; j < j_hi; j += kDecThreads) {
      score(j, ROPE && j >= n_cached
                   ? KV::kq_vec(knew, qs, hd, false)
                   : KV::kq_vec(kbase + static_cast<size_t>(j) * kv_dim, qs, hd, true));
    }
  }
  mx = block_max(mx, sm.shf);
  mark(1);
  if (!local) {  // the max of the cluster's block maxima (exact in any order)
    if (tid == 0) pmax[r] = mx;
    dec_cluster_sync(hw_cluster ? C : 1);
    mx = -INFINITY;
    for (int i = 0; i < C; ++i) mx = fmaxf(mx, __ldcg(pmax + i));
  }
  // 2. exps of this block's keys (0 in the 16-padding beyond n_att), a thread per key as for
  // the scores (each thread reads its own scores), then the 16-block sums (hsum16).
  for (int j = j_lo + tid; j < 16 * b_hi; j += kDecThreads) {
    sc[j] = j < n_att ? math::expf_ggml(ld(sc + j) - mx) : 0.0f;
  }
  __syncthreads();
  for (int b = b_lo + tid; b < b_hi; b += kDecThreads) {
    float e[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) e[i] = ld(sc + 16 * b + i);
    bs[b] = math::hsum16(e);
  }
  if (local) {
    __syncthreads();
  } else {
    dec_cluster_sync(hw_cluster ? C : 1);
  }
  mark(2);
  double s = 0.0;
  for (int b = tid; b < nb; b += kDecThreads) s += static_cast<double>(ld(bs + b));
  s = math::block_sum_double(s, sm.shd);
  float inv;
  if (!math::softmax_inv_certain(s, nb, &inv)) {  // uniform over the block (and the cluster)
    if (tid == 0) {
      double qd = 0.0;  // the CPU's order: block sums added one by one
      for (int b = 0; b < nb; ++b) qd += static_cast<double>(ld(bs + b));
      sm.sh_inv = math::softmax_inv(qd);
    }
    __syncthreads();
    inv = sm.sh_inv;
  }
  mark(3);
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
  mark(4);
  for (int dl = tid; dl < dn; dl += kDecThreads) {
    float rr[16];  // second level: (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l])
#pragma unroll
    for (int i = 0; i < 16; ++i) rr[i] = r32[i * dn + dl] + r32[(i + 16) * dn + dl];
    const float o = math::hsum16(rr);
    const size_t oi = static_cast<size_t>(h) * hd + d_lo + dl;
    out[oi] = o;
    if (a.act_mode != kDecActNone)
      a.act.f[oi] = math::act_round(static_cast<ActType>(a.act_mode), o);
  }
  if constexpr (ROPE) {
    // bias_rope_store's q output (it may be q itself), once every block of the head's cluster
    // has read q: after the cluster barriers of exchange mode, the split barrier of local
    // mode, or (one block per head) this block's own barriers.
    if (split_barrier) asm volatile("barrier.cluster.wait;" ::: "memory");
    if (r == 0 && rp.q_out != nullptr) {
      for (int i = tid; i < hd; i += kDecThreads) rp.q_out[static_cast<size_t>(h) * hd + i] = qr[i];
    }
  }
}

// The arguments of the decode attention for the persistent decode kernel (attention_exact.cu;
// T = float or uint16_t): attention()'s at decode, with the q output off (rp.q_out nullptr)
// and act_mode the rounding for act_type (kDecActNone for Q8_0 / Q8_K activations).
template <class T>
DecArgs<T> decode_attention_args(const QkvIn& x, const AttnShape& s, const float* rope_table,
                                 const int32_t* d_n_past, T* k_cache, T* v_cache, float* out,
                                 int n_ctx, float* scratch, uint32_t act_type, const ActBuf& a);

}  // namespace worker::kern::exact
