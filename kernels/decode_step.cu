// The exact decode step as one persistent kernel (decode_step.cuh).
//
// Grid: one block of 256 threads per SM, all resident at once (the launch is the step's only
// kernel after the embedding; the blocks of the kernel after it start only once every block
// of this one has passed its griddep_wait(), so nothing can hold an SM that a block of this
// one still needs). Every op of a layer is split over the blocks: block c takes rows
// [R c / G, R (c + 1) / G) of each product (G blocks; rounded down to even rows where two rows
// are the fewest whose bytes are a multiple of 16: part()), and blocks [0, n_head * C) the
// attention (C blocks a head, in local mode: each computes all scores, no exchange between blocks).
// The step runs while the keys fit local mode (DecodeStep::local_keys()); beyond, the engine takes
// the launch-per-op step, whose attention blocks of a head are a hardware cluster that splits
// the keys (one block a head here measured 747 / 583 / 404 tok/s at depth 1024 / 2048 / 4096
// on the H100, 0.5B F16, against 1,044 at 512: perf-notes v19).
//
// Dependencies: after its share of op k, a block adds 1 to counter k (red.release.gpu, after a
// barrier of the block); a block that needs op k's outputs spins until counter k reaches G
// (ld.acquire.gpu by one thread, then a barrier). One counter per (layer, op); the last block
// to finish zeroes them for the next launch. Data other blocks wrote during the launch is read
// with ld.global.cg (L2).
//
// Weights before the wait: shared memory is four regions, P (Wo + Q/K/V, the attention's
// shared arrays over the Q/K/V tile, then the down tile), G (gate + up), XS (the op's input,
// rounded for its weights, or its Q8_0 quants and scales) and a small one for the block's rows of x
// (the residual adds read no global memory) and its gate / up dots. Thread 0 copies the block's
// rows of the next ops' matrices into P and G with TMA bulk copies (cp.async.bulk, an mbarrier
// counting the bytes; L2 evict-first, the weights are read once a step) as soon as the region is
// free:
//   after down (l - 1):   P <- Wo (l), Q/K/V (l)
//   after attention (l):  G <- gate, up (l)   (issued earlier, their 17 MB of loads slowed the
//                                              norm and attention's latency-bound reads)
//   after Wo (l):         P <- down (l)
// After the last layer the LM head streams through P and G as a ring of stages of lm_rows rows
// (64, 32, 16 or 8: the most of which three fit).
//
// Where a step's time goes is measured by the trace (enable_trace, bench/steptrace.py) and
// written in reports/perf-notes.md (v11).
//
// Numerics: the same per-thread code as the launch-per-op step: the RMSNorm's double tree with
// the certainty check (thread k summing columns k, k + 256, ...), each matrix row in the vec_dot
// order of matvec1_float (fr::smem_rows_dot: independent rows interleaved, each row's chains
// unchanged), SwiGLU (math::swiglu_one, a thread per row after the dots), the activation
// roundings, and attn_decode_block for the attention. Q8_0 / Q5_0 weights: every block
// quantizes the op's whole input as quantize_row_q8_0 (qm::act_q8_0_from) into shared memory,
// and each row is matvec1_quant's dot_q0_lanes (8 lane chains over the blocks in order, a
// thread each, then hsum_float_8; q0_rows); the attention output and the SwiGLU output stay
// unrounded floats, quantized by every block when staged for Wo and down.
//
// Compiled with -fmad=false: every product / sum / fma is explicit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attention_exact_decode.cuh"
#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "decode_step.cuh"
#include "exact_float_rows.cuh"
#include "exact_ops_math.cuh"
#include "exact_qdecode_math.cuh"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

constexpr int kThreads = kDecThreads;  // the attention body's block size
constexpr int kWarps = kThreads / kWarp;
constexpr int kOps = 5;  // counters a layer: Q/K/V, attention, Wo, gate + up, down
// The thread that issues the bulk copies: thread 0, which also polls the counters. (Issued by
// a thread of the last warp, the block's next barrier waited 2-3 us longer after the Wo and
// attention ops: 928 vs 947 tok/s, perf-notes v11.)
constexpr int kIssuer = 0;
constexpr int kTracePoints = 17;  // a layer's timestamps (DecodeStep::read_trace)
constexpr int kLmStages = 8;      // LM head ring: at most this many stages of lm_rows rows
// Quantized weights (Q8_0, Q5_0: the reference's dot_q0_lanes, 8 lane chains a row): 8
// threads a row, 32 rows at once.
constexpr int kQ0Chains = 8;

template <GgmlType T>
__host__ __device__ constexpr bool q0_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::Q5_0;
}

template <class KT>
struct StepLayer {
  const uint8_t *wq, *wk, *wv, *wo, *gate, *up, *down;
  const float *attn_norm, *ffn_norm;
  DecArgs<KT> attn;
};

template <class KT>
struct StepParams {
  const StepLayer<KT>* layers;
  int n_layer;
  int E, QD, KD, F, V;   // n_embd, n_head * head_dim, n_head_kv * head_dim, n_ff, vocab
  int n_head, cv;        // heads; blocks a head in local mode
  size_t rbE, rbQ, rbF;  // bytes of a row of E, QD, F columns
  float eps;
  const float* out_norm;
  const uint8_t* out_w;
  float *x, *q, *k, *v, *att, *act_att, *act_g, *logits;
  unsigned* sync;
  const int32_t* d_n_past;
  unsigned off_qkv, off_g, off_xs;  // P at 0 (Wo at 0, Q/K/V and the attention at off_qkv)
  unsigned off_res;                 // the block's rows of x (Wo / down residual) and gate / up dots
  unsigned off_aq, off_ad;          // quantized weights: the input's Q8_0 quants and scales
  int rg;                           // row granule: a block's rows start at a multiple (1 or 2)
  int lm_stages;                    // 2 .. kLmStages: what fits in P and G
  int lm_rows;                      // rows a stage of the LM head
  uint64_t* trace;                  // nullptr, or kTracePoints timestamps a layer per block
};

