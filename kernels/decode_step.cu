// The exact decode step as one persistent kernel (decode_step.cuh).
//
// Grid: one block of 256 threads per SM, all resident at once (the launch is the step's only
// kernel after the embedding; the blocks of the kernel after it start only once every block
// of this one has passed its griddep_wait(), so nothing can hold an SM that a block of this
// one still needs). Every op of a layer is split over the blocks: block c takes rows
// [R c / G, R (c + 1) / G) of each product (G blocks: part()), and blocks [0, n_head * C) the
// attention (C blocks a head, in local mode's split form: each scores a share of the keys, one
// exchange of the scores between the head's blocks, then each computes the softmax itself).
// The step runs while the keys fit local mode (DecodeStep::local_keys()); beyond, the engine takes
// the launch-per-op step, whose attention blocks of a head are a hardware cluster that splits
// the keys (one block a head here measured 747 / 583 / 404 tok/s at depth 1024 / 2048 / 4096
// on the H100, 0.5B F16, against 1,044 at 512: perf-notes v19).
//
// Dependencies: every op's output (Q/K/V, the attention's scores in split mode (its C blocks score
// a share of the keys each: attn_decode_block's xchg, XchgTagged) and its output, x after Wo and
// after down, the SwiGLU output) is written as tagged values ({float, tag} in one 64-bit store;
// the tag names the launch and the op) and its readers poll the values themselves until every
// tag is the op's: no counter, no second round trip for the data (for_each_tagged,
// stage_qkv_tagged, XchgTagged::gather). The last block to finish advances the launch epoch.
// Other data other blocks wrote during the launch is read with ld.global.cg (L2).
//
// Weights before the wait: shared memory is four regions, P (Wo + Q/K/V, the attention's
// shared arrays over the Q/K/V tile, then the down tile), G (gate + up), XS (the op's input,
// rounded for its weights, or its Q8_0 quants and scales) and a small one for the block's rows of x
// (the residual adds read no global memory) and its gate / up dots. Thread 0 copies the block's
// rows of the next ops' matrices into P and G with TMA bulk copies (cp.async.bulk, an mbarrier
// counting the bytes; L2 evict-first, the weights are read once a step) as soon as the region is
// free (a block's rows of a matrix as the 16-byte units that hold them: Span; rows of Q8_0,
// Q5_0 or Q6_K need not start at a multiple of 16 bytes, the tile then starts at an offset):
//   after down (l - 1):   P <- Wo (l), Q/K/V (l)
//   attention (l):        P and G, after the attention's arrays <- its K / V stage (cp.async
//                         by warps 1.., issued before the attention's wait; attn_stage_kv)
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
// the certainty check (thread k summing the float4 groups k, k + 256, ...), each row in the vec_dot
// order of matvec1_float (fr::smem_rows_dot: independent rows interleaved, each row's chains
// unchanged), SwiGLU (math::swiglu_one, a thread per row after the dots), the activation
// roundings, and attn_decode_block for the attention. Quantized weights (a type per matrix):
// for Q8_0 / Q5_0 every block quantizes the op's whole input as quantize_row_q8_0
// (qm::act_q8_0_from) into shared memory, and each row is matvec1_quant's dot_q0_lanes (8 lane
// chains over the blocks in order, a thread each, then hsum_float_8; q0_rows); for a Q4_K /
// Q6_K down the input is quantized as quantize_row_q8_K (qm::act_q8_k_from) and the rows are
// matvec1_quant's long rows (qd::long_row_dots: the same code). The attention output and the
// SwiGLU output stay unrounded floats, quantized by every block when staged for Wo and down.
//
// Compiled with -fmad=false: every product / sum / fma is explicit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
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

using step::align16;
using step::slot_bytes;
using step::Span;
using step::span_of;

constexpr int kThreads = kDecThreads;  // the attention body's block size
constexpr int kWarps = kThreads / kWarp;
// The thread that issues the bulk copies: thread 0. (Issued by
// a thread of the last warp, the block's next barrier waited 2-3 us longer after the Wo and
// attention ops: 928 vs 947 tok/s, perf-notes v11.)
constexpr int kIssuer = 0;
constexpr int kTracePoints = 21;  // a layer's timestamps (DecodeStep::read_trace)
constexpr int kLmStages = 8;      // LM head ring: at most this many stages of lm_rows rows
// Quantized weights (Q8_0, Q5_0: the reference's dot_q0_lanes, 8 lane chains a row): 8
// threads a row, 32 rows at once.
constexpr int kQ0Chains = 8;

// The kernel's weight type: F32, F16 or BF16 (every matrix that type); Q8_0 or Q5_0 (every
// matrix that type); or Q4_K for a quantized mix: a type per matrix (Shape::t), Q8_0 or Q5_0,
// and FFN down also Q4_K or Q6_K (llama.cpp's Q4_K_M of a model whose 896-column rows fall
// back from the K-quants to Q5_0 / Q8_0). The uniform instantiations carry no per-row type
// branch and no K-quant code (the mix's measured 5% slower on the Q8_0 model, perf-notes v28).
template <GgmlType T>
__host__ __device__ constexpr bool quant_family() {
  return T == GgmlType::Q8_0 || T == GgmlType::Q5_0 || T == GgmlType::Q4_K;
}
template <GgmlType T>
__host__ __device__ constexpr bool quant_mix() {
  return T == GgmlType::Q4_K;
}
__host__ __device__ constexpr bool k_quant(uint32_t t) {
  return t == static_cast<uint32_t>(GgmlType::Q4_K) || t == static_cast<uint32_t>(GgmlType::Q6_K);
}

// A layer's matrices in StepLayer's arrays.
enum Mat : int { kMq = 0, kMk, kMv, kMo, kMgate, kMup, kMdown, kMats };

// A layer's matrix types (GgmlType) and bytes a row: the kernel copies every layer's into
// shared memory before its first wait (read by every op: from the table in global memory
// each read would be a round trip on the op's critical path).
struct Shape {
  uint32_t t[kMats];
  uint32_t rb[kMats];
};

template <class KT>
struct StepLayer {
  const uint8_t* w[kMats];  // Q, K, V, Wo, gate, up, down
  Shape sh;
  const float *attn_norm, *ffn_norm;
  DecArgs<KT> attn;
};

