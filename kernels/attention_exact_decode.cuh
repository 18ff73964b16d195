#pragma once
// The exact decode attention of one head as a block-level device function, shared by
// ex_attn_decode_kernel (attention_exact.cu) and the persistent decode kernel
// (decode_step.cu). Bit for bit attention_exact.cu's three-kernel path for one token.
#include <cooperative_groups.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

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
//     its own shared memory, and no cluster barrier is needed in steps 1-2; or, in split mode
//     (DecKeys), an equal share of the keys, exchanged with the other blocks' through the
//     scratch at one barrier of the head's blocks (`xchg`: the cluster barrier in
//     ex_attn_decode_kernel), or as tagged values every block polls (the persistent decode
//     kernel's), after which every block has all scores and goes on as in local mode.
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
// only after a cluster barrier (its release / acquire) and through L2 (__ldcg). FP16 cache: the
// block's K rows (head_dim 64) and its 8 V columns are copied into a stage in shared memory
// (dec_stage, attn_stage_kv: cp.async) and read from there; what is not staged is prefetched
// into L2 before the wait. Geometry: n_head * C blocks, independent of n_past.

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
template <class KV>
constexpr int local_keys_of() {
  return sizeof(typename KV::T) == 2 ? 768 : 384;
}
// The key stage (FP16 cache, head_dim 64): a block's key rows (at most kDecLocalKeys) copied
// into shared memory by cp.async, kDecKeyRowWords words a row (32 words of data, 4 of
// padding: a quarter warp's 16-byte reads of 8 rows hit distinct banks).
constexpr int kDecKeyRowWords = 36;
// Then the V stage: 8 values (16 bytes) a key.
constexpr size_t kDecKvStageBytes = static_cast<size_t>(kDecLocalKeys) * kDecKeyRowWords * 4 +
                                    static_cast<size_t>(kDecLocalKeys) * 16;