// Block c's first row of `rows` (c = G: rows): a multiple of g, so that a block's rows start
// 16-byte aligned when two rows are (Q8_0 rows of 896 columns are 952 bytes); the last block
// takes an odd row count's last row.
__device__ __forceinline__ int part(int rows, int c, int G, int g) {
  return c == G ? rows : g * static_cast<int>(static_cast<long long>(rows / g) * c / G);
}

// ---- counters ----------------------------------------------------------------------------
__device__ __forceinline__ void arrive(unsigned* ctr) {
  __syncthreads();  // the block's writes of this op, ordered before thread 0's release
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
  }
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Profiling (DecodeStep::enable_trace): thread 0's %globaltimer at point k of layer l.
__device__ __forceinline__ void stamp(uint64_t* trace, int l, int k) {
  if (trace != nullptr && threadIdx.x == 0) {
    trace[(static_cast<size_t>(l) * kTracePoints + k) * gridDim.x + blockIdx.x] = global_ns();
  }
}

// A counter that does not complete within kStallNs is a bug (a block that never arrives): the
// kernel traps (the step fails with a CUDA error, the job with CUDA_ERROR) instead of hanging
// the worker.
constexpr uint64_t kStallNs = 5'000'000'000ull;
__device__ __forceinline__ void wait_for(const unsigned* ctr, unsigned n) {
  if (threadIdx.x == 0) {
    unsigned v = 0;
    uint64_t t0 = 0;
    for (int spins = 0;; ++spins) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
      if (v >= n) break;
      if ((spins & 1023) == 1023) {
        const uint64_t t = global_ns();
        if (t0 == 0) {
          t0 = t;
        } else if (t - t0 > kStallNs) {
          __trap();
        }
      }
    }
  }
  __syncthreads();
}

// ---- copies: TMA bulk copies (one thread issues; an mbarrier counts the bytes) ----------
__device__ __forceinline__ unsigned saddr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(bar)) : "memory");
}
// The issuing thread's arrival, expecting `bytes` of copies (0: the phase completes now).
__device__ __forceinline__ void mbar_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(bar)),
               "r"(bytes)
               : "memory");
}
// Every thread: until the phase with this parity has completed (its bytes have landed).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}" ::"r"(saddr(bar)),
      "r"(parity)
      : "memory");
}
// Orders this block's earlier shared-memory accesses (after a barrier) before the bulk copies
// the calling thread issues next into the same bytes.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Weights are read once a step: their lines go first when L2 needs room, so that the KV cache
// rows prefetched for the attention and the activations stay.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, size_t bytes, uint64_t* bar) {
  if (bytes == 0) return;
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(saddr(dst)),
      "l"(src), "r"(static_cast<unsigned>(bytes)), "r"(saddr(bar)), "l"(evict_first_policy())
      : "memory");
}
// Bytes of rows [r0, r1) (0 when empty).
__device__ __forceinline__ size_t rows_bytes(size_t rb, int r0, int r1) {
  return r1 > r0 ? static_cast<size_t>(r1 - r0) * rb : 0;
}

// for_each_batched (common.cuh) over n floats other blocks wrote (through L2).
template <class F>
__device__ __forceinline__ void for_each_l2(const float* src, int n, F&& f) {
  for_each_batched<kThreads>(
      n, [src](int i) { return __ldcg(src + i); }, f);
}

// xs = rmsnorm(x) * w rounded for T (ex_rmsnorm_act_kernel's values): x is read from L2.
// Also keeps x[r0 .. r1) in keep[0 ..].
template <GgmlType T>
__device__ void norm_act(float* xs, const float* x, const float* w, int n, float eps, double* shd,
                         float* sh_mean, float* keep, int r0, int r1) {
  const int tid = static_cast<int>(threadIdx.x);
  double s = 0.0;  // thread k: columns k, k + kThreads, ... in order
  for_each_l2(x, n, [&](int i, float xi) {
    xs[i] = xi;
    if (i >= r0 && i < r1) keep[i - r0] = xi;
    s += static_cast<double>(xi * xi);
  });
  s = math::block_sum_double(s, shd);
  float mean;
  if (!math::rms_mean_certain(s, n, &mean)) {  // uniform: every thread has the same s
    if (tid == 0) {
      double qd = 0.0;  // the CPU's order
      for (int i = 0; i < n; ++i) qd += static_cast<double>(xs[i] * xs[i]);
      *sh_mean = math::rms_mean(qd, n);
    }
    __syncthreads();
    mean = *sh_mean;
  }
  const float scale = math::rms_scale(mean, eps);
  __syncthreads();  // thread 0's fallback reads xs
  for_each_batched<kThreads>(
      n, [w](int i) { return __ldg(w + i); },
      [&](int i, float wi) { xs[i] = math::act_round(act_type_of(T), (xs[i] * scale) * wi); });
  __syncthreads();
}

// xs = n floats other blocks wrote (already rounded), from L2.
__device__ __forceinline__ void stage_l2(float* xs, const float* src, int n) {
  for_each_l2(src, n, [xs](int i, float v) { xs[i] = v; });
  __syncthreads();
}

// out(i, dot of row i) for the nr rows of a tile in shared memory; warp w takes rows w, w + 8..
// Rows i and i + 8 of a pair run together (smem_rows_dot<T, 2>).
template <GgmlType T, class Out>
__device__ __forceinline__ void tile_rows(const uint8_t* tile, size_t rb, int nr, int cols,
                                          const float* xs, Out&& out) {
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5;
  const float2* xp = reinterpret_cast<const float2*>(xs);
  int i = w;
  for (; i + kWarps < nr; i += 2 * kWarps) {
    const uint8_t* const rows[2] = {tile + static_cast<size_t>(i) * rb,
                                    tile + static_cast<size_t>(i + kWarps) * rb};
    float d[2];
    fr::smem_rows_dot<T, 2>(rows, cols, xp, xs, lane, d);
    if (lane == 0) {
      out(i, d[0]);
      out(i + kWarps, d[1]);
    }
  }
  if (i < nr) {
    const float d = fr::smem_row_dot<T>(tile + static_cast<size_t>(i) * rb, cols, xp, xs, lane);
    if (lane == 0) out(i, d);
  }
}

