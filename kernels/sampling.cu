#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "cuda_check.h"
#include "engine/sampler_math.h"
#include "launch.cuh"
#include "sampling.cuh"

namespace worker::kern {
namespace {
constexpr int kThreads = 1024;

__global__ void iota_kernel(int32_t* ids, int32_t* seen, int n) {
  griddep_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    ids[i] = i;
    seen[i] = 0;
  }
}

namespace sm = worker::sampler_math;

// Sum of a uint64 over the block (exact, any order). Every thread gets the total.
__device__ uint64_t block_sum_u64(uint64_t v, uint64_t* sh /* [32] */) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  uint64_t r = lane < static_cast<int>(blockDim.x / kWarp) ? sh[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// The chunk [b, e) of block `blk` of `nb` over n values: the layout shared by the partial
// kernels, so each writes one hash partial per block.
__device__ __forceinline__ void chunk_of(int n, int nb, int blk, int& b, int& e) {
  const int chunk = (n + nb - 1) / nb;
  b = min(n, blk * chunk);
  e = min(n, b + chunk);
}

// work = logits + 0 (-0 becomes +0: the radix sort orders bit patterns, the CPU compares
// values) and the block's partial of the logits hash.
__global__ void prep_kernel(const float* __restrict__ in, float* __restrict__ out, int n,
                            uint64_t* __restrict__ part_h) {
  griddep_wait();
  __shared__ uint64_t sh[32];
  int b, e;
  chunk_of(n, gridDim.x, blockIdx.x, b, e);
  uint64_t h = 0;
  for (int i = b + threadIdx.x; i < e; i += blockDim.x) {
    const float v = in[i];
    h += sm::logit_term(static_cast<uint32_t>(i), v);
    out[i] = v + 0.0f;
  }
  h = block_sum_u64(h, sh);
  if (threadIdx.x == 0) part_h[blockIdx.x] = h;
}

// Each distinct history id is penalised exactly once: the atomicExch decides which of the
// duplicates applies it, and every outcome is the same (no order dependence).
__global__ void penalty_kernel(float* __restrict__ work, int n_vocab,
                               const SampleParams* __restrict__ p, const int32_t* __restrict__ hist,
                               int32_t* __restrict__ seen) {
  griddep_wait();
  const float pen = p->repetition_penalty;
  const int nh = p->n_history;
  if (pen == 1.0f) return;
  for (int i = threadIdx.x; i < nh; i += blockDim.x) {
    const int id = hist[i];
    if (id >= 0 && id < n_vocab) atomicExch(&seen[id], 1);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh; i += blockDim.x) {
    const int id = hist[i];
    if (id >= 0 && id < n_vocab && atomicExch(&seen[id], 0) == 1) {
      const float l = work[id];
      work[id] = l > 0.0f ? l / pen : l * pen;
    }
  }
}

// argmax, lowest id on ties, in two fixed-shape stages: kArgmaxBlocks blocks each reduce
// a contiguous chunk, then one block reduces their kArgmaxBlocks candidates.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi, int none) {
  return i != none && (bi == none || v > bv || (v == bv && i < bi));
}

__device__ void block_argmax(float v, int i, int none, float* sv, int* si) {
  sv[threadIdx.x] = v;
  si[threadIdx.x] = i;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = sv[threadIdx.x + s];
      const int oi = si[threadIdx.x + s];
      if (better(ov, oi, sv[threadIdx.x], si[threadIdx.x], none)) {
        sv[threadIdx.x] = ov;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
}

constexpr int kArgmaxThreads = 256;

// The step's result into the sink (one thread).
__device__ __forceinline__ void publish(const SampleSink& k, int32_t id, uint64_t hash) {
  k.out->id = id;
  k.out->logits_hash = hash;
  if (k.io != nullptr) {
    k.io[0] = k.n_past;
    k.io[1] = id;
  }
}

// hash_of: the raw logits when this kernel is the first to read them (no penalty), else
// nullptr (prep_kernel wrote the hash partials).
__global__ void argmax_partial_kernel(const float* __restrict__ v, int n, float* __restrict__ pv,
                                      int32_t* __restrict__ pi, bool hash_here,
                                      uint64_t* __restrict__ part_h) {
  griddep_wait();
  __shared__ float sv[kArgmaxThreads];
  __shared__ int si[kArgmaxThreads];
  __shared__ uint64_t sh[32];
  int b, e;
  chunk_of(n, gridDim.x, blockIdx.x, b, e);
  float best = -INFINITY;
  int bi = n;  // "none"
  uint64_t h = 0;
  for (int i = b + threadIdx.x; i < e; i += blockDim.x) {
    const float x = v[i];
    if (hash_here) h += sm::logit_term(static_cast<uint32_t>(i), x);
    if (bi == n || x > best) {  // increasing i per thread: the first maximum stays
      best = x;
      bi = i;
    }
  }
  block_argmax(best, bi, n, sv, si);
  if (threadIdx.x == 0) {
    pv[blockIdx.x] = sv[0];
    pi[blockIdx.x] = si[0];
  }
  if (hash_here) {
    h = block_sum_u64(h, sh);
    if (threadIdx.x == 0) part_h[blockIdx.x] = h;
  }
}

__global__ void argmax_final_kernel(const float* __restrict__ pv, const int32_t* __restrict__ pi,
                                    const uint64_t* __restrict__ part_h, int nb, int n,
                                    SampleSink sink) {
  griddep_wait();
  __shared__ float sv[kArgmaxThreads];
  __shared__ int si[kArgmaxThreads];
  __shared__ uint64_t sh[32];
  const uint64_t h = block_sum_u64(threadIdx.x < nb ? part_h[threadIdx.x] : 0, sh);
  float best = -INFINITY;
  int bi = n;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    if (better(pv[i], pi[i], best, bi, n)) {
      best = pv[i];
      bi = pi[i];
    }
  }
  block_argmax(best, bi, n, sv, si);
  if (threadIdx.x == 0) {
    publish(sink, si[0] == n ? 0 : si[0], sm::logits_hash_final(h, static_cast<uint64_t>(n)));
  }
}

// First index i in [0, n) whose inclusive prefix sum of w (each thread owns one contiguous
// chunk starting at prefix `before`) satisfies pred(prefix, i); n when none. Integer sums:
// the same prefixes as the CPU's sequential loop.
template <typename Pred>
__device__ int first_prefix(const uint64_t* __restrict__ w, int b, int e, uint64_t before, int n,
                            Pred pred, int* sh_idx) {
  if (threadIdx.x == 0) *sh_idx = n;
  __syncthreads();
  uint64_t cum = before;
  for (int i = b; i < e; ++i) {
    cum += w[i];
    if (pred(cum, i)) {
      atomicMin(sh_idx, i);  // min is order-independent
      break;
    }
  }
  __syncthreads();
  const int r = *sh_idx;
  __syncthreads();
  return r;
}

// Steps 4-7 of the sampler (sampler.h) over the sorted candidates, one block.
__global__ void __launch_bounds__(kThreads)
    finalize_kernel(const float* __restrict__ keys, const int32_t* __restrict__ ids, int n_vocab,
                    const SampleParams* __restrict__ prm, const uint64_t* __restrict__ part_h,
                    int nb, uint64_t* __restrict__ w, SampleSink sink) {
  griddep_wait();
  __shared__ uint64_t sh[32];
  __shared__ uint64_t sh_before[kThreads];
  __shared__ int sh_idx;
  const SampleParams p = *prm;
  const uint64_t hash = block_sum_u64(threadIdx.x < nb ? part_h[threadIdx.x] : 0, sh);
  int n = n_vocab;
  if (p.top_k > 0 && p.top_k < n) n = p.top_k;
  const int chunk = (n + blockDim.x - 1) / blockDim.x;
  const int b = min(n, static_cast<int>(threadIdx.x) * chunk), e = min(n, b + chunk);

  const float s0 = __fdiv_rn(keys[0], p.temperature);
  uint64_t local = 0;
  for (int i = b; i < e; ++i) {
    const uint64_t wi = i == 0 ? static_cast<uint64_t>(sm::kWeightOne)
                               : sm::weight(__fsub_rn(__fdiv_rn(keys[i], p.temperature), s0));
    w[i] = wi;
    local += wi;
  }
  __shared__ uint64_t sh_all;
  sh_before[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive prefix of the chunk sums
    uint64_t run = 0;
    for (int t = 0; t < static_cast<int>(blockDim.x); ++t) {
      const uint64_t x = sh_before[t];
      sh_before[t] = run;
      run += x;
    }
    sh_all = run;
  }
  __syncthreads();
  const uint64_t before = sh_before[threadIdx.x];
  const uint64_t all = sh_all;

  int keep = n;
  if (p.top_p < 1.0f) {
    const double thr = sm::top_p_threshold(p.top_p, all);
    const int i = first_prefix(
        w, b, e, before, n, [thr](uint64_t cum, int) { return static_cast<double>(cum) >= thr; },
        &sh_idx);
    keep = i < n ? i + 1 : n;
  }
  if (p.min_p > 0.0f) {
    const double thr = sm::min_p_threshold(p.min_p);
    const int i = first_prefix(
        w, b, e, before, n,
        [thr, w](uint64_t, int j) { return j >= 1 && !(static_cast<double>(w[j]) >= thr); },
        &sh_idx);
    keep = min(keep, i);
  }
  uint64_t kl = 0;
  for (int i = b; i < min(e, keep); ++i) kl += w[i];
  const uint64_t kept_total = block_sum_u64(kl, sh);
  const uint64_t target = sm::scale_draw(p.draw, kept_total);
  const int pick = first_prefix(
      w, b, min(e, keep), before, keep, [target](uint64_t cum, int) { return target < cum; },
      &sh_idx);
  if (threadIdx.x == 0) {
    publish(sink, ids[pick < keep ? pick : keep - 1],
            sm::logits_hash_final(hash, static_cast<uint64_t>(n_vocab)));
  }
}
}  // namespace

