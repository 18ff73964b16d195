// rope_attention_act_f16 (exact_fused.cuh): bias_rope_store_f16 + attention_f16 +
// quantize_act over the FP16 KV cache in one launch at decode (n_tok == 1), writing exactly the
// floats the unfused sequence writes (q rotated in place, the fp16 cache rows at n_past, out
// and the ActBuf), so it inherits that sequence's exactness (exact_attn16.cu's comment: the
// CPU reference's F16-KV mode, cpu::attention_head_f16, bit for bit).
//
// One kernel, a cluster of C blocks per head (exact_attn16.cu's a16_decode_kernel structure,
// with h4's rope_attention_act additions from exact_ops.cu):
//  0. every block does bias_rope_store_f16's ops for its own head and KV group: q + bq, RoPE
//     (math::rope_pair, the host table's cos/sin at n_past), kept as floats (the q output),
//     then rounded to fp16 (attention_f16's query rounding); k + bk, RoPE, v + bv, each rounded
//     to fp16 with __float2half_rn (what the store writes) and kept as the exact floats of those
//     fp16 values. One block per KV group (r == 0, first head of the group) writes the two fp16
//     rows to the caches; no block reads cache row n_past: key n_past uses the shared copies
//     (the same values the unfused kernel would read back).
//  1-3. scores (attn16::kq_vecdot16 for cached keys; dot16_f below, kq_vecdot16's ops on the
//     float copy, for key n_past), max, exps, 16-block sums, the double tree + certainty check
//     + sequential fallback for inv, KQV as 64 FMA chains per dim over cap = n_att rounded up to
//     64 (weights attn16::prob16, zero FMAs in the padding), combined as vecdot_reduce64:
//     a16_decode_kernel's code and thread decomposition.
//  4. the output rounded for act_type as quantize_act (element-wise F32 / F16 / BF16; Q8_0 by
//     block 0 of the cluster after a cluster barrier, one warp per 32-block, head_dim % 32 == 0)
//     as h4's ex_attn_decode_kernel does.
// The q output is written after the first cluster barrier (every block of the head has read q
// by then). Launch geometry never depends on n_past. Compiled with -fmad=false. No atomics.
#include <algorithm>
#include <cmath>
#include <string>

#include <cooperative_groups.h>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_attn16_math.cuh"
#include "exact_fused.cuh"
#include "exact_ops_math.cuh"
#include "gguf/ggml_types.h"
#include "launch.cuh"