// Quantized weights: the op's input xs[0 .. n) (n % 32 == 0) as the reference quantizes it
// for Q8_0 / Q5_0 weights (quantize_row_q8_0: act_q8_0_from's formulas) into aq / ad: 8
// threads a 32-block, a word of 4 quants each; the block's amax by a butterfly over the 8
// (max: exact in any order). Every thread of the block calls it.
__device__ __forceinline__ void quantize_q8_0(const float* xs, int n, int8_t* aq, float* ad) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int t0 = 0; t0 < n / 4; t0 += kThreads) {  // uniform; n / 4 % 8 == 0: whole groups
    const int t = t0 + tid;
    const bool valid = t < n / 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (valid) v = reinterpret_cast<const float4*>(xs)[t];
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (valid) {
      const float id = math::act_q8_0_id(amax);
      const auto q = [id](float x) {
        return static_cast<uint32_t>(static_cast<uint8_t>(math::act_q8_0_quant(x, id)));
      };
      reinterpret_cast<uint32_t*>(aq)[t] = q(v.x) | q(v.y) << 8 | q(v.z) << 16 | q(v.w) << 24;
      if ((t & 7) == 0) ad[t / 8] = math::act_q8_0_d(amax);
    }
  }
  __syncthreads();
}

// 32-bit word at byte offset `off` (even) of the 4-byte aligned words w: a funnel of two
// words at a 2-byte offset.
__device__ __forceinline__ uint32_t word_at(const uint32_t* w, int off) {
  return off % 4 == 0 ? w[off / 4] : __byte_perm(w[off / 4], w[off / 4 + 1], 0x5432);
}
__device__ __forceinline__ float half_at(const uint32_t* w, int off) {
  const uint32_t v = w[off / 4];
  return qm::half_bits(off % 4 == 0 ? v : v >> 16);
}

// Lane chain c's integers and the weights' scales of two consecutive 32-blocks (a pair: 68
// bytes of Q8_0, 44 of Q5_0; 4-byte aligned) at pw; y0 / y1 the activation words of lane c.
template <GgmlType T>
__device__ __forceinline__ void q0_pair(const uint32_t* pw, int c, uint32_t y0, uint32_t y1,
                                        int& s0, int& s1, float& dw0, float& dw1) {
  constexpr int kBB = qd::block_bytes<T>();
  dw0 = half_at(pw, 0);
  dw1 = half_at(pw, kBB);
  if constexpr (T == GgmlType::Q8_0) {  // qs at 2 + 4c: the odd block's words are aligned
    s0 = qm::q8_0_int(word_at(pw + c, 2), y0);
    s1 = qm::q8_0_int(word_at(pw + c, kBB + 2), y1);
  } else {  // Q5_0: qh at 2, qs word c % 4 at 6 + 4 (c % 4)
    const int k = c & 3;
    s0 = qm::q5_0_int(c, word_at(pw, 2), word_at(pw + k, 6), y0);
    s1 = qm::q5_0_int(c, word_at(pw, kBB + 2), word_at(pw + k, kBB + 6), y1);
  }
}

// out(i, dot of row i) for the nr rows at rowp(i) (shared memory, 4-byte aligned) of `units`
// 32-blocks (even), Q8_0 / Q5_0 weights against the input's quants aq (as words) and scales
// ad: bit for bit dot_q0_lanes (matvec1_quant's qd:: decomposition, unit_slots / chain_pass /
// combine): thread (row i, chain c) runs chain c over the blocks in order, acc = fma(d_w *
// d_a, float(int of elements 4c .. 4c + 3), acc), two blocks a step, and the row's 8 lanes
// combine in hsum_float_8's tree.
template <GgmlType T, class RowPtr, class Out>
__device__ __forceinline__ void q0_rows(RowPtr rowp, int nr, int units, const uint32_t* aq,
                                        const float* ad, Out&& out) {
  constexpr int kPairWords = qd::block_bytes<T>() / 2;  // 2 blocks = kPairWords words
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  for (int t0 = 0; t0 < kQ0Chains * nr; t0 += kThreads) {  // uniform over the block
    const int i = (t0 + tid) / kQ0Chains, c = (t0 + tid) % kQ0Chains;
    float acc = 0.0f;
    if (i < nr) {
      const uint32_t* pw = reinterpret_cast<const uint32_t*>(rowp(i));
      const uint32_t* ya = aq + c;
      const float2* da = reinterpret_cast<const float2*>(ad);
#pragma unroll 2
      for (int u = 0; u < units; u += 2, pw += kPairWords, ya += 2 * kQ0Chains, ++da) {
        int s0, s1;
        float dw0, dw1;
        q0_pair<T>(pw, c, ya[0], ya[kQ0Chains], s0, s1, dw0, dw1);
        const float2 a = *da;
        acc = qm::lane_step(dw0 * a.x, s0, acc);
        acc = qm::lane_step(dw1 * a.y, s1, acc);
      }
    }
    float v[kQ0Chains];
#pragma unroll
    for (int k = 0; k < kQ0Chains; ++k) v[k] = __shfl_sync(0xffffffffu, acc, (lane & ~7) | k);
    if (c == 0 && i < nr) out(i, qm::hsum8(v));
  }
}

// The op's input in shared memory: floats rounded for float weights (xs), or quants and
// scales for quantized ones.
struct StepIn {
  const float* xs;
  const uint32_t* aq;
  const float* ad;
};