// The stage a block of the decode attention needs (0: every read from global memory).
template <class KV>
__host__ __device__ constexpr size_t dec_kv_stage_bytes() {
  return sizeof(typename KV::T) == 2 ? kDecKvStageBytes : 0;
}
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
// rest; v + bias. The biases and the position's {cos, sin} pairs (constants of the model: no
// op of the step writes them) are loaded before the block's wait (DecRopeConst); after it, q,
// k and v through `ld(w, i)` (element i of q (w = 0), k (1) or v (2): dec_ld_l2's loads
// through L2, other blocks wrote them, all issued before any is used; or the persistent step's
// copy in shared memory).
// hd <= kDecThreads (kDecMaxHd): one element (or pair) a thread.
struct DecRopeOut {
  const float* bias;
  float* dst;
};
struct DecRopeConst {
  float2 cs = make_float2(0.0f, 0.0f);  // this thread's pair's {cos, sin}
  float q0 = 0.0f, q1 = 0.0f, qt = 0.0f, k0 = 0.0f, k1 = 0.0f, kt = 0.0f, v = 0.0f;  // biases
};
__device__ __forceinline__ DecRopeConst dec_rope_consts(const float* bq, const float* bk,
                                                        const float* bv, const float2* cs, int hd,
                                                        int n_rot, int neox) {
  const int tid = static_cast<int>(threadIdx.x), half = n_rot / 2;
  const int i0 = neox ? tid : 2 * tid, i1 = neox ? tid + half : 2 * tid + 1, it = n_rot + tid;
  DecRopeConst r;
  if (tid < half) {
    r.cs = cs[tid];
    if (bq != nullptr) r.q0 = bq[i0], r.q1 = bq[i1];
    if (bk != nullptr) r.k0 = bk[i0], r.k1 = bk[i1];
  }
  if (it < hd) {
    if (bq != nullptr) r.qt = bq[it];
    if (bk != nullptr) r.kt = bk[it];
  }
  if (tid < hd && bv != nullptr) r.v = bv[tid];
  return r;
}
template <class Ld>
__device__ __forceinline__ void dec_rope_qkv(Ld&& ld, DecRopeOut q, DecRopeOut k, DecRopeOut v,
                                             const DecRopeConst& b, int hd, int n_rot, int neox) {
  const int tid = static_cast<int>(threadIdx.x), half = n_rot / 2;
  const bool pair = tid < half, tail = n_rot + tid < hd, vt = tid < hd;
  const int i0 = neox ? tid : 2 * tid, i1 = neox ? tid + half : 2 * tid + 1, it = n_rot + tid;
  float q0 = 0.0f, q1 = 0.0f, k0 = 0.0f, k1 = 0.0f, qt = 0.0f, kt = 0.0f, vv = 0.0f;
  if (pair) {
    q0 = ld(0, i0);
    q1 = ld(0, i1);
    k0 = ld(1, i0);
    k1 = ld(1, i1);
  }
  if (tail) {
    qt = ld(0, it);
    kt = ld(1, it);
  }
  if (vt) vv = ld(2, tid);
  if (pair) {
    const auto rot = [&](const DecRopeOut& o, float x0, float x1, float b0, float b1) {
      if (o.bias != nullptr) {
        x0 = x0 + b0;
        x1 = x1 + b1;
      }
      float d0, d1;
      math::rope_pair(x0, x1, b.cs.x, b.cs.y, d0, d1);
      o.dst[i0] = d0;
      o.dst[i1] = d1;
    };
    rot(q, q0, q1, b.q0, b.q1);
    rot(k, k0, k1, b.k0, b.k1);
  }
  if (tail) {
    q.dst[it] = q.bias != nullptr ? qt + b.qt : qt;
    k.dst[it] = k.bias != nullptr ? kt + b.kt : kt;
  }
  if (vt) v.dst[tid] = v.bias != nullptr ? vv + b.v : vv;
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
// 16 bytes global -> shared, asynchronous (L2 only: the cache rows are read once a step).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}
// All but the most recent group.
__device__ __forceinline__ void cp_async_wait_group1() {
  asm volatile("cp.async.wait_group 1;" ::: "memory");
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

// The shared memory of one block of the decode attention (its K / V stage, when there is one,
// is the caller's: after it in ex_attn_decode_kernel, at StepParams::off_kst in the persistent
// step).
struct alignas(16) DecSmem {
  float qs[kDecMaxHd];  // the query as KQ reads it
  // ROPE: the rotated q (the q output) and this token's K and V rows as stored.
  float qr[kDecMaxHd];
  float knew[kDecMaxHd];
  float vnew[kDecMaxHd];
  float r32[32 * kDecMaxHd];  // KQV's partial chains
  float shf[32];
  float sh_inv;
  // Local mode (n_att <= local_keys): every block of the cluster computes all exps and block
  // sums itself, here, and all scores (split mode: its share, exchanged through the scratch).
  float sc_l[kDecLocalKeys];
  float bs_l[kDecLocalKeys / 16];
};

// The block's share of the keys (block r of a head's C): its 16-blocks [s_lo, s_hi), the keys
// of its exps [j_lo, j_hi) (all of them in local mode), the keys it scores [q_lo, q_hi) (the
// same, except in split mode), and the keys below n_cached that are read from the cache ((ROPE)
// key n_past comes from the block's own copy).
//
// Split mode (local mode, C > 1: the caller's `xchg` meets the head's blocks): block r scores only
// the keys [q_lo, q_hi) (an equal share of the n_att keys), writes them and its maximum to the
// head's scratch, and after the exchange (a barrier of the head's C blocks) every block reads
// all scores back and goes on as in local mode: the same values, one exchange instead of every
// block scoring (and staging the K rows of) every key. (A tagged xchg: the scores go out as
// tagged values that every block polls back, their max taken from them; no barrier.)
struct DecKeys {
  int n_past, n_att, nb, cap, s_lo, s_hi, b_lo, b_hi, j_lo, j_hi, q_lo, q_hi, n_cached;
  bool local, split;  // uniform over the grid
};
template <bool ROPE, class T>
__device__ __forceinline__ DecKeys dec_keys(const DecArgs<T>& a, int r, int C) {
  DecKeys k;
  k.n_past = a.d_n_past[0];
  k.n_att = k.n_past + 1;
  k.nb = (k.n_att + 15) / 16;
  k.cap = (k.n_att + 63) & ~63;
  k.local = k.n_att <= a.local_keys;
  k.split = k.local && C > 1;
  const int per = (k.nb + C - 1) / C;
  k.s_lo = min(k.nb, r * per);
  k.s_hi = min(k.nb, r * per + per);
  k.b_lo = k.local ? 0 : k.s_lo;
  k.b_hi = k.local ? k.nb : k.s_hi;
  k.j_lo = 16 * k.b_lo;
  k.j_hi = min(k.n_att, 16 * k.b_hi);
  if (k.split) {
    const int kper = (k.n_att + C - 1) / C;
    k.q_lo = min(k.n_att, r * kper);
    k.q_hi = min(k.n_att, k.q_lo + kper);
  } else {
    k.q_lo = k.j_lo;
    k.q_hi = k.j_hi;
  }
  k.n_cached = ROPE ? k.n_past : k.n_att;
  return k;
}

// The cache reads that go through the block's stage (kst, the caller's shared memory of
// dec_kv_stage_bytes; nullptr: none), FP16 cache only: the K rows of its keys when head_dim is
// 64 and they are at most kDecLocalKeys (kDecKeyRowWords words a row), and the V columns of its
// KQV dims when they are 8 (16 bytes a key) and the cached keys at most kDecLocalKeys. The rest
// is read from global memory (through L2 prefetches issued before the wait).
struct DecStage {
  uint32_t* k = nullptr;  // K rows, row i = key q_lo + i
  uint16_t* v = nullptr;  // V: key j's 8 values at v + 8 j
  int d_lo = 0, dn = 0;   // the block's KQV dims [d_lo, d_lo + dn)
};
template <class KV>
__device__ __forceinline__ DecStage dec_stage(const DecArgs<typename KV::T>& a, const DecKeys& k,
                                              int h, int r, int C, uint32_t* kst) {
  DecStage st;
  const int hd = a.hd;
  const int dper = (hd + C - 1) / C;
  st.d_lo = min(hd, r * dper);
  st.dn = min(hd, st.d_lo + dper) - st.d_lo;
  if (kst == nullptr || sizeof(typename KV::T) != 2 || a.kv_dim % 8 != 0) return st;
  const size_t go = static_cast<size_t>(h / a.group) * hd;
  if (hd == 64 && k.q_hi - k.q_lo <= kDecLocalKeys && math::aligned16(a.k_cache + go)) st.k = kst;
  if (st.dn == 8 && k.n_cached <= kDecLocalKeys && math::aligned16(a.v_cache + go + st.d_lo)) {
    st.v = reinterpret_cast<uint16_t*>(kst + kDecLocalKeys * kDecKeyRowWords);
  }
  return st;
}

// Issues the block's stage copies (cp.async, 16 bytes each, coalesced: 8 threads a 128-byte K
// row; one thread a key's 8 V values) and commits them as one group; attn_decode_block waits for
// them (cp.async.wait_all) after RoPE. Every thread of the block calls it.
template <class KV>
__device__ __forceinline__ void attn_stage_kv(const DecArgs<typename KV::T>& a, int h,
                                              const DecKeys& k, const DecStage& st) {
  // Warps 1.. issue them: thread 0 (the persistent kernel's counter poll) then waits behind
  // none (issued by every warp, the Q/K/V -> attention wait measured 0.5 us longer a layer).
  const int tid = static_cast<int>(threadIdx.x) - kWarp;
  constexpr int kN = kDecThreads - kWarp;
  if (tid < 0) return;
  const size_t go = static_cast<size_t>(h / a.group) * a.hd;
  if (st.k != nullptr) {
    const int rows = max(0, min(k.q_hi, k.n_cached) - k.q_lo);
    for (int e = tid; e < 8 * rows; e += kN) {
      const int i = e >> 3, pc = e & 7;
      cp_async16(st.k + i * kDecKeyRowWords + 4 * pc,
                 reinterpret_cast<const uint4*>(a.k_cache +
                                                static_cast<size_t>(k.q_lo + i) * a.kv_dim + go) +
                     pc);
    }
  }
  cp_async_commit();  // group 1: K (waited for before the scores)
  if (st.v != nullptr) {
    for (int j = tid; j < k.n_cached; j += kN) {
      cp_async16(st.v + 8 * j, a.v_cache + static_cast<size_t>(j) * a.kv_dim + go + st.d_lo);
    }
  }
  cp_async_commit();
}

// q, k_cache and v_cache are not __restrict__: with ROPE the block writes q (rp.q_out) and this
// token's cache rows (rp.k_cache / v_cache) through other pointers; plain coherent loads also
// measured faster here than the read-only path restrict allows.
//
// Block r (< C) of head h. `wait()` is called once, after the loads of data no earlier op of
// the step writes (n_past, the RoPE's biases and {cos, sin}, the stage copies or L2 prefetches
// of cache rows below n_past) and before anything an earlier op wrote is read; it returns how
// to read q / k / v (`qkv(w, i)`: dec_rope_qkv's `ld`). ex_attn_decode_kernel: griddep_wait(), then
// dec_ld_l2; the persistent decode kernel: its poll of the tagged values into sm.r32 (free
// until KQV), then reads of that copy. `hw_cluster`: the C
// blocks of the head are a hardware cluster (C > 1); without one, C > 1 is allowed in local
// mode only (split mode: the blocks exchange through the scratch and `xchg`), and rp.q_out must
// then be nullptr (no block may write q while another reads it). `kst`: the stage (dec_stage);
// `stage_early`: its copies are issued before the wait (the persistent decode kernel, whose
// griddep_wait at its start ordered every earlier step's cache writes before it), else after it (a
// PDL wait: an earlier kernel may still run). Issued before the wait, they land while the block
// waits for q / k / v (v29, when every block of a head still copied all of its K rows: the wait
// ~1.7 us longer from the copies' L2 traffic, the scores 4.4 -> 2.4 us, KQV 1.8 -> 1.2; in split
// mode, v30, a block copies only its own keys' K rows and V columns).
// `mark(k)` is called by every thread after phase k (profiling: 0 RoPE, 1 scores, 2 exps, 3 the
// softmax sum, 4 KQV; and 5 between 0 and 1: the block's own scores computed and put, before the
// exchange or the block's max). `xchg` (split mode, DecKeys): either a callable, xchg(), called by
// every thread of the C blocks of head h, once, which returns in each once all have called it, with
// their earlier writes of the scratch visible (release / acquire at least at the scope of the C
// blocks); or an object with kTagged = true (DecTaggedXchg): xchg.put(h, j, s) stores this
// block's score j, and xchg.gather(sc, h, n_att, sm.shf), called by every thread, returns the
// max of all n_att scores of head h once every block has put its own, with them copied into
// sc[0 .. n_att) (a barrier of the block; none of the head's blocks). `put(i, o)` stores
// output i (h * hd + d): the per-op kernel's dec_put (a.out, and a.act rounded by act_mode), the
// persistent step's tagged copy.
template <class X, class = void>
struct DecTaggedXchg : std::false_type {};
template <class X>
struct DecTaggedXchg<X, std::void_t<decltype(X::kTagged)>> : std::bool_constant<X::kTagged> {};

template <class KV, bool ROPE, class Wait, class Mark, class Xchg, class Put>
__device__ __forceinline__ void attn_decode_block(const DecArgs<typename KV::T>& a, int h, int r,
                                                  int C, bool hw_cluster, DecSmem& sm,
                                                  uint32_t* kst, bool stage_early, Wait&& wait,
                                                  Mark&& mark, Xchg&& xchg, Put&& put) {
  using T = typename KV::T;
  float* const qs = sm.qs;
  float* const qr = sm.qr;
  float* const knew = sm.knew;
  float* const vnew = sm.vnew;
  float* const r32 = sm.r32;
  float* const sc_l = sm.sc_l;
  float* const bs_l = sm.bs_l;
  const T* const k_cache = a.k_cache;
  const T* const v_cache = a.v_cache;
  float* const scratch = a.scratch;
  const int hd = a.hd, kv_dim = a.kv_dim, group = a.group;
  const int g = h / group;
  const DecRope<T>& rp = a.rp;
  const int tid = threadIdx.x;
  // Before the wait: n_past (the step's io, written by a copy before the step's first kernel),
  // the stage copies or L2 prefetches of the cache rows below n_past this block reads (K rows
  // of its keys, the V rows of the same keys: the cluster's blocks together cover every key),
  // which earlier steps wrote, and the RoPE's constants.
  const DecKeys ks = dec_keys<ROPE>(a, r, C);
  const int n_past = ks.n_past, n_att = ks.n_att, nb = ks.nb, cap = ks.cap;
  const bool local = ks.local, split = ks.split;
  const int b_hi = ks.b_hi, j_lo = ks.j_lo, q_lo = ks.q_lo, q_hi = ks.q_hi;
  const int n_cached = ks.n_cached;
  const DecStage st = dec_stage<KV>(a, ks, h, r, C, kst);
  if (stage_early) attn_stage_kv<KV>(a, h, ks, st);
  const size_t go = static_cast<size_t>(g) * hd;
  {
    // The keys this block reads: its K rows [q_lo, q_hi) (split mode), else its 16-blocks'
    // (the cluster's blocks together cover every key), and the V rows of the same keys.
    const int p_lo = split ? q_lo : 16 * ks.s_lo, p_hi = split ? q_hi : min(n_att, 16 * ks.s_hi);
    for (int j = p_lo + tid; j < min(p_hi, n_past); j += kDecThreads) {
      if (st.k == nullptr) prefetch_l2(k_cache + static_cast<size_t>(j) * kv_dim + go);
      if (st.v == nullptr) prefetch_l2(v_cache + static_cast<size_t>(j) * kv_dim + go);
    }
  }
  const T* kbase = k_cache + go;
  const float* const bq = rp.bq != nullptr ? rp.bq + static_cast<size_t>(h) * hd : nullptr;
  const float* const bk = rp.bk != nullptr ? rp.bk + go : nullptr;
  const float* const bv = rp.bv != nullptr ? rp.bv + go : nullptr;
  DecRopeConst rc;
  if constexpr (ROPE) {
    rc = dec_rope_consts(bq, bk, bv, rp.table + static_cast<size_t>(n_past) * (rp.n_rot / 2), hd,
                         rp.n_rot, rp.neox);
  }
  const auto qkv = wait();  // q / k / v: qkv(w, i)
  if (!stage_early) attn_stage_kv<KV>(a, h, ks, st);
  if constexpr (ROPE) {
    dec_rope_qkv(qkv, {bq, qr}, {bk, knew}, {bv, vnew}, rc, hd, rp.n_rot, rp.neox);
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
    for (int i = tid; i < hd; i += kDecThreads) qs[i] = KV::query(qkv(0, i));
  }
  cp_async_wait_group1();  // this thread's K copies (none: no-op); the barrier: everyone's
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
  // 1. scores of this block's keys [q_lo, q_hi) (split mode: into the head's scratch, or
  // xchg.put's tagged values)
  constexpr bool kTagged = DecTaggedXchg<std::remove_reference_t<Xchg>>::value;
  float mx = -INFINITY;
  float* const sq = split ? hs : sc;
  const auto score = [&](int j, float d) {
    const float s = d * a.kq_scale;
    if constexpr (kTagged) {
      if (split) {
        xchg.put(h, j, s);
      } else {
        sq[j] = s;
      }
    } else {
      sq[j] = s;
    }
    mx = fmaxf(mx, s);
  };
  if (st.k != nullptr) {
    // KvF16::kq_vec's arithmetic on the staged rows, two threads a key (perf-notes v46): half
    // s = thread bit 4 of the pair (tid, tid ^ 16) takes lanes 8 s .. 8 s + 7 of each 16-lane
    // quarter q (one 16-byte word group of the row: a quarter warp reads 8 rows' same group,
    // 36 words apart, in distinct banks), its 32 chains of one FMA; vecdot_reduce64's first two
    // levels for its lanes l = 8 s + i, (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
    // hsum16's first level pairs lane l with l + 8, the partner's (shuffle xor 16; + is
    // commutative), and both finish hsum16's tree: one thread's vecdot_reduce64, bit for bit.
    // Every thread runs the same rounds (the shuffles take the full warp).
    const int s = (tid >> 4) & 1, kj = (tid & 15) | ((tid >> 5) << 4);
    for (int base = q_lo; base < q_hi; base += kDecThreads / 2) {
      const int j = base + kj;
      const bool in = j < q_hi;
      float acc[4][8];
      if (ROPE && j >= n_cached) {  // this step's key (or past q_hi: not scored)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int l = 16 * q + 8 * s + i;
            acc[q][i] = fmaf(knew[l], qs[l], 0.0f);
          }
        }
      } else {
        const uint32_t* row = st.k + (in ? j - q_lo : 0) * kDecKeyRowWords;  // in the stage
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 w4 = *reinterpret_cast<const uint4*>(row + 8 * q + 4 * s);
          const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int l = 16 * q + 8 * s + 2 * i;
            acc[q][2 * i] = fmaf(math::h2f(static_cast<uint16_t>(w[i] & 0xFFFFu)), qs[l], 0.0f);
            acc[q][2 * i + 1] = fmaf(math::h2f(static_cast<uint16_t>(w[i] >> 16)), qs[l + 1], 0.0f);
          }
        }
      }
      float t8[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float v = (acc[0][i] + acc[2][i]) + (acc[1][i] + acc[3][i]);
        t8[i] = v + __shfl_xor_sync(0xffffffffu, v, 16);
      }
      float t4[4];  // hsum16's other levels
#pragma unroll
      for (int i = 0; i < 4; ++i) t4[i] = t8[i + 4] + t8[i];
      const float d = (t4[0] + t4[2]) + (t4[1] + t4[3]);
      if (in && s == 0) score(j, d);
    }
  } else {
    for (int j = q_lo + tid; j < q_hi; j += kDecThreads) {
      score(j, ROPE && j >= n_cached
                   ? KV::kq_vec(knew, qs, hd, false)
                   : KV::kq_vec(kbase + static_cast<size_t>(j) * kv_dim, qs, hd, true));
    }
  }
  mark(5);
  // Split mode with tagged values: every score into sc, their max (exact in any order); then
  // as in local mode.
  const bool gathered = kTagged && split;
  if constexpr (kTagged) {
    if (split) mx = xchg.gather(sc, h, n_att, sm.shf);
  }
  if (!gathered) {
    mx = block_max(mx, sm.shf);
    if (!local || split) {  // the max of the cluster's block maxima (exact in any order)
      if (tid == 0) pmax[r] = mx;
      if constexpr (!kTagged) {
        if (split) {
          xchg();
        } else {
          dec_cluster_sync(hw_cluster ? C : 1);
        }
      } else {
        dec_cluster_sync(hw_cluster ? C : 1);
      }
      mx = -INFINITY;
      for (int i = 0; i < C; ++i) mx = fmaxf(mx, __ldcg(pmax + i));
    }
  }
  mark(1);
  // 2. exps of this block's keys (0 in the 16-padding beyond n_att), a thread per key as for
  // the scores (each thread reads its own scores; split mode: every score from the scratch,
  // into the block's own array), and in the same pass the 16-block sums: a 16-block's keys are
  // 16 consecutive lanes (j_lo and kDecThreads are multiples of 16), and hsum16's tree (16 -> 8
  // -> 4 -> 2 -> 1, each level adding the lanes 8, 4, 2, 1 apart) is their xor butterfly (float
  // + is commutative: both lanes of a pair get the tree's sum). Every thread runs the same
  // number of rounds (the shuffles take the full warp).
  for (int base = j_lo; base < 16 * b_hi; base += kDecThreads) {
    const int j = base + tid;
    const bool in = j < 16 * b_hi;
    float e = 0.0f;
    if (j < n_att) e = math::expf_ggml((split && !gathered ? __ldcg(hs + j) : ld(sc + j)) - mx);
    if (in) sc[j] = e;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) e = e + __shfl_xor_sync(0xffffffffu, e, o);
    if (in && (j & 15) == 0) bs[j >> 4] = e;
  }
  cp_async_wait_all();  // the V stage (its own group), before the barrier: every thread's
  if (local) {
    __syncthreads();
  } else {
    dec_cluster_sync(hw_cluster ? C : 1);
  }
  mark(2);
  // The sum of the nb block sums in double by warp 0 (any order: the certainty check bounds
  // every order's error; near a rounding boundary the CPU's sequential sum), inv through shared
  // memory to the block.
  if (tid < kWarp) {
    double s = 0.0;
    for (int b = tid; b < nb; b += kWarp) s += static_cast<double>(ld(bs + b));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float inv;
    if (!math::softmax_inv_certain(s, nb, &inv) && tid == 0) {
      double qd = 0.0;  // the CPU's order: block sums added one by one
      for (int b = 0; b < nb; ++b) qd += static_cast<double>(ld(bs + b));
      inv = math::softmax_inv(qd);
    }
    if (tid == 0) sm.sh_inv = inv;
  }
  __syncthreads();
  const float inv = sm.sh_inv;
  mark(3);
  // 3. KQV for dims [d_lo, d_lo + dn): task (l, d), l < 32, runs chains l and l + 32.
  const int d_lo = st.d_lo, dn = st.dn;
  // V of key j, dim d_lo + dl: vcol[j * vstride] (the stage's, or the cache's)
  const T* const vbase = st.v != nullptr ? reinterpret_cast<const T*>(st.v) : v_cache + go + d_lo;
  const size_t vstride = st.v != nullptr ? 8 : static_cast<size_t>(kv_dim);
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
      a0 = fmaf(KV::load(vcol[j0 * vstride]), KV::prob(ld(sc + j0), inv), a0);
      a1 = fmaf(KV::load(vcol[j1 * vstride]), KV::prob(ld(sc + j1), inv), a1);
    }
    for (; base < cap; base += 64) {  // the last group (at most one)
      const int j0 = base + l, j1 = j0 + 32;
      float v0 = 0.0f, v1 = 0.0f;  // cache rows at or beyond n_cached are never read
      if (j0 < n_att) {
        v0 = ROPE && j0 >= n_cached ? vnew[d_lo + dl]
                                    : KV::load(vcol[static_cast<size_t>(j0) * vstride]);
      }
      if (j1 < n_att) {
        v1 = ROPE && j1 >= n_cached ? vnew[d_lo + dl]
                                    : KV::load(vcol[static_cast<size_t>(j1) * vstride]);
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
    put(static_cast<size_t>(h) * hd + d_lo + dl, o);
  }
  if constexpr (ROPE) {
    // bias_rope_store's q output (it may be q itself), once every block of the head has read
    // q: after exchange mode's cluster barriers, split mode's xchg, or (one block a head) this
    // block's own barriers.
    if (r == 0 && rp.q_out != nullptr) {
      for (int i = tid; i < hd; i += kDecThreads) rp.q_out[static_cast<size_t>(h) * hd + i] = qr[i];
    }
  }
}