template <class KT>
struct StepParams {
  const StepLayer<KT>* layers;
  int n_layer;
  int E, QD, KD, F, V;  // n_embd, n_head * head_dim, n_head_kv * head_dim, n_ff, vocab
  int n_head, cv;       // heads; blocks a head in local mode
  float eps;
  const float* out_norm;
  const uint8_t* out_w;
  uint32_t out_t, out_rb;  // the output matrix's type and bytes a row
  int down_rep;            // a Q4_K down sums in the repack order (repacked(Q4_K, E))
  float *x, *logits;
  unsigned* sync;  // [0] the blocks that finished, [1] the launch epoch
  // x, the Q/K/V output, the SwiGLU output, the attention's output (as Wo reads it) and its split
  // mode's scores (kDecLocalKeys a head) as {float bits, tag} pairs (low, high word): a reader
  // polls the values themselves until their tags are the op's (tag()), no counter between
  // (DecodeStep's device memory; zero at the start).
  uint64_t *xt, *qkvt, *gt, *at, *st;
  const int32_t* d_n_past;
  unsigned off_qkv, off_g, off_xs;  // P at 0 (Wo at 0, Q/K/V and the attention at off_qkv)
  unsigned off_kst;                 // the attention's K / V stage (step::smem_layout; 0: none)
  unsigned off_res;                 // the block's rows of x (Wo / down residual) and gate / up dots
  unsigned off_aq, off_ad;          // quantized weights: the input's Q8_0 / Q8_K quants, scales
  unsigned off_abs;                 // a K-quant down: the Q8_K input's sums of 16
  unsigned off_sf;                  // a K-quant down: long_row_dots' slot arrays (P and G)
  unsigned off_shape;               // every layer's Shape
  int lm_stages;                    // 2 .. kLmStages: what fits in P and G
  int lm_rows;                      // rows a stage of the LM head
  uint64_t* trace;                  // nullptr, or kTracePoints timestamps a layer per block
};

// Block c's first row of `rows` (c = G: rows).
__device__ __forceinline__ int part(int rows, int c, int G) {
  return static_cast<int>(static_cast<long long>(rows) * c / G);
}

// ---- polls ----------------------------------------------------------------------------------
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

// A tagged value that does not come within kStallNs is a bug (a block that never writes it):
// the kernel traps (the step fails with a CUDA error, the job with CUDA_ERROR) instead of
// hanging the worker.
constexpr uint64_t kStallNs = 5'000'000'000ull;
// A poll's stall check: every 1,024th spin reads the clock; traps kStallNs after the first read.
struct StallCheck {
  uint64_t t0 = 0;
  __device__ __forceinline__ void operator()(int spins) {
    if ((spins & 1023) == 1023) {
      const uint64_t t = global_ns();
      if (t0 == 0) {
        t0 = t;
      } else if (t - t0 > kStallNs) {
        __trap();
      }
    }
  }
};

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
// f(g, group g) for the n / 4 float4 groups of the n floats (n % 4 == 0, src 16-byte aligned)
// other blocks wrote, read through L2: thread t takes groups t, t + kThreads, ..., up to 8 a
// thread with every load issued before the first is used (a stage of 4,864 floats: one round
// trip).
template <class F>
__device__ __forceinline__ void for_each_l2(const float* src, int n, F&& f) {
  constexpr int kBatch = 8;
  const int tid = static_cast<int>(threadIdx.x), n4 = n / 4;
  const float4* s4 = reinterpret_cast<const float4*>(src);
  for (int g0 = 0; g0 < n4; g0 += kBatch * kThreads) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int g = g0 + u * kThreads + tid;
      v[u] = g < n4 ? __ldcg(s4 + g) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int g = g0 + u * kThreads + tid;
      if (g < n4) f(g, v[u]);
    }
  }
}

// Tagged values: one 64-bit word, {float bits, tag}, stored and loaded whole (single-copy
// atomic), so a reader that sees the tag it waits for sees the value stored with it. Tags are
// (launch epoch << 16) | (1 + the op's sequence number in the launch): a value of an earlier
// launch (the epoch before) or of an earlier op never matches.
__device__ __forceinline__ void st_tagged(uint64_t* p, float v, unsigned tag) {
  const uint64_t w = (static_cast<uint64_t>(tag) << 32) | __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ void ld_tagged2(const uint64_t* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];"
               : "=l"(a), "=l"(b)
               : "l"(p)
               : "memory");
}
// for_each_l2 over tagged values: thread t polls its groups (4 values: two 16-byte loads each)
// until every tag is `want`, re-reading only the groups not yet complete (the polls' L2 traffic
// falls as the writers finish), then f(g, the group's floats) for each. A tag that does not come
// within kStallNs traps (StallCheck).
template <class F>
__device__ __forceinline__ void for_each_tagged(const uint64_t* src, int n, unsigned want, F&& f) {
  constexpr int kBatch = 5;  // 8 registers a group: up to 5,120 values in one batch
  const int tid = static_cast<int>(threadIdx.x), n4 = n / 4;
  for (int g0 = 0; g0 < n4; g0 += kBatch * kThreads) {
    uint64_t w[kBatch][4];
    unsigned need = 0;  // the groups of this batch still to complete (bit u)
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (g0 + u * kThreads + tid < n4) need |= 1u << u;
    }
    StallCheck stall;
    for (int spins = 0; need != 0; ++spins) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if ((need >> u) & 1u) {
          const int g = g0 + u * kThreads + tid;
          ld_tagged2(src + 4 * g, w[u][0], w[u][1]);
          ld_tagged2(src + 4 * g + 2, w[u][2], w[u][3]);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        bool ok = true;
#pragma unroll
        for (int k = 0; k < 4; ++k) ok = ok && static_cast<unsigned>(w[u][k] >> 32) == want;
        if (ok) need &= ~(1u << u);
      }
      stall(spins);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int g = g0 + u * kThreads + tid;
      const auto v = [&](int k) { return __uint_as_float(static_cast<unsigned>(w[u][k])); };
      if (g < n4) f(g, make_float4(v(0), v(1), v(2), v(3)));
    }
  }
}

// A block's tagged values t = tid + u kThreads < n (u < kPer), each thread's polled together
// (`word(u)`: the address of its value u) until every tag is `want`, re-reading only those not
// yet there; w[u] then holds value tid + u kThreads (the stall trap as for_each_tagged's).
template <int kPer, class Word>
__device__ __forceinline__ void poll_tagged(uint64_t (&w)[kPer], int n, unsigned want, Word word) {
  const int tid = static_cast<int>(threadIdx.x);
  unsigned need = 0;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (tid + u * kThreads < n) need |= 1u << u;
  }
  StallCheck stall;
  for (int spins = 0; need != 0; ++spins) {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      if ((need >> u) & 1u) {
        asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w[u]) : "l"(word(u)) : "memory");
      }
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      if (static_cast<unsigned>(w[u] >> 32) == want) need &= ~(1u << u);
    }
    stall(spins);
  }
}

// The attention's split mode through tagged values (attn_decode_block's xchg, kTagged): block r
// of head h puts its scores at ts[h kDecLocalKeys + j] (tag: the layer's), and every block of
// the head polls all n_att of them into its shared array (each thread its up to
// kDecLocalKeys / kThreads keys together, re-reading only those not yet there), their max by
// block_max. No counter, no barrier of the head's blocks: the scores are the poll.
struct XchgTagged {
  static constexpr bool kTagged = true;
  uint64_t* ts;
  unsigned tag;
  __device__ __forceinline__ void put(int h, int j, float s) const {
    st_tagged(ts + static_cast<size_t>(h) * kDecLocalKeys + j, s, tag);
  }
  __device__ __forceinline__ float gather(float* sc, int h, int n, float* shf) const {
    constexpr int kPer = kDecLocalKeys / kThreads;
    static_assert(kPer * kThreads == kDecLocalKeys, "the keys over the block");
    const int tid = static_cast<int>(threadIdx.x);
    const uint64_t* const src = ts + static_cast<size_t>(h) * kDecLocalKeys;
    uint64_t w[kPer] = {};
    poll_tagged(w, n, tag, [src, tid](int u) { return src + tid + u * kThreads; });
    float mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int j = tid + u * kThreads;
      if (j < n) {
        const float s = __uint_as_float(static_cast<unsigned>(w[u]));
        sc[j] = s;
        mx = fmaxf(mx, s);
      }
    }
    return block_max(mx, shf);  // its barriers also publish sc to the block
  }
};