// out(i, dot of row i) for the nr rows of a tile (row i at tile + i rb) of `cols` columns.
template <GgmlType T, class Out>
__device__ __forceinline__ void rows_dot(const uint8_t* tile, size_t rb, int nr, int cols,
                                         const StepIn& in, Out&& out) {
  if constexpr (q0_type<T>()) {
    q0_rows<T>([&](int i) { return tile + static_cast<size_t>(i) * rb; }, nr, cols / 32, in.aq,
               in.ad, out);
  } else {
    tile_rows<T>(tile, rb, nr, cols, in.xs, out);
  }
}

template <GgmlType T, class KV>
__global__ void __launch_bounds__(kThreads, 1) decode_step_kernel(StepParams<typename KV::T> p) {
  using KT = typename KV::T;
  constexpr bool kQ = q0_type<T>();
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ double shd[32];
  __shared__ float sh_mean;
  // Copies in flight: P (Wo + Q/K/V), G (gate + up), D (down), the LM head's stages.
  __shared__ uint64_t bar_p, bar_g, bar_d, bar_lm[kLmStages];
  const int c = static_cast<int>(blockIdx.x), G = static_cast<int>(gridDim.x);
  const auto Gu = static_cast<unsigned>(G);
  const int tid = static_cast<int>(threadIdx.x);
  uint8_t* const P = smem;
  uint8_t* const Gr = smem + p.off_g;
  float* const xs = reinterpret_cast<float*>(smem + p.off_xs);
  int8_t* const aq = reinterpret_cast<int8_t*>(smem + p.off_aq);  // quantized weights only
  float* const ad = reinterpret_cast<float*>(smem + p.off_ad);
  const StepIn in{xs, reinterpret_cast<const uint32_t*>(aq), ad};
  // Quantized weights: the input in xs quantized (its floats are the reference's before
  // quantize_row_q8_0: the norm's output, Wo's and down's inputs unrounded).
  const auto quantize = [&](int n) {
    if constexpr (kQ) quantize_q8_0(xs, n, aq, ad);
  };
  // xres: this block's rows [e0, e1) of x, as the norm read them or Wo / down wrote them (the
  // residual adds need no global load), then its gate and up dots before the SwiGLU (gd).
  float* const xres = reinterpret_cast<float*>(smem + p.off_res);
  const int QKD = p.QD + 2 * p.KD;
  // this block's rows of each product
  const int e0 = part(p.E, c, G, p.rg), e1 = part(p.E, c + 1, G, p.rg);  // Wo, down
  const int k0 = part(QKD, c, G, p.rg), k1 = part(QKD, c + 1, G, p.rg);  // Q/K/V
  const int f0 = part(p.F, c, G, p.rg), f1 = part(p.F, c + 1, G, p.rg);  // gate, up
  const int v0 = part(p.V, c, G, p.rg), v1 = part(p.V, c + 1, G, p.rg);  // LM head

  // kIssuer issues the copies of layer L's P tiles (after a barrier of the block).
  const auto issue_p = [&](const StepLayer<KT>& L) {
    if (tid != kIssuer) return;
    fence_async_smem();
    const size_t wo_b = rows_bytes(p.rbQ, e0, e1), qkv_b = rows_bytes(p.rbE, k0, k1);
    mbar_expect(&bar_p, static_cast<unsigned>(wo_b + qkv_b));
    bulk_copy(P, L.wo + static_cast<size_t>(e0) * p.rbQ, wo_b, &bar_p);
    const uint8_t* ws[3] = {L.wq, L.wk, L.wv};
    const int lo[4] = {0, p.QD, p.QD + p.KD, QKD};
    for (int s = 0; s < 3; ++s) {
      const int s0 = max(k0, lo[s]), s1 = min(k1, lo[s + 1]);
      bulk_copy(P + p.off_qkv + rows_bytes(p.rbE, k0, s0),
                ws[s] + static_cast<size_t>(max(0, s0 - lo[s])) * p.rbE, rows_bytes(p.rbE, s0, s1),
                &bar_p);
    }
  };
  // ... and of its G tiles.
  const auto issue_g = [&](const StepLayer<KT>& L) {
    if (tid != kIssuer) return;
    fence_async_smem();
    const size_t gu_b = rows_bytes(p.rbE, f0, f1);
    mbar_expect(&bar_g, static_cast<unsigned>(2 * gu_b));
    bulk_copy(Gr, L.gate + static_cast<size_t>(f0) * p.rbE, gu_b, &bar_g);
    bulk_copy(Gr + gu_b, L.up + static_cast<size_t>(f0) * p.rbE, gu_b, &bar_g);
  };
  // LM head: stage s holds rows v0 + lm_rows s .. (lm_rows rows), in slot s % lm_stages
  const int lm_chunks = (v1 - v0 + p.lm_rows - 1) / p.lm_rows;
  const size_t lm_slot = static_cast<size_t>(p.lm_rows) * p.rbE;
  const auto issue_lm = [&](int s) {  // kIssuer, after a barrier of the block
    if (tid != kIssuer || s >= lm_chunks) return;
    fence_async_smem();
    const int r0 = v0 + p.lm_rows * s, r1 = min(v1, r0 + p.lm_rows);
    const size_t b = rows_bytes(p.rbE, r0, r1), bulk = b & ~size_t{15};
    uint8_t* const dst = P + static_cast<size_t>(s % p.lm_stages) * lm_slot;
    const uint8_t* const src = p.out_w + static_cast<size_t>(r0) * p.rbE;
    // An odd row count of rows not a multiple of 16 bytes (the last block, an odd vocabulary):
    // the bulk copy's whole 16-byte units, the rest (< 16 bytes, even) by this thread; its
    // stores are seen by the block after the barriers before the stage is read (>= 1: the
    // stage is read lm_stages >= 2 stages later, or after the final norm).
    for (size_t i = bulk; i < b; i += 2) {
      *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
    }
    mbar_expect(&bar_lm[s % p.lm_stages], static_cast<unsigned>(bulk));
    bulk_copy(dst, src, bulk, &bar_lm[s % p.lm_stages]);
  };

  if (tid == 0) {
    mbar_init(&bar_p);
    mbar_init(&bar_g);
    mbar_init(&bar_d);
    for (auto& b : bar_lm) mbar_init(&b);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  issue_p(p.layers[0]);
  // n_past: the step's io, copied before the embedding kernel (which this launch follows)
  const int n_past = p.d_n_past[0];
  if (n_past + 1 > p.layers[0].attn.local_keys) __trap();  // the engine's contract: local mode
  const int C = p.cv;
  griddep_wait();  // the embedding of this step's token (m.x)
  // Wo and down: x[e0 + i] += the row's dot (the block's rows of x are in xres)
  const auto add_residual = [&](int i, float d) {
    const float v = xf::add_rn(xres[i], d);
    xres[i] = v;
    p.x[e0 + i] = v;
  };
  for (int l = 0; l < p.n_layer; ++l) {
    const StepLayer<KT>& L = p.layers[l];
    unsigned* const ctr = p.sync + static_cast<size_t>(kOps) * l;
    // ---- RMSNorm + Q/K/V ----
    if (l > 0) wait_for(ctr - 1, Gu);  // down (l - 1)
    stamp(p.trace, l, 0);
    norm_act<T>(xs, p.x, L.attn_norm, p.E, p.eps, shd, &sh_mean, xres, e0, e1);
    quantize(p.E);
    stamp(p.trace, l, 1);
    mbar_wait(&bar_p, static_cast<unsigned>(l & 1));  // P: Wo, Q/K/V
    rows_dot<T>(P + p.off_qkv, p.rbE, k1 - k0, p.E, in, [&](int i, float d) {
      const int r = k0 + i;
      if (r < p.QD) {
        p.q[r] = d;
      } else if (r < p.QD + p.KD) {
        p.k[r - p.QD] = d;
      } else {
        p.v[r - p.QD - p.KD] = d;
      }
    });
    stamp(p.trace, l, 2);
    arrive(ctr + 0);
    // ---- attention (the shared arrays over the Q/K/V tile) ----
    for (int u = c; u < p.n_head * C; u += G) {  // (head, block of the head) units
      auto& sm = *reinterpret_cast<DecSmem*>(P + p.off_qkv);
      attn_decode_block<KV, true>(
          L.attn, u / C, u % C, C, false, sm,
          [&] {
            wait_for(ctr + 0, Gu);
            stamp(p.trace, l, 3);
          },
          [&](int k) {
            if (u == c) stamp(p.trace, l, 12 + k);
          });
      __syncthreads();  // sm is reused by the next unit
    }
    stamp(p.trace, l, 4);
    arrive(ctr + 1);
    issue_g(L);  // after the attention: its latency-bound loads do not queue behind these
    // ---- Wo: x += Wo att ----
    wait_for(ctr + 1, Gu);
    stamp(p.trace, l, 5);
    stage_l2(xs, kQ ? p.att : p.act_att, p.QD);
    quantize(p.QD);
    rows_dot<T>(P, p.rbQ, e1 - e0, p.QD, in, add_residual);
    stamp(p.trace, l, 6);
    arrive(ctr + 2);
    if (tid == kIssuer) {  // P is free: Wo and the attention are done
      fence_async_smem();
      const size_t b = rows_bytes(p.rbF, e0, e1);
      mbar_expect(&bar_d, static_cast<unsigned>(b));
      bulk_copy(P, L.down + static_cast<size_t>(e0) * p.rbF, b, &bar_d);
    }
    // ---- RMSNorm + gate + up + SwiGLU ----
    wait_for(ctr + 2, Gu);
    stamp(p.trace, l, 7);
    norm_act<T>(xs, p.x, L.ffn_norm, p.E, p.eps, shd, &sh_mean, xres, e0, e0);
    quantize(p.E);
    stamp(p.trace, l, 8);
    mbar_wait(&bar_g, static_cast<unsigned>(l & 1));  // G: gate, up
    // the dots into gd (after the block's rows of x), then the SwiGLU with a thread per row
    float* const gd = xres + (e1 - e0);
    if constexpr (kQ) {  // gate rows then up rows, contiguous in G: one tile of 2 nr rows
      const int nr = f1 - f0;
      rows_dot<T>(Gr, p.rbE, 2 * nr, p.E, in,
                  [&](int i, float d) { gd[i < nr ? 2 * i : 2 * (i - nr) + 1] = d; });
    } else {
      const int lane = tid & 31, w = tid >> 5, nr = f1 - f0;
      const float2* xp = reinterpret_cast<const float2*>(xs);
      const uint8_t* up = Gr + static_cast<size_t>(nr) * p.rbE;
      const auto out = [&](int i, float dg, float du) {
        gd[2 * i] = dg;
        gd[2 * i + 1] = du;
      };
      int i = w;
      for (; i + kWarps < nr; i += 2 * kWarps) {  // rows i and i + 8: four chains at once
        const size_t o = static_cast<size_t>(i) * p.rbE, o2 = o + kWarps * p.rbE;
        const uint8_t* const rows[4] = {Gr + o, up + o, Gr + o2, up + o2};
        float d[4];
        fr::smem_rows_dot<T, 4>(rows, p.E, xp, xs, lane, d);
        if (lane == 0) {
          out(i, d[0], d[1]);
          out(i + kWarps, d[2], d[3]);
        }
      }
      if (i < nr) {
        const size_t o = static_cast<size_t>(i) * p.rbE;
        const uint8_t* const rows[2] = {Gr + o, up + o};
        float d[2];
        fr::smem_rows_dot<T, 2>(rows, p.E, xp, xs, lane, d);
        if (lane == 0) out(i, d[0], d[1]);
      }
    }
    __syncthreads();
    for (int i = tid; i < f1 - f0; i += kThreads) {
      const int r = f0 + i;
      p.act_g[r] =
          math::act_round(act_type_of(T), math::swiglu_one(gd[2 * i], gd[2 * i + 1], r, p.F & ~15));
    }
    stamp(p.trace, l, 9);
    arrive(ctr + 3);
    // ---- down: x += Wdown g ----
    wait_for(ctr + 3, Gu);
    stamp(p.trace, l, 10);
    stage_l2(xs, p.act_g, p.F);
    quantize(p.F);
    mbar_wait(&bar_d, static_cast<unsigned>(l & 1));  // P: down
    rows_dot<T>(P, p.rbF, e1 - e0, p.F, in, add_residual);
    stamp(p.trace, l, 11);
    arrive(ctr + 4);
    if (l + 1 < p.n_layer) {
      issue_p(p.layers[l + 1]);
    } else {
      for (int s = 0; s < p.lm_stages; ++s) issue_lm(s);
    }
  }
  // ---- final RMSNorm + LM head ----
  wait_for(p.sync + static_cast<size_t>(kOps) * p.n_layer - 1, Gu);
  stamp(p.trace, p.n_layer, 0);
  norm_act<T>(xs, p.x, p.out_norm, p.E, p.eps, shd, &sh_mean, xres, e0, e0);
  quantize(p.E);
  stamp(p.trace, p.n_layer, 1);
  for (int s = 0; s < lm_chunks; ++s) {
    mbar_wait(&bar_lm[s % p.lm_stages], static_cast<unsigned>((s / p.lm_stages) & 1));
    const int r0 = v0 + p.lm_rows * s;
    const uint8_t* stage = P + static_cast<size_t>(s % p.lm_stages) * lm_slot;
    rows_dot<T>(stage, p.rbE, min(p.lm_rows, v1 - r0), p.E, in,
                [&](int i, float d) { p.logits[r0 + i] = d; });
    __syncthreads();
    issue_lm(s + p.lm_stages);
  }
  stamp(p.trace, p.n_layer, 2);
  // Every block has passed its last wait once it counts itself here: the last one zeroes the
  // counters for the next launch (they start zeroed: DecodeStep::plan).
  if (tid == 0) {
    unsigned* const done = p.sync + static_cast<size_t>(kOps) * p.n_layer;
    if (atomicAdd(done, 1u) == Gu - 1) {
      for (int i = 0; i <= kOps * p.n_layer; ++i) p.sync[i] = 0;
      __threadfence();
    }
  }
}

template <GgmlType T, class KV>
void set_attrs(size_t smem) {
  cuda_check(
      cudaFuncSetAttribute(decode_step_kernel<T, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)),
      "decode_step_kernel attributes", __FILE__, __LINE__);
}