// q / k / v of head h for attn_decode_block's `qkv(w, i)`, through L2 (other blocks wrote them;
// k and v with ROPE only).
template <bool ROPE, class T>
__device__ __forceinline__ auto dec_ld_l2(const DecArgs<T>& a, int h) {
  const float* const q = a.q + static_cast<size_t>(h) * a.hd;
  const float *k = nullptr, *v = nullptr;
  if constexpr (ROPE) {
    const size_t go = static_cast<size_t>(h / a.group) * a.hd;
    k = a.rp.k_new + go;
    v = a.rp.v_new + go;
  }
  return [q, k, v](int w, int i) { return __ldcg((w == 0 ? q : w == 1 ? k : v) + i); };
}
// The attention's output as the next op reads it: rounded by act_mode (kDecActNone: as is).
__device__ __forceinline__ float dec_act(int act_mode, float o) {
  return act_mode != kDecActNone ? math::act_round(static_cast<ActType>(act_mode), o) : o;
}
// attn_decode_block's `put` for the per-op kernel: a.out, and with act_mode a.act.f rounded.
template <class T>
__device__ __forceinline__ auto dec_put(const DecArgs<T>& a) {
  return [&a](size_t i, float o) {
    a.out[i] = o;
    if (a.act_mode != kDecActNone) a.act.f[i] = dec_act(a.act_mode, o);
  };
}

// The arguments of the decode attention for the persistent decode kernel (attention_exact.cu;
// T = float or uint16_t): attention()'s at decode, with the q output off (rp.q_out nullptr)
// and act_mode the rounding for act_type (kDecActNone for Q8_0 / Q8_K activations).
template <class T>
DecArgs<T> decode_attention_args(const QkvIn& x, const AttnShape& s, const float* rope_table,
                                 const int32_t* d_n_past, T* k_cache, T* v_cache, float* out,
                                 int n_ctx, float* scratch, uint32_t act_type, const ActBuf& a);

}  // namespace worker::kern::exact
