#include "common.cuh"
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

template <typename KV>
__global__ void qkv_rope_kernel(float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
                                VecView bq, VecView bk, VecView bv, RopeParams p,
                                const int32_t* __restrict__ d_n_past, KV* __restrict__ kc,
                                KV* __restrict__ vc) {
  griddep_enter();
  const int t = blockIdx.x;
  const int pos = *d_n_past + t;
  const int nq = p.n_head * p.head_dim, nk = p.n_head_kv * p.head_dim;
  float* qt = q + static_cast<size_t>(t) * nq;
  float* kt = k + static_cast<size_t>(t) * nk;
  float* vt = v + static_cast<size_t>(t) * nk;
  // Biases first (each element by one thread), then the rotations read them.
  if (bq.data)
    for (int i = threadIdx.x; i < nq; i += blockDim.x)
      qt[i] += load_float_elem(bq.data, bq.type, i);
  if (bk.data)
    for (int i = threadIdx.x; i < nk; i += blockDim.x)
      kt[i] += load_float_elem(bk.data, bk.type, i);
  if (bv.data)
    for (int i = threadIdx.x; i < nk; i += blockDim.x)
      vt[i] += load_float_elem(bv.data, bv.type, i);
  __syncthreads();
  const int half_rot = p.n_rot / 2;
  const float fpos = static_cast<float>(pos);
  for (int j = threadIdx.x; j < (p.n_head + p.n_head_kv) * half_rot; j += blockDim.x) {
    const int h = j / half_rot, i = j % half_rot;
    float* x = h < p.n_head ? qt + h * p.head_dim : kt + (h - p.n_head) * p.head_dim;
    rotate(x, i, p, fpos);
  }
  __syncthreads();
  KV* kdst = kc + static_cast<size_t>(pos) * nk;
  KV* vdst = vc + static_cast<size_t>(pos) * nk;
  for (int i = threadIdx.x; i < nk; i += blockDim.x) {
    kv_store(kdst + i, kt[i]);
    kv_store(vdst + i, vt[i]);
  }
}
}  // namespace

void qkv_rope_store(float* q, float* k, float* v, VecView bq, VecView bk, VecView bv,
                    const RopeParams& p, int n_tok, const int32_t* d_n_past, void* k_cache,
                    void* v_cache, bool kv_f32, cudaStream_t stream) {
  if (kv_f32) {
    launch_pdl("qkv_rope_kernel", qkv_rope_kernel<float>, dim3(n_tok), dim3(256), stream, q, k, v,
               bq, bk, bv, p, d_n_past, static_cast<float*>(k_cache), static_cast<float*>(v_cache));
  } else {
    launch_pdl("qkv_rope_kernel", qkv_rope_kernel<__half>, dim3(n_tok), dim3(256), stream, q, k, v,
               bq, bk, bv, p, d_n_past, static_cast<__half*>(k_cache),
               static_cast<__half*>(v_cache));
  }
  CUDA_CHECK_LAUNCH("qkv_rope_kernel");
}
}  // namespace worker::kern