size_t align16(size_t n) {
  return (n + 15) & ~size_t{15};
}

// The layer table (either cache type) and the counters (kOps a layer + the exit count).
size_t table_bytes(int n_layer) {
  const size_t per = std::max(sizeof(StepLayer<float>), sizeof(StepLayer<uint16_t>));
  return (per * static_cast<size_t>(n_layer) + 255) & ~size_t{255};
}
size_t sync_bytes(int n_layer) {
  return sizeof(unsigned) * (static_cast<size_t>(kOps) * static_cast<size_t>(n_layer) + 1);
}

bool float_type(uint32_t t) {
  return t == static_cast<uint32_t>(GgmlType::F32) || t == static_cast<uint32_t>(GgmlType::F16) ||
         t == static_cast<uint32_t>(GgmlType::BF16);
}
bool q0_weight(uint32_t t) {
  return t == static_cast<uint32_t>(GgmlType::Q8_0) || t == static_cast<uint32_t>(GgmlType::Q5_0);
}

}  // namespace

size_t DecodeStep::device_bytes(int n_layer) {
  return table_bytes(n_layer) + sync_bytes(n_layer);
}

bool decode_step_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("WORKER_DECODE_STEP");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

struct DecodeStep::Impl {
  unsigned* sync = nullptr;  // in DecodeModel::device_mem, after the layer table
  size_t sync_bytes = 0;
  uint64_t* trace = nullptr;  // enable_trace()
  size_t trace_n = 0;
  uint32_t type = 0;
  bool kv_f16 = true;
  int n_layer = 0;
  StepParams<float> pf;     // FP32 cache
  StepParams<uint16_t> ph;  // FP16 cache
  ~Impl() {
    if (trace != nullptr) (void)cudaFree(trace);
  }
};

