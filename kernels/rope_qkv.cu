#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "launch.cuh"
#include "rope_qkv.cuh"

namespace worker::kern {
namespace {

__device__ __forceinline__ void rotate(float* x, int i, const RopeParams& p, float pos) {
  float theta = pos;
  for (int j = 0; j < i; ++j) theta *= p.theta_scale;
  float s, c;
  sincosf(theta, &s, &c);
  const int i0 = p.neox ? i : 2 * i;
  const int i1 = p.neox ? i + p.n_rot / 2 : 2 * i + 1;
  const float x0 = x[i0], x1 = x[i1];
  x[i0] = x0 * c - x1 * s;
  x[i1] = x0 * s + x1 * c;
}

__device__ __forceinline__ void kv_store(__half* p, float v) {
  *p = __float2half_rn(v);
}
__device__ __forceinline__ void kv_store(float* p, float v) {
  *p = v;
}

// One block per (head, token): blockIdx.x < n_head is a Q head, else a K head together
// with the V head of the same index. A single block for all heads was a ~7 us serial
// step per layer (ncu, H100); per head it is one short pass. The biases are read before
// the PDL wait (no kernel writes them).
template <typename KV>
__global__ void qkv_rope_kernel(float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
                                VecView bq, VecView bk, VecView bv, RopeParams p,
                                const int32_t* __restrict__ d_n_past, KV* __restrict__ kc,
                                KV* __restrict__ vc) {
  extern __shared__ float sh_head[];                          // head_dim floats
  const int t = blockIdx.y, h = blockIdx.x, d = threadIdx.x;  // blockDim.x >= head_dim
  const bool is_q = h < p.n_head;
  const int hd = p.head_dim;
  const int nq = p.n_head * hd, nk = p.n_head_kv * hd;
  const VecView& b = is_q ? bq : bk;
  const int off = (is_q ? h : h - p.n_head) * hd;  // this head's offset in q, or in k and v
  const bool in = d < hd;
  const float bias = b.data != nullptr && in ? load_float_elem(b.data, b.type, off + d) : 0.0f;
  const float vbias =
      !is_q && bv.data != nullptr && in ? load_float_elem(bv.data, bv.type, off + d) : 0.0f;
  griddep_wait();
  const int pos = *d_n_past + t;
  float* x = is_q ? q + static_cast<size_t>(t) * nq + off : k + static_cast<size_t>(t) * nk + off;
  if (in) sh_head[d] = x[d] + bias;
  __syncthreads();
  const float fpos = static_cast<float>(pos);
  for (int i = d; i < p.n_rot / 2; i += blockDim.x) rotate(sh_head, i, p, fpos);
  __syncthreads();
  if (!in) return;
  x[d] = sh_head[d];
  if (is_q) return;
  float* vt = v + static_cast<size_t>(t) * nk + off;
  const float vv = vt[d] + vbias;
  vt[d] = vv;
  kv_store(kc + static_cast<size_t>(pos) * nk + off + d, sh_head[d]);
  kv_store(vc + static_cast<size_t>(pos) * nk + off + d, vv);
}
}  // namespace

void qkv_rope_store(float* q, float* k, float* v, VecView bq, VecView bk, VecView bv,
                    const RopeParams& p, int n_tok, const int32_t* d_n_past, void* k_cache,
                    void* v_cache, bool kv_f32, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n_head + p.n_head_kv), static_cast<unsigned>(n_tok));
  if (p.head_dim <= 0 || p.head_dim > 1024 || p.n_rot > p.head_dim) {
    throw WorkerError(ErrorCode::Internal,
                      "qkv_rope_store: unsupported head_dim " + std::to_string(p.head_dim));
  }
  const dim3 block(static_cast<unsigned>((p.head_dim + 31) / 32 * 32));
  const size_t smem = static_cast<size_t>(p.head_dim) * sizeof(float);
  if (kv_f32) {
    launch_pdl_smem("qkv_rope_kernel", qkv_rope_kernel<float>, grid, block, smem, stream, q, k, v,
                    bq, bk, bv, p, d_n_past, static_cast<float*>(k_cache),
                    static_cast<float*>(v_cache));
  } else {
    launch_pdl_smem("qkv_rope_kernel", qkv_rope_kernel<__half>, grid, block, smem, stream, q, k, v,
                    bq, bk, bv, p, d_n_past, static_cast<__half*>(k_cache),
                    static_cast<__half*>(v_cache));
  }
  CUDA_CHECK_LAUNCH("qkv_rope_kernel");
}
}  // namespace worker::kern