size_t sampling_sort_temp_bytes(int n_vocab) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n_vocab));
  return bytes;
}

void sampling_init(const SampleScratch& s, int n_vocab, cudaStream_t stream) {
  launch_pdl("iota_kernel", iota_kernel, dim3((n_vocab + 255) / 256), dim3(256), stream, s.ids,
             s.seen, n_vocab);
  CUDA_CHECK_LAUNCH("iota_kernel");
}

void sample(const float* logits, int n_vocab, const SampleParams* d_params, bool greedy,
            bool apply_penalty, const int32_t* d_history, const SampleScratch& s,
            const SampleSink& sink, cudaStream_t stream) {
  const int nb = std::min(kArgmaxBlocks, (n_vocab + kArgmaxThreads - 1) / kArgmaxThreads);
  const float* work = logits;
  if (apply_penalty || !greedy) {
    launch_pdl("prep_kernel", prep_kernel, dim3(nb), dim3(kArgmaxThreads), stream, logits, s.work,
               n_vocab, s.part_h);
    CUDA_CHECK_LAUNCH("prep_kernel");
    work = s.work;
  }
  if (apply_penalty) {
    launch_pdl("penalty_kernel", penalty_kernel, dim3(1), dim3(kThreads), stream, s.work, n_vocab,
               d_params, d_history, s.seen);
    CUDA_CHECK_LAUNCH("penalty_kernel");
  }
  if (greedy) {
    launch_pdl("argmax_partial_kernel", argmax_partial_kernel, dim3(nb), dim3(kArgmaxThreads),
               stream, work, n_vocab, s.part_v, s.part_i, work == logits, s.part_h);
    CUDA_CHECK_LAUNCH("argmax_partial_kernel");
    launch_pdl("argmax_final_kernel", argmax_final_kernel, dim3(1), dim3(kArgmaxThreads), stream,
               s.part_v, s.part_i, s.part_h, nb, n_vocab, sink);
    CUDA_CHECK_LAUNCH("argmax_final_kernel");
    return;
  }
  size_t bytes = s.sort_temp_bytes;
  // Stable radix sort: equal logits keep ascending ids, the CPU's (logit desc, id asc).
  CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      s.sort_temp, bytes, s.work, s.keys_sorted, s.ids, s.ids_sorted, n_vocab, 0,
      static_cast<int>(sizeof(float) * 8), stream));
  launch_pdl("finalize_kernel", finalize_kernel, dim3(1), dim3(kThreads), stream, s.keys_sorted,
             s.ids_sorted, n_vocab, d_params, s.part_h, nb, s.weights, sink);
  CUDA_CHECK_LAUNCH("finalize_kernel");
}

}  // namespace worker::kern