DecodeStep::~DecodeStep() {
  delete impl_;
}

namespace {

template <class KT>
StepParams<KT> fill_params(const DecodeModel& m) {
  StepParams<KT> p = {};
  const AttnShape& s = m.shape;
  p.n_layer = static_cast<int>(m.layers.size());
  p.E = static_cast<int>(m.layers[0].wq.cols);
  p.QD = s.n_head * s.head_dim;
  p.KD = s.n_head_kv * s.head_dim;
  p.F = static_cast<int>(m.layers[0].gate.rows);
  p.V = static_cast<int>(m.output.rows);
  p.n_head = s.n_head;
  p.rbE = m.layers[0].wq.row_bytes;
  p.rbQ = m.layers[0].wo.row_bytes;
  p.rbF = m.layers[0].down.row_bytes;
  p.eps = m.eps;
  p.out_norm = m.output_norm;
  p.out_w = static_cast<const uint8_t*>(m.output.data);
  p.x = m.x;
  p.q = m.q;
  p.k = m.k;
  p.v = m.v;
  p.att = m.att;
  p.act_att = m.act_att;
  p.act_g = m.act_g;
  p.logits = m.logits;
  p.d_n_past = m.d_n_past;
  return p;
}

template <class KT>
std::vector<StepLayer<KT>> layer_table(const DecodeModel& m) {
  std::vector<StepLayer<KT>> t;
  for (const DecodeLayer& d : m.layers) {
    StepLayer<KT> L = {};
    L.wq = static_cast<const uint8_t*>(d.wq.data);
    L.wk = static_cast<const uint8_t*>(d.wk.data);
    L.wv = static_cast<const uint8_t*>(d.wv.data);
    L.wo = static_cast<const uint8_t*>(d.wo.data);
    L.gate = static_cast<const uint8_t*>(d.gate.data);
    L.up = static_cast<const uint8_t*>(d.up.data);
    L.down = static_cast<const uint8_t*>(d.down.data);
    L.attn_norm = d.attn_norm;
    L.ffn_norm = d.ffn_norm;
    ActBuf a;
    a.f = m.act_att;
    L.attn =
        decode_attention_args<KT>(QkvIn{m.q, m.k, m.v, d.bq, d.bk, d.bv}, m.shape, m.rope_table,
                                  m.d_n_past, static_cast<KT*>(d.kv.k), static_cast<KT*>(d.kv.v),
                                  m.att, m.n_ctx, m.attn_scratch, d.wo.type, a);
    t.push_back(L);
  }
  return t;
}

// f(traits) for a weight type the step runs (float, Q8_0, Q5_0).
template <typename F>
void by_step_type(uint32_t t, F&& f) {
  dispatch(t, [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (Tr::kSupported) {
      if constexpr (Tr::kFamily == DotFamily::Float || q0_type<Tr::kType>()) f(tr);
    }
  });
}

}  // namespace