// The attention's inputs of head h from the tagged Q/K/V output (q at h hd, k and v of its KV
// group g at QD + g hd and QD + KD + g hd) into dst[0 .. 3 hd) (q, k, v), once every tag is
// `want`: each thread polls its (up to 3) values together, re-reading only those not yet there,
// as for_each_tagged. Ends with a barrier.
__device__ __forceinline__ void stage_qkv_tagged(float* dst, const uint64_t* src, int h, int g,
                                                 int hd, int QD, int KD, unsigned want) {
  constexpr int kPer = 3 * kDecMaxHd / kThreads;
  static_assert(kPer * kThreads == 3 * kDecMaxHd, "3 hd values over the block");
  const int tid = static_cast<int>(threadIdx.x), n = 3 * hd;
  const auto at = [&](int t) {
    const int s = t / hd, i = t - s * hd;
    return src + (s == 0 ? h * hd : QD + (s - 1) * KD + g * hd) + i;
  };
  uint64_t w[kPer] = {};
  poll_tagged(w, n, want, [&](int u) { return at(tid + u * kThreads); });
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int t = tid + u * kThreads;
    if (t < n) dst[t] = __uint_as_float(static_cast<unsigned>(w[u]));
  }
  __syncthreads();
}

// The RMSNorm's weight, a constant of the model: loaded before the op's wait, so that its
// round trip overlaps the wait (thread t holds w[t + kThreads u], u < kNormEarly; a wider
// model's further columns are loaded after the sum).
constexpr int kNormEarly = 8;
struct NormW {
  float v[kNormEarly];
};
__device__ __forceinline__ NormW norm_w(const float* w, int n) {
  NormW r;
#pragma unroll
  for (int u = 0; u < kNormEarly; ++u) {
    const int i = u * kThreads + static_cast<int>(threadIdx.x);
    r.v[u] = i < n ? __ldg(w + i) : 0.0f;
  }
  return r;
}

// xs = rmsnorm(x) * w rounded for T (ex_rmsnorm_act_kernel's values): x is read from L2 (xt:
// the tagged copy, polled until its tags are `want`; nullptr: x), w's first columns are in wp
// (norm_w). Also keeps x[r0 .. r1) in keep[0 ..].
template <GgmlType T>
__device__ void norm_act(float* xs, const float* x, const uint64_t* xt, unsigned want,
                         const float* w, const NormW& wp, int n, float eps, double* shd,
                         float* sh_mean, float* keep, int r0, int r1) {
  const int tid = static_cast<int>(threadIdx.x);
  double s = 0.0;  // thread k: columns 4k .. 4k + 3, 4 (k + kThreads) .., in order (a tree:
                   // rms_mean_certain's bound holds for any order)
  const auto take = [&](int g, float4 v) {
    reinterpret_cast<float4*>(xs)[g] = v;
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * g + j;
      if (i >= r0 && i < r1) keep[i - r0] = e[j];
      s += static_cast<double>(e[j] * e[j]);
    }
  };
  if (xt != nullptr) {
    for_each_tagged(xt, n, want, take);
  } else {
    for_each_l2(x, n, take);
  }
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
  const auto put = [&](int i, float wi) {
    xs[i] = math::act_round(act_type_of(T), (xs[i] * scale) * wi);
  };
#pragma unroll
  for (int u = 0; u < kNormEarly; ++u) {
    const int i = u * kThreads + tid;
    if (i < n) put(i, wp.v[u]);
  }
  constexpr int kDone = kNormEarly * kThreads;
  if (n > kDone) {
    for_each_batched<kThreads>(
        n - kDone, [w](int i) { return __ldg(w + kDone + i); },
        [&](int i, float wi) { put(kDone + i, wi); });
  }
  __syncthreads();
}

