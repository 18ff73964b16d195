#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "cuda_check.h"
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

__global__ void copy_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  griddep_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
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

__global__ void argmax_partial_kernel(const float* __restrict__ v, int n, float* __restrict__ pv,
                                      int32_t* __restrict__ pi) {
  griddep_wait();
  __shared__ float sv[kArgmaxThreads];
  __shared__ int si[kArgmaxThreads];
  const int chunk = (n + gridDim.x - 1) / gridDim.x;
  const int b = blockIdx.x * chunk, e = min(n, b + chunk);
  float best = -INFINITY;
  int bi = n;  // "none"
  for (int i = b + threadIdx.x; i < e; i += blockDim.x) {
    if (bi == n || v[i] > best) {  // increasing i per thread: the first maximum stays
      best = v[i];
      bi = i;
    }
  }
  block_argmax(best, bi, n, sv, si);
  if (threadIdx.x == 0) {
    pv[blockIdx.x] = sv[0];
    pi[blockIdx.x] = si[0];
  }
}

__global__ void argmax_final_kernel(const float* __restrict__ pv, const int32_t* __restrict__ pi,
                                    int nb, int n, int32_t* __restrict__ out) {
  griddep_wait();
  __shared__ float sv[kArgmaxThreads];
  __shared__ int si[kArgmaxThreads];
  float best = -INFINITY;
  int bi = n;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    if (better(pv[i], pi[i], best, bi, n)) {
      best = pv[i];
      bi = pi[i];
    }
  }
  block_argmax(best, bi, n, sv, si);
  if (threadIdx.x == 0) *out = si[0] == n ? 0 : si[0];
}

__device__ double block_sum_d(double v, double* sh) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double r = lane < (blockDim.x / kWarp) ? sh[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// Index of the first i in [0, n) with prefix(p[0..i]) `pred` target, where prefix is a
// sum in a fixed order: each thread owns one contiguous chunk; chunk totals are scanned by
// thread 0. Returns n when no such i exists. mode 0: cum >= target; mode 1: target < cum.
__device__ int first_cum(const double* __restrict__ p, int n, double target, int mode,
                         double* sh_tot, int* sh_idx) {
  const int chunk = (n + blockDim.x - 1) / blockDim.x;
  const int b = min(n, static_cast<int>(threadIdx.x) * chunk), e = min(n, b + chunk);
  double local = 0.0;
  for (int i = b; i < e; ++i) local += p[i];
  sh_tot[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = 0.0;
    for (int t = 0; t < static_cast<int>(blockDim.x); ++t) {
      const double x = sh_tot[t];
      sh_tot[t] = run;  // exclusive prefix
      run += x;
    }
    *sh_idx = n;
  }
  __syncthreads();
  double cum = sh_tot[threadIdx.x];
  int found = n;
  for (int i = b; i < e; ++i) {
    cum += p[i];
    if (mode == 0 ? cum >= target : target < cum) {
      found = i;
      break;
    }
  }
  if (found < n) atomicMin(sh_idx, found);  // min is order-independent
  __syncthreads();
  const int r = *sh_idx;
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads)
    finalize_kernel(const float* __restrict__ keys, const int32_t* __restrict__ ids, int n_vocab,
                    const SampleParams* __restrict__ prm, double* __restrict__ probs,
                    int32_t* __restrict__ out) {
  griddep_wait();
  __shared__ double sh[32];
  __shared__ double sh_tot[kThreads];
  __shared__ int sh_idx;
  const SampleParams p = *prm;
  int n = n_vocab;
  if (p.top_k > 0 && p.top_k < n) n = p.top_k;
  const float s0 = keys[0] / p.temperature;
  double local = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const double e = exp(static_cast<double>(keys[i] / p.temperature - s0));
    probs[i] = e;
    local += e;
  }
  const double sum = block_sum_d(local, sh);
  for (int i = threadIdx.x; i < n; i += blockDim.x) probs[i] /= sum;
  __syncthreads();
  int keep = n;
  if (p.top_p < 1.0f) {
    const int i = first_cum(probs, n, static_cast<double>(p.top_p), 0, sh_tot, &sh_idx);
    keep = i < n ? i + 1 : n;
  }
  if (p.min_p > 0.0f) {
    // probs are non-increasing, so the kept set is a prefix: find the first miss.
    const double threshold = static_cast<double>(p.min_p) * probs[0];
    if (threadIdx.x == 0) sh_idx = keep;
    __syncthreads();
    for (int i = 1 + threadIdx.x; i < keep; i += blockDim.x) {
      if (!(probs[i] >= threshold)) atomicMin(&sh_idx, i);
    }
    __syncthreads();
    keep = sh_idx;
    __syncthreads();
  }
  double tl = 0.0;
  for (int i = threadIdx.x; i < keep; i += blockDim.x) tl += probs[i];
  // The CPU sums the kept probabilities sequentially; a tree sum differs by rounding only.
  const double total = block_sum_d(tl, sh);
  const int pick = first_cum(probs, keep, p.u * total, 1, sh_tot, &sh_idx);
  if (threadIdx.x == 0) *out = ids[pick < keep ? pick : keep - 1];
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
            bool apply_penalty, const int32_t* d_history, const SampleScratch& s, int32_t* d_out,
            cudaStream_t stream) {
  const float* work = logits;
  if (apply_penalty) {
    launch_pdl("copy_kernel", copy_kernel, dim3((n_vocab + 255) / 256), dim3(256), stream, logits,
               s.work, n_vocab);
    CUDA_CHECK_LAUNCH("copy_kernel");
    launch_pdl("penalty_kernel", penalty_kernel, dim3(1), dim3(kThreads), stream, s.work, n_vocab,
               d_params, d_history, s.seen);
    CUDA_CHECK_LAUNCH("penalty_kernel");
    work = s.work;
  }
  if (greedy) {
    const int nb = std::min(kArgmaxBlocks, (n_vocab + kArgmaxThreads - 1) / kArgmaxThreads);
    launch_pdl("argmax_partial_kernel", argmax_partial_kernel, dim3(nb), dim3(kArgmaxThreads),
               stream, work, n_vocab, s.part_v, s.part_i);
    CUDA_CHECK_LAUNCH("argmax_partial_kernel");
    launch_pdl("argmax_final_kernel", argmax_final_kernel, dim3(1), dim3(kArgmaxThreads), stream,
               s.part_v, s.part_i, nb, n_vocab, d_out);
    CUDA_CHECK_LAUNCH("argmax_final_kernel");
    return;
  }
  size_t bytes = s.sort_temp_bytes;
  // Stable radix sort: equal logits keep ascending ids, the CPU's (logit desc, id asc).
  CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      s.sort_temp, bytes, work, s.keys_sorted, s.ids, s.ids_sorted, n_vocab, 0,
      static_cast<int>(sizeof(float) * 8), stream));
  launch_pdl("finalize_kernel", finalize_kernel, dim3(1), dim3(kThreads), stream, s.keys_sorted,
             s.ids_sorted, n_vocab, d_params, s.probs, d_out);
  CUDA_CHECK_LAUNCH("finalize_kernel");
}
}  // namespace worker::kern