std::unique_ptr<DecodeStep> DecodeStep::plan(const DecodeModel& m, std::string* why) {
  const auto no = [why](const std::string& w) {
    if (why != nullptr) *why = w;
    return std::unique_ptr<DecodeStep>();
  };
  if (m.layers.empty()) return no("no layers");
  if (m.device_mem == nullptr) return no("no device memory for the step's tables");
  const AttnShape& s = m.shape;
  const DecodeLayer& l0 = m.layers[0];
  const uint32_t T = l0.wq.type;
  const bool quant = q0_weight(T);
  if (!float_type(T) && !quant) return no("weights are not F32 / F16 / BF16 / Q8_0 / Q5_0");
  const int64_t E = l0.wq.cols, QD = static_cast<int64_t>(s.n_head) * s.head_dim,
                KD = static_cast<int64_t>(s.n_head_kv) * s.head_dim, F = l0.gate.rows;
  if (s.head_dim > kDecMaxHd || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0) {
    return no("attention shape");
  }
  // Rows start 16-byte aligned (the bulk copies): float rows are multiples of 16 bytes;
  // quantized rows may be multiples of 8 only (Q8_0 of 896 columns: 952 bytes), then the
  // blocks' shares start at even rows (rg 2), every row count even.
  const int rg = l0.wq.row_bytes % 16 == 0 && l0.wo.row_bytes % 16 == 0 &&
                         l0.down.row_bytes % 16 == 0 && m.output.row_bytes % 16 == 0
                     ? 1
                     : 2;
  // odd_rows: the row count may be odd (the output: the last block takes the last row).
  const auto shaped = [T, quant, rg](const WeightView& w, int64_t rows, int64_t cols,
                                     bool odd_rows = false) {
    return w.type == T && w.rows == rows && w.cols == cols && (odd_rows || rows % rg == 0) &&
           (w.row_bytes * static_cast<size_t>(rg)) % 16 == 0 && w.data != nullptr &&
           (quant ? cols % 64 == 0 : matvec1_float_takes(w.type, w.cols));
  };
  for (const DecodeLayer& d : m.layers) {
    if (!shaped(d.wq, QD, E) || !shaped(d.wk, KD, E) || !shaped(d.wv, KD, E) ||
        !shaped(d.wo, E, QD) || !shaped(d.gate, F, E) || !shaped(d.up, F, E) ||
        !shaped(d.down, E, F)) {
      return no("layer matrices differ in type or shape");
    }
    if (d.kv.type != l0.kv.type) return no("cache types differ");
  }
  if (!shaped(m.output, m.output.rows, E, true)) return no("output matrix type or shape");
  if (QD % rg != 0 || KD % rg != 0) return no("Q / K / V rows");

  int dev = 0, sms = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const int G = sms;
  const auto share = [G, rg](int64_t rows) {
    return static_cast<size_t>(rg) * static_cast<size_t>((rows / rg + G - 1) / G);
  };
  const size_t rbE = l0.wq.row_bytes, rbQ = l0.wo.row_bytes, rbF = l0.down.row_bytes;
  const size_t wo_b = align16(share(E) * rbQ);
  const size_t qkv_b = align16(share(QD + 2 * KD) * rbE);
  const size_t down_b = align16(share(E) * rbF);
  const size_t gu_b = align16(2 * share(F) * rbE);
  const size_t p_b = std::max(down_b, wo_b + std::max(qkv_b, align16(sizeof(DecSmem))));
  const size_t widest = static_cast<size_t>(std::max({E, QD, F}));
  const size_t xf_b = align16(widest * sizeof(float));
  const size_t aq_b = quant ? align16(widest) : 0;  // the input's Q8_0 quants, then scales
  const size_t xs_b = xf_b + aq_b + (quant ? align16(widest / 32 * sizeof(float)) : 0);
  const size_t res_b = align16((share(E) + 2 * share(F)) * sizeof(float));
  constexpr size_t kStatic = 32 * sizeof(double) + 16 + (3 + kLmStages) * sizeof(uint64_t);
  // The LM head's ring takes the P and G regions: as many stages as fit, at least 2, of the
  // most rows (64, 32, 16 or 8) of which 3 fit: each stage costs a wait, a barrier and a copy
  // issue besides its rows (8-row stages of F16 rows measured 97 us for the 0.5B shape's 272
  // MB, 2.8 TB/s; perf-notes v27).
  const size_t room = static_cast<size_t>(optin) - std::min<size_t>(optin, kStatic + xs_b + res_b);
  int lm_rows = 64;
  while (lm_rows > kWarps && room / (static_cast<size_t>(lm_rows) * rbE) < 3) lm_rows /= 2;
  const size_t slot = static_cast<size_t>(lm_rows) * rbE;
  const int lm_stages = static_cast<int>(std::min<size_t>(kLmStages, room / slot));
  const size_t pg = std::max(p_b + gu_b, static_cast<size_t>(std::max(lm_stages, 2)) * slot);
  const size_t smem = pg + xs_b + res_b;
  if (lm_stages < 2 || smem + kStatic > static_cast<size_t>(optin)) {
    return no("a block's share of the weights needs " + std::to_string(smem) +
              " bytes of shared memory (" + std::to_string(optin) + " on this device)");
  }

  std::unique_ptr<DecodeStep> st(new DecodeStep());
  st->impl_ = new Impl();
  Impl& im = *st->impl_;
  im.type = T;
  im.n_layer = static_cast<int>(m.layers.size());
  im.kv_f16 = l0.kv.type == KvType::F16;
  st->blocks_ = G;
  st->smem_ = smem;
  auto* base = static_cast<uint8_t*>(m.device_mem);
  const auto finish = [&](auto& p, auto table) {
    st->local_keys_ = table[0].attn.local_keys;
    const size_t bytes = table.size() * sizeof(table[0]);
    CUDA_CHECK(cudaMemcpy(base, table.data(), bytes, cudaMemcpyHostToDevice));
    p.layers = reinterpret_cast<decltype(p.layers)>(base);
  };
  if (im.kv_f16) {
    im.ph = fill_params<uint16_t>(m);
    finish(im.ph, layer_table<uint16_t>(m));
  } else {
    im.pf = fill_params<float>(m);
    finish(im.pf, layer_table<float>(m));
  }
  im.sync_bytes = sync_bytes(im.n_layer);
  im.sync = reinterpret_cast<unsigned*>(base + table_bytes(im.n_layer));
  CUDA_CHECK(cudaMemset(im.sync, 0, im.sync_bytes));
  // Blocks a head in local mode: as many as fit, up to 8 (the per-op kernel's cluster). Fewer
  // measured slower (H100, 0.5B F16, depth 512: 4 -> 947, 2 -> 910 vs 8 -> 971 tok/s).
  const int cv = std::max(1, std::min(kDecMaxCluster, G / s.n_head));
  for (auto* p : {&im.pf.off_qkv, &im.ph.off_qkv}) *p = static_cast<unsigned>(wo_b);
  for (auto* p : {&im.pf.off_g, &im.ph.off_g}) *p = static_cast<unsigned>(p_b);
  for (auto* p : {&im.pf.off_xs, &im.ph.off_xs}) *p = static_cast<unsigned>(pg);
  for (auto* p : {&im.pf.off_res, &im.ph.off_res}) *p = static_cast<unsigned>(pg + xs_b);
  for (auto* p : {&im.pf.off_aq, &im.ph.off_aq}) *p = static_cast<unsigned>(pg + xf_b);
  for (auto* p : {&im.pf.off_ad, &im.ph.off_ad}) *p = static_cast<unsigned>(pg + xf_b + aq_b);
  im.pf.cv = im.ph.cv = cv;
  im.pf.rg = im.ph.rg = rg;
  im.pf.lm_stages = im.ph.lm_stages = lm_stages;
  im.pf.lm_rows = im.ph.lm_rows = lm_rows;
  im.pf.sync = im.ph.sync = im.sync;
  by_step_type(T, [&](auto tr) {
    constexpr GgmlType TT = decltype(tr)::kType;
    if (im.kv_f16) {
      set_attrs<TT, math::KvF16>(smem);
    } else {
      set_attrs<TT, math::KvF32>(smem);
    }
  });
  return st;
}