namespace worker::kern::exact {
namespace {

namespace a16 = attn16;
namespace cg = cooperative_groups;

constexpr int kFThreads = 256;  // = exact_attn16.cu's kSoftmaxThreads (the softmax tree)
constexpr int kFMaxHd = 256;
constexpr int kFMaxCluster = 8;
constexpr int kActF32 = 0, kActF16 = 1, kActBF16 = 2, kActQ8_0 = 3;

int g_cluster_for_tests = 0;

struct F16FusedArgs {
  float* q = nullptr;  // in: this token's q; out: rotated
  const float* k = nullptr;
  const float* v = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float2* table = nullptr;
  uint16_t* k_cache = nullptr;
  uint16_t* v_cache = nullptr;
  float* scratch = nullptr;
  float* out = nullptr;
  const int32_t* d_n_past = nullptr;
  ActBuf act;
  int act_mode = 0;
  int n_rot = 0, neox = 0;
  int n_head = 0, group = 1, hd = 0, kv_dim = 0, cap_max = 0, C = 1;
  size_t stride = 0;
  float kq_scale = 0.0f;
};

// kq_vecdot16's ops on a key row already converted to floats (exact fp16 values): 64 FMA
// chains over head_dim & ~63, vecdot_reduce64, leftover products rounded and added in double.
__device__ __forceinline__ float dot16_f(const float* k, const float* q, int hd) {
  float acc[64];
#pragma unroll
  for (int l = 0; l < 64; ++l) acc[l] = 0.0f;
  const int np = hd & ~63;
  for (int i = 0; i < np; i += 64) {
#pragma unroll
    for (int l = 0; l < 64; ++l) acc[l] = fmaf(k[i + l], q[i + l], acc[l]);
  }
  double s = static_cast<double>(math::vecdot_reduce64(acc));
  for (int i = np; i < hd; ++i) s += static_cast<double>(math::mul_rn(k[i], q[i]));
  return static_cast<float>(s);
}

// One head of bias_rope_store_f16's ops before the store: dst = RoPE(src + bias) for the first
// n_rot dims, src + bias for the rest (floats).
__device__ __forceinline__ void rope_head(const float* src, const float* bias, const float2* cs,
                                          int hd, int n_rot, int neox, float* dst) {
  const int half = n_rot / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float x0 = src[i0], x1 = src[i1];
    if (bias != nullptr) {
      x0 = x0 + bias[i0];
      x1 = x1 + bias[i1];
    }
    const float2 c = cs[i];
    float d0, d1;
    math::rope_pair(x0, x1, c.x, c.y, d0, d1);
    dst[i0] = d0;
    dst[i1] = d1;
  }
  for (int d = n_rot + threadIdx.x; d < hd; d += blockDim.x) {
    float x = src[d];
    if (bias != nullptr) x = x + bias[d];
    dst[d] = x;
  }
}

__device__ __forceinline__ double f_block_sum_double(double v, double* sh) {
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

__device__ __forceinline__ void f_cluster_sync(int C) {
  if (C > 1) {
    __threadfence();
    cg::this_cluster().sync();
  } else {
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kFThreads) a16_rope_attn_act_kernel(F16FusedArgs p) {
  __shared__ float qr[kFMaxHd];  // rotated q (floats: the q output)
  __shared__ float qs[kFMaxHd];  // rotated q rounded to fp16
  __shared__ float kf[kFMaxHd];  // this token's K row as stored (fp16 values as floats)
  __shared__ float vf[kFMaxHd];  // this token's V row as stored
  __shared__ float r32[32 * kFMaxHd];
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ float sh_inv;
  const int C = p.C, hd = p.hd, kv_dim = p.kv_dim;
  const int h = blockIdx.x / C, r = blockIdx.x % C, g = h / p.group;
  const int tid = threadIdx.x;
  griddep_wait();
  const int n_past = p.d_n_past[0];
  const int n_att = n_past + 1;
  const int nb = (n_att + 15) / 16;
  const int cap = (n_att + 63) & ~63;
  // 0. bias + RoPE of q and of the group's new K row, bias of its V row.
  {
    const float2* cs = p.table + static_cast<size_t>(n_past) * (p.n_rot / 2);
    const size_t qo = static_cast<size_t>(h) * hd, go = static_cast<size_t>(g) * hd;
    rope_head(p.q + qo, p.bq != nullptr ? p.bq + qo : nullptr, cs, hd, p.n_rot, p.neox, qr);
    rope_head(p.k + go, p.bk != nullptr ? p.bk + go : nullptr, cs, hd, p.n_rot, p.neox, kf);
    for (int d = tid; d < hd; d += kFThreads) {
      float x = p.v[go + d];
      if (p.bv != nullptr) x = x + p.bv[go + d];
      vf[d] = x;
    }
  }
  __syncthreads();
  {
    const bool store = r == 0 && h % p.group == 0;  // one block per KV group
    const size_t row = static_cast<size_t>(n_past) * kv_dim + static_cast<size_t>(g) * hd;
    for (int d = tid; d < hd; d += kFThreads) {  // element d: this thread only
      qs[d] = a16::round_f16(qr[d]);
      const uint16_t kb = a16::f2h(kf[d]), vb = a16::f2h(vf[d]);
      kf[d] = a16::h2f(kb);
      vf[d] = a16::h2f(vb);
      if (store) {
        p.k_cache[row + d] = kb;
        p.v_cache[row + d] = vb;
      }
    }
  }
  __syncthreads();
  float* sc = p.scratch + static_cast<size_t>(h) * p.stride;
  float* bs = sc + p.cap_max;
  float* pmax = bs + p.cap_max / 16 + 1;  // C <= 8 slots in the 16 spare floats
  const int per = (nb + C - 1) / C;
  const int b_lo = min(nb, r * per), b_hi = min(nb, b_lo + per);
  const int j_lo = 16 * b_lo, j_hi = min(n_att, 16 * b_hi);
  // 1. scores of this block's keys
  const uint16_t* kbase = p.k_cache + static_cast<size_t>(g) * hd;
  float mx = -INFINITY;
  for (int j = j_lo + tid; j < j_hi; j += kFThreads) {
    const float d = j == n_past ? dot16_f(kf, qs, hd)
                                : a16::kq_vecdot16(kbase + static_cast<size_t>(j) * kv_dim, qs, hd);
    const float s = d * p.kq_scale;
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, shf);
  if (tid == 0) pmax[r] = mx;
  f_cluster_sync(C);
  // bias_rope_store_f16's q output: every block of the cluster has read q by now.
  if (r == 0) {
    for (int i = tid; i < hd; i += kFThreads) p.q[static_cast<size_t>(h) * hd + i] = qr[i];
  }
  mx = -INFINITY;
  for (int i = 0; i < C; ++i) mx = fmaxf(mx, __ldcg(pmax + i));
  // 2. exps and 16-block sums of this block's keys
  for (int b = b_lo + tid; b < b_hi; b += kFThreads) {
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
  f_cluster_sync(C);
  double s = 0.0;
  for (int b = tid; b < nb; b += kFThreads) s += static_cast<double>(__ldcg(bs + b));
  s = f_block_sum_double(s, shd);
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
  const uint16_t* vbase = p.v_cache + static_cast<size_t>(g) * hd + d_lo;
  const int full = n_past & ~63;  // whole 64-key groups of cached keys: no checks
  for (int task = tid; task < 32 * dn; task += kFThreads) {
    const int dl = task % dn, l = task / dn;
    const uint16_t* vcol = vbase + dl;
    float a0 = 0.0f, a1 = 0.0f;  // chains l and l + 32
    int base = 0;
#pragma unroll 8
    for (; base < full; base += 64) {
      const size_t j0 = static_cast<size_t>(base + l), j1 = j0 + 32;
      a0 = fmaf(a16::h2f(vcol[j0 * kv_dim]), a16::prob16(__ldcg(sc + j0), inv), a0);
      a1 = fmaf(a16::h2f(vcol[j1 * kv_dim]), a16::prob16(__ldcg(sc + j1), inv), a1);
    }
    for (; base < cap; base += 64) {
      const int j0 = base + l, j1 = j0 + 32;
      float v0 = 0.0f, v1 = 0.0f;  // cache rows at or beyond n_past are never read
      if (j0 < n_att)
        v0 = j0 == n_past ? vf[d_lo + dl] : a16::h2f(vcol[static_cast<size_t>(j0) * kv_dim]);
      if (j1 < n_att)
        v1 = j1 == n_past ? vf[d_lo + dl] : a16::h2f(vcol[static_cast<size_t>(j1) * kv_dim]);
      // Beyond n_att: the CPU's zero-padded values times zero weights.
      a0 = j0 < n_att ? fmaf(v0, a16::prob16(__ldcg(sc + j0), inv), a0) : fmaf(0.0f, 0.0f, a0);
      a1 = j1 < n_att ? fmaf(v1, a16::prob16(__ldcg(sc + j1), inv), a1) : fmaf(0.0f, 0.0f, a1);
    }
    r32[l * dn + dl] = a0 + a1;  // vecdot_reduce64's first level: acc[l] + acc[32 + l]
  }
  __syncthreads();
  for (int dl = tid; dl < dn; dl += kFThreads) {
    float rr[16];  // second level: (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l])
#pragma unroll
    for (int i = 0; i < 16; ++i) rr[i] = r32[i * dn + dl] + r32[(i + 16) * dn + dl];
    const float o = math::hsum16(rr);
    const size_t oi = static_cast<size_t>(h) * hd + d_lo + dl;
    p.out[oi] = o;
    if (p.act_mode == kActF32) {
      p.act.f[oi] = o;
    } else if (p.act_mode == kActF16) {
      p.act.f[oi] = math::act_round_fp16(o);
    } else if (p.act_mode == kActBF16) {
      p.act.f[oi] = math::act_round_bf16(o);
    }
  }
  if (p.act_mode == kActQ8_0) {  // uniform; hd % 32 == 0: the head's dims are whole blocks
    __threadfence();
    f_cluster_sync(C);
    const int lane = tid % kWarp, w = tid / kWarp;
    if (r == 0 && w < hd / 32) {  // warp-uniform
      const size_t i0 = static_cast<size_t>(h) * hd + 32 * w;
      const float v = __ldcg(p.out + i0 + lane);
      float amax = fabsf(v);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      p.act.q[i0 + lane] = math::act_q8_0_quant(v, math::act_q8_0_id(amax));
      if (lane == 0) p.act.d[i0 / 32] = math::act_q8_0_d(amax);
    }
  }
}

void check_shape_f(const AttnShape& s, const char* what) {
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0 || s.head_dim <= 0 ||
      s.n_rot < 0 || s.n_rot > s.head_dim || s.n_rot % 2 != 0) {
    throw WorkerError(ErrorCode::Internal, std::string(what) + ": bad attention shape (n_head " +
                                               std::to_string(s.n_head) + ", n_head_kv " +
                                               std::to_string(s.n_head_kv) + ", head_dim " +
                                               std::to_string(s.head_dim) + ", n_rot " +
                                               std::to_string(s.n_rot) + ")");
  }
}

// quantize_act's rounding of the output in the kernel; -1 where it has no fused form (Q8_K,
// or Q8_0 blocks that straddle heads).
int act_mode_f(uint32_t act_type, int head_dim) {
  switch (static_cast<GgmlType>(act_type)) {
    case GgmlType::F32: return kActF32;
    case GgmlType::F16: return kActF16;
    case GgmlType::BF16: return kActBF16;
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: return head_dim % 32 == 0 ? kActQ8_0 : -1;
    default: return -1;
  }
}

// Blocks per head: as exact_attn16.cu's decode_cluster16 (14 heads: 8 -> 112 blocks).
int cluster_f(int n_head) {
  if (g_cluster_for_tests != 0) return g_cluster_for_tests;
  int c = kFMaxCluster;
  while (c > 1 && n_head * c > 160) c /= 2;
  return c;
}

}  // namespace

namespace attn16 {
void set_fused_cluster_for_tests(int cluster) {
  if (cluster != 0 && cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) {
    throw WorkerError(ErrorCode::Internal, "attn16::set_fused_cluster_for_tests: 0, 1, 2, 4 or 8");
  }
  g_cluster_for_tests = cluster;
}
}  // namespace attn16

void rope_attention_act_f16(float* q, const float* k, const float* v, const float* bq,
                            const float* bk, const float* bv, const AttnShape& s,
                            const float* rope_table, int n_tok, const int32_t* d_n_past,
                            uint16_t* k_cache, uint16_t* v_cache, float* out, int n_ctx,
                            float* scratch, uint32_t act_type, const ActBuf& a,
                            cudaStream_t stream) {
  check_shape_f(s, "exact::rope_attention_act_f16");
  if (n_tok <= 0) return;
  const int mode = act_mode_f(act_type, s.head_dim);
  if (n_tok != 1 || s.head_dim > kFMaxHd || mode < 0) {
    bias_rope_store_f16(q, k, v, bq, bk, bv, s, rope_table, n_tok, d_n_past, k_cache, v_cache,
                        stream);
    attention_f16(q, k_cache, v_cache, out, n_tok, s, n_ctx, d_n_past, scratch, stream);
    quantize_act(act_type, out, n_tok, s.n_head * s.head_dim, a, stream);
    return;
  }
  const int cluster = cluster_f(s.n_head);
  F16FusedArgs p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.bq = bq;
  p.bk = bk;
  p.bv = bv;
  p.table = reinterpret_cast<const float2*>(rope_table);
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.scratch = scratch;
  p.out = out;
  p.d_n_past = d_n_past;
  p.act = a;
  p.act_mode = mode;
  p.n_rot = s.n_rot;
  p.neox = s.neox ? 1 : 0;
  p.n_head = s.n_head;
  p.group = s.n_head / s.n_head_kv;
  p.hd = s.head_dim;
  p.kv_dim = s.n_head_kv * s.head_dim;
  // exact_attn16.cu's scratch layout for one token: per head cap_max scores / exps,
  // cap_max / 16 block sums, 16 spare floats (inv's slot unused here; the C maxima after it).
  p.cap_max = (n_ctx + 63) & ~63;
  p.stride = static_cast<size_t>(p.cap_max) + static_cast<size_t>(p.cap_max) / 16 + 16;
  p.C = cluster;
  p.kq_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(s.n_head * cluster));
  cfg.blockDim = dim3(kFThreads);
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
  const char* name = "a16_rope_attn_act_kernel";
  if (pdl_enabled() && !pdl_skipped(name)) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  cuda_check(cudaLaunchKernelEx(&cfg, a16_rope_attn_act_kernel, p), name, __FILE__, __LINE__);
  CUDA_CHECK_LAUNCH(name);
}

}  // namespace worker::kern::exact