// xs = n floats other blocks wrote (already rounded), from their tagged copy once every tag is
// `want`.
__device__ __forceinline__ void stage_tagged(float* xs, const uint64_t* src, int n, unsigned want) {
  for_each_tagged(src, n, want, [xs](int g, float4 v) { reinterpret_cast<float4*>(xs)[g] = v; });
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
// quantize_q8_0 as a call: one copy of its code for the step's four sites. The Q8_0 step
// only: there it measured +2.1% decode on the H100, while Q4_K_M's step (whose Q5_0 ops use it)
// lost 2.5% (perf-notes v49).
__device__ __noinline__ void quantize_q8_0_call(const float* xs, int n, int8_t* aq, float* ad) {
  quantize_q8_0(xs, n, aq, ad);
}

// A K-quant down's input xs[0 .. n) (n % 256 == 0) as the reference quantizes it for Q4_K /
// Q6_K weights (quantize_row_q8_K: qm::act_q8_k_from, a warp a super-block) into aq / ad / abs.
// Every thread of the block calls it.
__device__ __forceinline__ void quantize_q8_k(const float* xs, int n, int8_t* aq, float* ad,
                                              int32_t* abs) {
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5;
  for (int k = w; k < n / 256; k += kWarps) {  // warp-uniform
    const float4* xp = reinterpret_cast<const float4*>(xs + 256 * k + 8 * lane);
    const float4 a = xp[0], b = xp[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    qm::act_q8_k_from(v, aq, ad, abs, static_cast<size_t>(k));
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

// Chain c of a row (pw: its words) over `units` 32-blocks (even), two blocks a step: acc =
// fma(d_w * d_a, float(int of elements 4c .. 4c + 3), acc).
template <GgmlType T>
__device__ __forceinline__ float q0_chain(const uint32_t* pw, int units, int c, const uint32_t* ya,
                                          const float2* da) {
  constexpr int kPairWords = qd::block_bytes<T>() / 2;  // 2 blocks = kPairWords words
  float acc = 0.0f;
#pragma unroll 2
  for (int u = 0; u < units; u += 2, pw += kPairWords, ya += 2 * kQ0Chains, ++da) {
    int s0, s1;
    float dw0, dw1;
    q0_pair<T>(pw, c, ya[0], ya[kQ0Chains], s0, s1, dw0, dw1);
    const float2 a = *da;
    acc = qm::lane_step(dw0 * a.x, s0, acc);
    acc = qm::lane_step(dw1 * a.y, s1, acc);
  }
  return acc;
}

// A quantized row in shared memory (4-byte aligned) and whether it is Q8_0 (else Q5_0).
struct QRow {
  const uint8_t* p;
  bool q8;
};
// q0_rows' rows: all Q8_0, all Q5_0 (the chain's type fixed at compile time: the loop has
// no branch on it), or a type a row (QRow::q8).
enum class Q0Rows { Q8_0, Q5_0, PerRow };

// out(i, dot of row i) for the nr rows at(i) of `units` 32-blocks (even), Q8_0 / Q5_0 weights
// against the input's quants aq (as words) and scales ad: bit for bit dot_q0_lanes
// (matvec1_quant's qd:: decomposition, unit_slots / chain_pass / combine): thread (row i,
// chain c) runs chain c over the blocks in order (q0_chain), and the row's 8 lanes combine in
// hsum_float_8's tree.
template <Q0Rows K, class RowAt, class Out>
__device__ __forceinline__ void q0_rows(RowAt at, int nr, int units, const uint32_t* aq,
                                        const float* ad, Out&& out) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  for (int t0 = 0; t0 < kQ0Chains * nr; t0 += kThreads) {  // uniform over the block
    const int i = (t0 + tid) / kQ0Chains, c = (t0 + tid) % kQ0Chains;
    float acc = 0.0f;
    if (i < nr) {
      const QRow r = at(i);
      const uint32_t* pw = reinterpret_cast<const uint32_t*>(r.p);
      const float2* da = reinterpret_cast<const float2*>(ad);
      if constexpr (K == Q0Rows::Q8_0) {
        acc = q0_chain<GgmlType::Q8_0>(pw, units, c, aq + c, da);
      } else if constexpr (K == Q0Rows::Q5_0) {
        acc = q0_chain<GgmlType::Q5_0>(pw, units, c, aq + c, da);
      } else {
        acc = r.q8 ? q0_chain<GgmlType::Q8_0>(pw, units, c, aq + c, da)
                   : q0_chain<GgmlType::Q5_0>(pw, units, c, aq + c, da);
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

// out(i, dot of row i) for the nr rows of one matrix (type t, rb bytes a row) at tile (its
// span's offset included), `cols` columns.
template <GgmlType T, class Out>
__device__ __forceinline__ void rows_dot(const uint8_t* tile, uint32_t t, size_t rb, int nr,
                                         int cols, const StepIn& in, Out&& out) {
  if constexpr (quant_family<T>()) {
    const auto at = [=](int i) { return QRow{tile + static_cast<size_t>(i) * rb, true}; };
    if (quant_mix<T>() ? t == static_cast<uint32_t>(GgmlType::Q8_0) : T == GgmlType::Q8_0) {
      q0_rows<Q0Rows::Q8_0>(at, nr, cols / 32, in.aq, in.ad, out);
    } else {
      q0_rows<Q0Rows::Q5_0>(at, nr, cols / 32, in.aq, in.ad, out);
    }
  } else {
    tile_rows<T>(tile, rb, nr, cols, in.xs, out);
  }
}

template <GgmlType T, class KV>
__global__ void __launch_bounds__(kThreads, 1) decode_step_kernel(StepParams<typename KV::T> p) {
  using KT = typename KV::T;
  constexpr bool kQuant = quant_family<T>();
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
    if constexpr (T == GgmlType::Q8_0) {
      quantize_q8_0_call(xs, n, aq, ad);
    } else if constexpr (kQuant) {
      quantize_q8_0(xs, n, aq, ad);
    }
  };
  // xres: this block's rows [e0, e1) of x, as the norm read them or Wo / down wrote them (the
  // residual adds need no global load), then its gate and up dots before the SwiGLU (gd).
  float* const xres = reinterpret_cast<float*>(smem + p.off_res);
  const int QKD = p.QD + 2 * p.KD;
  Shape* const shapes = reinterpret_cast<Shape*>(smem + p.off_shape);
  // this block's rows of each product
  const int e0 = part(p.E, c, G), e1 = part(p.E, c + 1, G);  // Wo, down
  const int k0 = part(QKD, c, G), k1 = part(QKD, c + 1, G);  // Q/K/V
  const int f0 = part(p.F, c, G), f1 = part(p.F, c + 1, G);  // gate, up
  const int v0 = part(p.V, c, G), v1 = part(p.V, c + 1, G);  // LM head

  // Q/K/V: segment s (Q, K, V) holds this block's rows [max(k0, lo(s)), min(k1, lo(s + 1)))
  // of matrix s (rows r0 .. r1 of it), copied as `sp` into P at `at` (the slots follow
  // each other from off_qkv).
  // (from the parameters at each use: an array here stays in registers through the layer)
  const auto lo = [&](int s) { return s == 0 ? 0 : s == 1 ? p.QD : s == 2 ? p.QD + p.KD : QKD; };
  struct Seg {
    Span sp;
    unsigned at;
    int s0;  // the segment's first row of the block's Q/K/V rows (k0 .. k1)
  };
  const auto qkv_segs = [&](const Shape& sh, Seg(&sg)[3]) {
    unsigned at = p.off_qkv;
    for (int s = 0; s < 3; ++s) {
      const int s0 = max(k0, lo(s)), s1 = min(k1, lo(s + 1));
      sg[s] = {span_of(sh.rb[s], s0 - lo(s), s1 - lo(s)), at, s0};
      at += static_cast<unsigned>(slot_bytes(s1 - s0, sh.rb[s]));
    }
  };
  // kIssuer issues the copies of layer l's P tiles (after a barrier of the block).
  const auto issue_p = [&](int l) {
    if (tid != kIssuer) return;
    fence_async_smem();
    const StepLayer<KT>& L = p.layers[l];
    const Shape& sh = shapes[l];
    const Span wo = span_of(sh.rb[kMo], e0, e1);
    Seg sg[3];
    qkv_segs(sh, sg);
    mbar_expect(&bar_p, wo.bytes + sg[0].sp.bytes + sg[1].sp.bytes + sg[2].sp.bytes);
    bulk_copy(P, L.w[kMo] + wo.lo, wo.bytes, &bar_p);
    for (int s = 0; s < 3; ++s)
      bulk_copy(P + sg[s].at, L.w[s] + sg[s].sp.lo, sg[s].sp.bytes, &bar_p);
  };
  // ... and of its G tiles: gate at 0, up after the gate's slot.
  const auto up_at = [&](const Shape& sh) {
    return static_cast<unsigned>(slot_bytes(f1 - f0, sh.rb[kMgate]));
  };
  // part 0: G's expectation for both and gate's copy; part 1: up's copy (G's bar completes when
  // both have landed); part 2: both at once.
  const auto issue_g = [&](int l, int part) {
    if (tid != kIssuer) return;
    fence_async_smem();
    const StepLayer<KT>& L = p.layers[l];
    const Shape& sh = shapes[l];
    const Span gs = span_of(sh.rb[kMgate], f0, f1), us = span_of(sh.rb[kMup], f0, f1);
    if (part != 1) {
      mbar_expect(&bar_g, gs.bytes + us.bytes);
      bulk_copy(Gr, L.w[kMgate] + gs.lo, gs.bytes, &bar_g);
    }
    if (part != 0) bulk_copy(Gr + up_at(sh), L.w[kMup] + us.lo, us.bytes, &bar_g);
  };
  // LM head: stage s holds rows v0 + lm_rows s .. (lm_rows rows), in slot s % lm_stages
  const int lm_chunks = (v1 - v0 + p.lm_rows - 1) / p.lm_rows;
  const size_t lm_slot = slot_bytes(p.lm_rows, p.out_rb);
  const auto lm_span = [&](int s) {
    const int r0 = v0 + p.lm_rows * s;
    return span_of(p.out_rb, r0, min(v1, r0 + p.lm_rows));
  };
  const auto issue_lm = [&](int s) {  // kIssuer, after a barrier of the block
    if (tid != kIssuer || s >= lm_chunks) return;
    fence_async_smem();
    const Span sp = lm_span(s);
    mbar_expect(&bar_lm[s % p.lm_stages], sp.bytes);
    bulk_copy(P + static_cast<size_t>(s % p.lm_stages) * lm_slot, p.out_w + sp.lo, sp.bytes,
              &bar_lm[s % p.lm_stages]);
  };

  if (tid == 0) {
    mbar_init(&bar_p);
    mbar_init(&bar_g);
    mbar_init(&bar_d);
    for (auto& b : bar_lm) mbar_init(&b);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = tid; i < p.n_layer; i += kThreads) shapes[i] = p.layers[i].sh;  // host-written
  __syncthreads();
  issue_p(0);
  // n_past: the step's io, copied before the embedding kernel (which this launch follows)
  const int n_past = p.d_n_past[0];
  if (n_past + 1 > p.layers[0].attn.local_keys) __trap();  // the engine's contract: local mode
  const int C = p.cv;
  griddep_wait();  // the embedding of this step's token (m.x)
  // This launch's tags: the epoch the previous launch's last block advanced (after this
  // launch's griddep_wait), then x after Wo (l) 3 l + 1, the SwiGLU output 3 l + 2, x after
  // down (l) 3 l + 3; the Q/K/V output, the split mode's scores and the attention's output
  // (their own buffers) l + 1.
  const unsigned epoch = p.sync[1];
  const auto tag = [epoch](int seq) { return (epoch << 16) | static_cast<unsigned>(seq); };
  // The attention's K / V stage: after the block's DecSmem in P, and over G, which is free
  // from gate + up (l - 1) to the end of attention (l).
  uint32_t* const kst = p.off_kst != 0 ? reinterpret_cast<uint32_t*>(P + p.off_kst) : nullptr;
  // Wo and down: x[e0 + i] += the row's dot (the block's rows of x are in xres), stored with
  // tag t (x after Wo (l): tag(3 l + 1), after down (l): tag(3 l + 3))
  const auto add_residual = [&](unsigned t) {
    return [&, t](int i, float d) {
      const float v = xf::add_rn(xres[i], d);
      xres[i] = v;
      st_tagged(p.xt + e0 + i, v, t);
    };
  };
  for (int l = 0; l < p.n_layer; ++l) {
    const StepLayer<KT>& L = p.layers[l];
    const Shape& sh = shapes[l];
    // ---- RMSNorm + Q/K/V ----
    const NormW wa = norm_w(L.attn_norm, p.E);
    stamp(p.trace, l, 0);
    // x: the embedding (layer 0, ordered by griddep_wait), else down (l - 1)'s, tagged
    norm_act<T>(xs, p.x, l > 0 ? p.xt : nullptr, tag(3 * l), L.attn_norm, wa, p.E, p.eps, shd,
                &sh_mean, xres, e0, e1);
    quantize(p.E);
    stamp(p.trace, l, 1);
    mbar_wait(&bar_p, static_cast<unsigned>(l & 1));  // P: Wo, Q/K/V
    const auto qkv_out = [&](int i, float d) { st_tagged(p.qkvt + k0 + i, d, tag(l + 1)); };
    if constexpr (kQuant) {  // the three segments' rows, each with its matrix's type
      Seg sg[3];
      qkv_segs(sh, sg);
      const auto seg_row = [&](const Seg& g, int m, int r) {
        return QRow{P + g.at + g.sp.off + static_cast<size_t>(r - g.s0) * sh.rb[m],
                    sh.t[m] == static_cast<uint32_t>(GgmlType::Q8_0)};
      };
      const auto at = [&](int i) {  // constant indices: sg stays in registers
        const int r = k0 + i;
        return r < lo(1)   ? seg_row(sg[0], kMq, r)
               : r < lo(2) ? seg_row(sg[1], kMk, r)
                           : seg_row(sg[2], kMv, r);
      };
      if (quant_mix<T>() && (sh.t[kMq] != sh.t[kMk] || sh.t[kMq] != sh.t[kMv])) {
        if constexpr (quant_mix<T>())
          q0_rows<Q0Rows::PerRow>(at, k1 - k0, p.E / 32, in.aq, in.ad, qkv_out);
      } else if (quant_mix<T>() ? sh.t[kMq] == static_cast<uint32_t>(GgmlType::Q8_0)
                                : T == GgmlType::Q8_0) {
        q0_rows<Q0Rows::Q8_0>(at, k1 - k0, p.E / 32, in.aq, in.ad, qkv_out);
      } else {
        q0_rows<Q0Rows::Q5_0>(at, k1 - k0, p.E / 32, in.aq, in.ad, qkv_out);
      }
    } else {  // float rows are multiples of 16 bytes: the three slots are one tile
      rows_dot<T>(P + p.off_qkv, sh.t[kMq], sh.rb[kMq], k1 - k0, p.E, in, qkv_out);
    }
    stamp(p.trace, l, 2);
    __syncthreads();  // the block's reads of the Q/K/V tile, before the attention's arrays over it
    // ---- attention (the shared arrays over the Q/K/V tile) ----
    for (int u = c; u < p.n_head * C; u += G) {  // (head, block of the head) units
      auto& sm = *reinterpret_cast<DecSmem*>(P + p.off_qkv);
      attn_decode_block<KV, true>(
          L.attn, u / C, u % C, C, false, sm, kst, true,
          [&] {  // this head's q / k / v, tagged by every block's Q/K/V, into sm.r32
            const int hh = u / C;
            stage_qkv_tagged(sm.r32, p.qkvt, hh, hh / L.attn.group, L.attn.hd, p.QD, p.KD,
                             tag(l + 1));
            stamp(p.trace, l, 3);
            const float* const in = sm.r32;
            const int hd = L.attn.hd;
            return [in, hd](int w, int i) { return in[w * hd + i]; };
          },
          [&](int k) {
            if (u == c) stamp(p.trace, l, k < 5 ? 12 + k : 20);  // 20: own scores out
          },
          XchgTagged{p.st, tag(l + 1)},  // split mode (its own buffer)
          [&](size_t i, float o) {       // tagged: l + 1 (its own buffer's sequence)
            st_tagged(p.at + i, dec_act(L.attn.act_mode, o), tag(l + 1));
          });
      __syncthreads();  // sm and the stage are reused by the next unit, the stage by gate + up
    }
    stamp(p.trace, l, 4);
    // Copies in flight lengthen every poll (perf-notes v34); each type's copies go where they
    // cost least, measured: gate + up after the attention (Q8_0), after Wo's poll (Q4_K_M and the
    // others), or split between the two (F16: gate's copy, then up's; v37, +1.2% decode).
    constexpr bool kLateG = T != GgmlType::Q8_0;
    constexpr bool kSplitG = T == GgmlType::F16;
    if (!kLateG || kSplitG) issue_g(l, kSplitG ? 0 : 2);  // after the attention's loads
    // ---- Wo: x += Wo att ----
    stamp(p.trace, l, 5);
    stage_tagged(xs, p.at, p.QD, tag(l + 1));
    if (kLateG) issue_g(l, kSplitG ? 1 : 2);
    stamp(p.trace, l, 19);
    quantize(p.QD);
    rows_dot<T>(P + span_of(sh.rb[kMo], e0, e1).off, sh.t[kMo], sh.rb[kMo], e1 - e0, p.QD, in,
                add_residual(tag(3 * l + 1)));
    stamp(p.trace, l, 6);
    __syncthreads();  // the block's reads of P (Wo) are done before the down copy into it
    const Span ds = span_of(sh.rb[kMdown], e0, e1);
    // down's copy: P is free (Wo and the attention are done); issued after the ffn norm's poll
    // (Q8_0) or before it (the others), measured as kLateG
    const auto issue_d = [&] {
      if (tid != kIssuer) return;
      fence_async_smem();
      mbar_expect(&bar_d, ds.bytes);
      bulk_copy(P, L.w[kMdown] + ds.lo, ds.bytes, &bar_d);
    };
    if (kLateG) issue_d();
    // ---- RMSNorm + gate + up + SwiGLU ----
    const NormW wf = norm_w(L.ffn_norm, p.E);
    stamp(p.trace, l, 7);
    norm_act<T>(xs, nullptr, p.xt, tag(3 * l + 1), L.ffn_norm, wf, p.E, p.eps, shd, &sh_mean, xres,
                e0, e0);
    if (!kLateG) issue_d();
    quantize(p.E);
    stamp(p.trace, l, 8);
    mbar_wait(&bar_g, static_cast<unsigned>(l & 1));  // G: gate, up
    // the dots into gd (after the block's rows of x), then the SwiGLU with a thread per row
    float* const gd = xres + (e1 - e0);
    {
      const int nr = f1 - f0;
      const uint8_t* const gt = Gr + span_of(sh.rb[kMgate], f0, f1).off;
      const uint8_t* const ut = Gr + up_at(sh) + span_of(sh.rb[kMup], f0, f1).off;
      if constexpr (kQuant) {  // gate rows then up rows: one set of 2 nr rows
        const bool gq8 = sh.t[kMgate] == static_cast<uint32_t>(GgmlType::Q8_0);
        const bool uq8 = sh.t[kMup] == static_cast<uint32_t>(GgmlType::Q8_0);
        const auto at = [&](int i) {
          return i < nr ? QRow{gt + static_cast<size_t>(i) * sh.rb[kMgate], gq8}
                        : QRow{ut + static_cast<size_t>(i - nr) * sh.rb[kMup], uq8};
        };
        const auto out = [&](int i, float d) { gd[i < nr ? 2 * i : 2 * (i - nr) + 1] = d; };
        if (quant_mix<T>() && gq8 != uq8) {
          if constexpr (quant_mix<T>())
            q0_rows<Q0Rows::PerRow>(at, 2 * nr, p.E / 32, in.aq, in.ad, out);
        } else if (quant_mix<T>() ? gq8 : T == GgmlType::Q8_0) {
          q0_rows<Q0Rows::Q8_0>(at, 2 * nr, p.E / 32, in.aq, in.ad, out);
        } else {
          q0_rows<Q0Rows::Q5_0>(at, 2 * nr, p.E / 32, in.aq, in.ad, out);
        }
      } else {
        const int lane = tid & 31, w = tid >> 5;
        const size_t rb = sh.rb[kMgate];
        const float2* xp = reinterpret_cast<const float2*>(xs);
        const auto out = [&](int i, float dg, float du) {
          gd[2 * i] = dg;
          gd[2 * i + 1] = du;
        };
        int i = w;
        for (; i + kWarps < nr; i += 2 * kWarps) {  // rows i and i + 8: four chains at once
          const size_t o = static_cast<size_t>(i) * rb, o2 = o + kWarps * rb;
          const uint8_t* const rows[4] = {gt + o, ut + o, gt + o2, ut + o2};
          float d[4];
          fr::smem_rows_dot<T, 4>(rows, p.E, xp, xs, lane, d);
          if (lane == 0) {
            out(i, d[0], d[1]);
            out(i + kWarps, d[2], d[3]);
          }
        }
        if (i < nr) {
          const size_t o = static_cast<size_t>(i) * rb;
          const uint8_t* const rows[2] = {gt + o, ut + o};
          float d[2];
          fr::smem_rows_dot<T, 2>(rows, p.E, xp, xs, lane, d);
          if (lane == 0) out(i, d[0], d[1]);
        }
      }
    }
    __syncthreads();
    for (int i = tid; i < f1 - f0; i += kThreads) {
      const int r = f0 + i;
      st_tagged(
          p.gt + r,
          math::act_round(act_type_of(T), math::swiglu_one(gd[2 * i], gd[2 * i + 1], r, p.F & ~15)),
          tag(3 * l + 2));
    }
    stamp(p.trace, l, 9);
    __syncthreads();  // the block's reads of xs (gate + up) are done before the stage
    // ---- down: x += Wdown g ----
    stamp(p.trace, l, 10);
    stage_tagged(xs, p.gt, p.F, tag(3 * l + 2));
    stamp(p.trace, l, 17);
    const uint32_t td = sh.t[kMdown];
    const uint8_t* const dt = P + ds.off;
    if constexpr (quant_mix<T>()) {
      if (k_quant(td)) {  // Q8_K input; the long rows' slots of all units at once, then chains
        int32_t* const abs = reinterpret_cast<int32_t*>(smem + p.off_abs);
        quantize_q8_k(xs, p.F, aq, ad, abs);
        stamp(p.trace, l, 18);
        const auto put_x = add_residual(tag(3 * l + 3));
        mbar_wait(&bar_d, static_cast<unsigned>(l & 1));  // P: down
        const int nr = e1 - e0, units = p.F / 32;
        int* const S = reinterpret_cast<int*>(smem + p.off_sf);
        float* const F =
            reinterpret_cast<float*>(S + static_cast<size_t>(nr) * units * qd::kSlotStride);
        const size_t rb = sh.rb[kMdown];
        const auto row = [&](int r) { return dt + static_cast<size_t>(r) * rb; };
        if (td == static_cast<uint32_t>(GgmlType::Q6_K)) {
          qd::long_row_dots<GgmlType::Q6_K, false, kThreads>(row, nr, units, aq, ad, abs, S, F,
                                                             put_x);
        } else if (p.down_rep != 0) {
          qd::long_row_dots<GgmlType::Q4_K, true, kThreads>(row, nr, units, aq, ad, abs, S, F,
                                                            put_x);
        } else {
          qd::long_row_dots<GgmlType::Q4_K, false, kThreads>(row, nr, units, aq, ad, abs, S, F,
                                                             put_x);
        }
      }
    }
    if (!quant_mix<T>() || !k_quant(td)) {
      quantize(p.F);
      stamp(p.trace, l, 18);
      const auto put_x = add_residual(tag(3 * l + 3));
      mbar_wait(&bar_d, static_cast<unsigned>(l & 1));  // P: down
      rows_dot<T>(dt, td, sh.rb[kMdown], e1 - e0, p.F, in, put_x);
    }
    stamp(p.trace, l, 11);
    __syncthreads();  // the block's reads of P (down) are done before the next copies into it
    if (l + 1 < p.n_layer) {
      issue_p(l + 1);
    } else {
      for (int s = 0; s < p.lm_stages; ++s) issue_lm(s);
    }
  }
  // ---- final RMSNorm + LM head ----
  const NormW wo = norm_w(p.out_norm, p.E);
  stamp(p.trace, p.n_layer, 0);
  norm_act<T>(xs, nullptr, p.xt, tag(3 * p.n_layer), p.out_norm, wo, p.E, p.eps, shd, &sh_mean,
              xres, e0, e0);
  quantize(p.E);
  stamp(p.trace, p.n_layer, 1);
  for (int s = 0; s < lm_chunks; ++s) {
    mbar_wait(&bar_lm[s % p.lm_stages], static_cast<unsigned>((s / p.lm_stages) & 1));
    const int r0 = v0 + p.lm_rows * s;
    const uint8_t* stage = P + static_cast<size_t>(s % p.lm_stages) * lm_slot + lm_span(s).off;
    rows_dot<T>(stage, p.out_t, p.out_rb, min(p.lm_rows, v1 - r0), p.E, in,
                [&](int i, float d) { p.logits[r0 + i] = d; });
    __syncthreads();
    issue_lm(s + p.lm_stages);
  }
  stamp(p.trace, p.n_layer, 2);
  // Every block has passed its last poll once it counts itself here: the last one zeroes the
  // count and advances the epoch for the next launch (both start zeroed: DecodeStep::plan).
  if (tid == 0) {
    unsigned* const done = p.sync;
    if (atomicAdd(done, 1u) == Gu - 1) {
      p.sync[0] = 0;
      p.sync[1] = (epoch + 1) & 0xFFFFu;  // the next launch's
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

// The layer table (either cache type), then the exit count and the launch epoch, then the
// tagged values.
size_t table_bytes(int n_layer) {
  const size_t per = std::max(sizeof(StepLayer<float>), sizeof(StepLayer<uint16_t>));
  return (per * static_cast<size_t>(n_layer) + 255) & ~size_t{255};
}
constexpr size_t kSyncBytes = 256;  // the exit count and the epoch, 256-aligned
// x, the SwiGLU output, the attention's output, the Q/K/V output, the split mode's scores
size_t tagged_bytes(int n_embd, int n_ff, int n_q, int n_kv, int n_head) {
  return sizeof(uint64_t) *
         (static_cast<size_t>(n_embd) + static_cast<size_t>(n_ff) + 2 * static_cast<size_t>(n_q) +
          2 * static_cast<size_t>(n_kv) + static_cast<size_t>(n_head) * kDecLocalKeys);
}

bool float_type(uint32_t t) {
  return t == static_cast<uint32_t>(GgmlType::F32) || t == static_cast<uint32_t>(GgmlType::F16) ||
         t == static_cast<uint32_t>(GgmlType::BF16);
}
bool q0_weight(uint32_t t) {
  return t == static_cast<uint32_t>(GgmlType::Q8_0) || t == static_cast<uint32_t>(GgmlType::Q5_0);
}

}  // namespace

size_t DecodeStep::device_bytes(int n_layer, int n_head, int n_embd, int n_ff, int n_q, int n_kv) {
  return table_bytes(n_layer) + kSyncBytes + tagged_bytes(n_embd, n_ff, n_q, n_kv, n_head);
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
  p.eps = m.eps;
  p.out_norm = m.output_norm;
  p.out_w = static_cast<const uint8_t*>(m.output.data);
  p.out_t = m.output.type;
  p.out_rb = static_cast<uint32_t>(m.output.row_bytes);
  p.down_rep = repacked(GgmlType::Q4_K, p.E) ? 1 : 0;
  p.x = m.x;
  p.logits = m.logits;
  p.d_n_past = m.d_n_past;
  return p;
}

// A layer's matrices in StepLayer's order (Mat).
std::array<const WeightView*, kMats> mats(const DecodeLayer& d) {
  return {&d.wq, &d.wk, &d.wv, &d.wo, &d.gate, &d.up, &d.down};
}

template <class KT>
std::vector<StepLayer<KT>> layer_table(const DecodeModel& m) {
  std::vector<StepLayer<KT>> t;
  for (const DecodeLayer& d : m.layers) {
    StepLayer<KT> L = {};
    const std::array<const WeightView*, kMats> ws = mats(d);
    for (int i = 0; i < kMats; ++i) {
      L.w[i] = static_cast<const uint8_t*>(ws[i]->data);
      L.sh.t[i] = ws[i]->type;
      L.sh.rb[i] = static_cast<uint32_t>(ws[i]->row_bytes);
    }
    L.attn_norm = d.attn_norm;
    L.ffn_norm = d.ffn_norm;
    // q / k / v, the output and its rounding: the step's tagged values (its wait and put), so
    // only the biases, the output's act_mode (for Wo's type) and the cache are taken from here
    L.attn = decode_attention_args<KT>(QkvIn{nullptr, nullptr, nullptr, d.bq, d.bk, d.bv}, m.shape,
                                       m.rope_table, m.d_n_past, static_cast<KT*>(d.kv.k),
                                       static_cast<KT*>(d.kv.v), nullptr, m.n_ctx, m.attn_scratch,
                                       d.wo.type, ActBuf{});
    t.push_back(L);
  }
  return t;
}

// f(traits) for the kernel's weight type (F32, F16, BF16, or Q8_0: the quantized family).
template <typename F>
void by_step_type(uint32_t t, F&& f) {
  dispatch(t, [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (Tr::kSupported) {
      if constexpr (Tr::kFamily == DotFamily::Float || quant_family<Tr::kType>()) f(tr);
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
  // Float weights: every matrix one type. Quantized (the kernel's Q8_0 family): Q8_0 / Q5_0
  // matrices, FFN down also Q4_K / Q6_K (through the reference's Q8_K input and long rows).
  const uint32_t T0 = l0.wq.type;
  const bool quant = !float_type(T0);
  if (quant && !q0_weight(T0)) return no("weights are not F32 / F16 / BF16 / Q8_0 / Q5_0");
  const int64_t E = l0.wq.cols, QD = static_cast<int64_t>(s.n_head) * s.head_dim,
                KD = static_cast<int64_t>(s.n_head_kv) * s.head_dim, F = l0.gate.rows;
  if (s.head_dim > kDecMaxHd || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0) {
    return no("attention shape");
  }
  // Float rows are multiples of 16 bytes (the bulk copies land them 16-byte aligned); Q8_0 /
  // Q5_0 rows hold pairs of 32-blocks (4-byte aligned words); K-quant rows whole super-blocks.
  const auto shaped = [T0, quant](const WeightView& w, int64_t rows, int64_t cols, bool down) {
    if (w.rows != rows || w.cols != cols || w.data == nullptr ||
        reinterpret_cast<uintptr_t>(w.data) % 16 != 0) {
      return false;
    }
    if (!quant) return w.type == T0 && w.row_bytes % 16 == 0 && matvec1_float_takes(w.type, w.cols);
    if (q0_weight(w.type)) return cols % 64 == 0;
    return down && k_quant(w.type) && cols % 256 == 0;
  };
  // The largest row of each matrix over the layers (the slots' sizes).
  size_t rbmax[kMats] = {};
  bool kdown = false, uniform = m.output.type == T0;  // every matrix T0
  for (const DecodeLayer& d : m.layers) {
    const std::array<const WeightView*, kMats> ws = mats(d);
    const int64_t rows[kMats] = {QD, KD, KD, E, F, F, E};
    const int64_t cols[kMats] = {E, E, E, QD, E, E, F};
    for (int i = 0; i < kMats; ++i) {
      if (!shaped(*ws[i], rows[i], cols[i], i == kMdown)) {
        return no("layer matrices differ in type or shape");
      }
      rbmax[i] = std::max(rbmax[i], ws[i]->row_bytes);
    }
    kdown = kdown || k_quant(d.down.type);
    for (const WeightView* w : ws) uniform = uniform && w->type == T0;
    if (d.kv.type != l0.kv.type) return no("cache types differ");
  }
  if (!shaped(m.output, m.output.rows, E, false)) return no("output matrix type or shape");
  // the embedding, read as float4s (for_each_l2)
  if (reinterpret_cast<uintptr_t>(m.x) % 16 != 0) return no("activations not 16-byte aligned");

  int dev = 0, sms = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const int G = sms;
  const uint32_t kernel_type = !quant || uniform ? T0 : static_cast<uint32_t>(GgmlType::Q4_K);
  const bool kv_f16 = l0.kv.type == KvType::F16;
  size_t static_b = 0;  // the kernel's static shared memory (its barriers and reductions)
  by_step_type(kernel_type, [&](auto tr) {
    constexpr GgmlType TT = decltype(tr)::kType;
    cudaFuncAttributes fa{};
    CUDA_CHECK(kv_f16 ? cudaFuncGetAttributes(&fa, decode_step_kernel<TT, math::KvF16>)
                      : cudaFuncGetAttributes(&fa, decode_step_kernel<TT, math::KvF32>));
    static_b = fa.sharedSizeBytes;
  });
  step::SmemIn si;
  si.blocks = G;
  si.E = E;
  si.QD = QD;
  si.KD = KD;
  si.F = F;
  si.rb_q = rbmax[kMq];
  si.rb_k = rbmax[kMk];
  si.rb_v = rbmax[kMv];
  si.rb_o = rbmax[kMo];
  si.rb_gate = rbmax[kMgate];
  si.rb_up = rbmax[kMup];
  si.rb_down = rbmax[kMdown];
  si.rb_out = m.output.row_bytes;
  si.quant = quant;
  si.kdown = kdown;
  si.long_unit_b = qd::long_slot_bytes(1, 1);
  si.n_layer = static_cast<int>(m.layers.size());
  si.shape_b = sizeof(Shape);
  si.dec_smem_b = sizeof(DecSmem);
  si.kv_stage_b = kv_f16 ? dec_kv_stage_bytes<math::KvF16>() : dec_kv_stage_bytes<math::KvF32>();
  si.static_b = static_b;
  si.min_lm_rows = kWarps;
  si.max_lm_stages = kLmStages;
  si.optin = static_cast<size_t>(optin);
  const step::SmemLayout ly = step::smem_layout(si);
  if (!ly.fits) {
    return no("a block's share of the weights needs " + std::to_string(ly.smem) +
              " bytes of shared memory (" + std::to_string(optin) + " on this device)");
  }

  std::unique_ptr<DecodeStep> st(new DecodeStep());
  st->impl_ = new Impl();
  Impl& im = *st->impl_;
  im.type = kernel_type;
  im.n_layer = static_cast<int>(m.layers.size());
  im.kv_f16 = kv_f16;
  st->blocks_ = G;
  st->smem_ = ly.smem;
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
  // The exit count, the epoch and the tagged values all start at zero (no tag is zero).
  im.sync_bytes = kSyncBytes + tagged_bytes(static_cast<int>(E), static_cast<int>(F),
                                            static_cast<int>(QD), static_cast<int>(KD), s.n_head);
  im.sync = reinterpret_cast<unsigned*>(base + table_bytes(im.n_layer));
  CUDA_CHECK(cudaMemset(im.sync, 0, im.sync_bytes));
  auto* const xt = reinterpret_cast<uint64_t*>(base + table_bytes(im.n_layer) + kSyncBytes);
  // Blocks a head in local mode: as many as fit, up to 8 (the per-op kernel's cluster). Fewer
  // measured slower (H100, 0.5B F16, depth 512: 4 -> 947, 2 -> 910 vs 8 -> 971 tok/s).
  const int cv = std::max(1, std::min(kDecMaxCluster, G / s.n_head));
  const auto offsets = [&](auto& p) {
    p.off_qkv = static_cast<unsigned>(ly.wo_b);
    p.off_kst = ly.kst_b != 0 ? static_cast<unsigned>(ly.kst_at) : 0u;
    p.off_g = static_cast<unsigned>(ly.p_b);
    p.off_sf = static_cast<unsigned>(ly.sf_at);
    p.off_xs = static_cast<unsigned>(ly.pg);
    p.off_aq = static_cast<unsigned>(ly.pg + ly.xf_b);
    p.off_ad = static_cast<unsigned>(ly.pg + ly.xf_b + ly.aq_b);
    p.off_abs = static_cast<unsigned>(ly.pg + ly.xf_b + ly.aq_b + ly.ad_b);
    p.off_res = static_cast<unsigned>(ly.pg + ly.xs_b);
    p.off_shape = static_cast<unsigned>(ly.pg + ly.xs_b + ly.rx_b);
    p.cv = cv;
    p.lm_stages = ly.lm_stages;
    p.lm_rows = ly.lm_rows;
  };
  offsets(im.pf);
  offsets(im.ph);
  im.pf.sync = im.ph.sync = im.sync;
  im.pf.xt = im.ph.xt = xt;
  im.pf.gt = im.ph.gt = xt + E;
  im.pf.at = im.ph.at = xt + E + F;
  im.pf.qkvt = im.ph.qkvt = xt + E + F + QD;
  im.pf.st = im.ph.st = xt + E + F + 2 * QD + 2 * KD;
  by_step_type(im.type, [&](auto tr) {
    constexpr GgmlType TT = decltype(tr)::kType;
    if (im.kv_f16) {
      set_attrs<TT, math::KvF16>(ly.smem);
    } else {
      set_attrs<TT, math::KvF32>(ly.smem);
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