void DecodeStep::enable_trace() {
  Impl& im = *impl_;
  if (im.trace != nullptr) return;
  im.trace_n = static_cast<size_t>(kTracePoints) * (im.n_layer + 1) * static_cast<size_t>(blocks_);
  CUDA_CHECK(cudaMalloc(&im.trace, im.trace_n * sizeof(uint64_t)));
  CUDA_CHECK(cudaMemset(im.trace, 0, im.trace_n * sizeof(uint64_t)));
  im.pf.trace = im.ph.trace = im.trace;
}

int DecodeStep::trace_points() {
  return kTracePoints;
}

std::vector<uint64_t> DecodeStep::read_trace() const {
  const Impl& im = *impl_;
  std::vector<uint64_t> v(im.trace_n);
  if (im.trace != nullptr) {
    CUDA_CHECK(cudaMemcpy(v.data(), im.trace, v.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  }
  return v;
}

void DecodeStep::launch(cudaStream_t stream) const {
  const Impl& im = *impl_;
  const dim3 grid(static_cast<unsigned>(blocks_)), block(kThreads);
  by_step_type(im.type, [&](auto tr) {
    constexpr GgmlType TT = decltype(tr)::kType;
    if (im.kv_f16) {
      launch_pdl_smem("decode_step_kernel", decode_step_kernel<TT, math::KvF16>, grid, block, smem_,
                      stream, im.ph);
    } else {
      launch_pdl_smem("decode_step_kernel", decode_step_kernel<TT, math::KvF32>, grid, block, smem_,
                      stream, im.pf);
    }
  });
  CUDA_CHECK_LAUNCH("decode_step_kernel");
}

}  // namespace worker::kern::exact
