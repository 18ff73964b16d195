#pragma once
// "Exact" kernels: every op computes bit for bit the floats of the CPU reference
// (worker/engine/cpu, itself bit-identical with llama.cpp's AVX-512 CPU backend): the same
// roundings (activations to the weight type's vec_dot_type, Q8_0 / Q8_K quantization), the
// same float operations in the same order (the lane structure of ggml's vec_dot, llamafile's
// tinyBLAS, the x86 repack gemv/gemm, ggml's polynomial exp, double sums where ggml sums in
// double). Float sums are independent chains, so the GPU runs the chains in parallel and
// combines them in the reference's fixed tree; integer block dots are exact in any order.
//
// These files are compiled with -fmad=false: a multiply followed by an add is never fused
// behind our back; every fused multiply-add is an explicit fmaf() where the reference has
// one.
//
// The matrix products and the activation rounding have their own headers (matmul.cuh,
// matvec1.cuh, act_round.cuh; linear.cuh picks among them); this one declares the other ops
// (exact_ops.cu) and includes those.
//
// All pointers are device memory. n_past is read from device memory so that the decode step
// can be captured in a CUDA graph and replayed.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "act_round.cuh"
#include "matmul.cuh"
#include "matvec.cuh"  // WeightView
#include "matvec1.cuh"

namespace worker::kern::exact {

// ---------------------------------------------------------------------------------------
// The ops of exact_ops.cu, each as CpuEngine computes it.

// ggml_rms_norm then the weight multiply: sum of float squares in double, mean = float(sum /
// n), scale = 1 / sqrtf(mean + eps), y = (x * scale) * w. w: n floats (F32, converted at load).
void rmsnorm(const float* x, const float* w, float* y, int n_rows, int n, float eps,
             cudaStream_t stream);

// RoPE cos/sin for positions 0..n_ctx-1, built on the host exactly as CpuEngine::rope does
// (theta = pos; per pair: cos(theta), sin(theta) with the host's libm, theta *= theta_scale):
// [n_ctx][n_rot / 2] pairs {cos, sin}. Uploaded once; kernels index it by position.
void rope_table_host(int n_ctx, int n_rot, float theta_scale, float* out /* 2*n_ctx*(n_rot/2) */);

struct AttnShape {
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  bool neox = false;
};

// For t < n_tok at position n_past + t: q += bq, k += bk, v += bv (each bias optional,
// nullptr = absent, F32), RoPE on the first n_rot dims of every Q and K head
// (d0 = fma(x0, c, -(x1*s)), d1 = fma(x0, s, x1*c)), then K and V stored to this layer's FP32
// cache [n_ctx][n_head_kv * head_dim]. q is rotated in place; k and v are read.
void bias_rope_store(float* q, const float* k, const float* v, const float* bq, const float* bk,
                     const float* bv, const AttnShape& s, const float* rope_table, int n_tok,
                     const int32_t* d_n_past, float* k_cache, float* v_cache, cudaStream_t stream);

// Causal GQA attention over the FP32 cache, in CpuEngine::eval's order: scores by
// cpu::dot_vecdot * (1/sqrtf(head_dim)), max, ggml_expf 16 at a time with each block's hsum16
// added in double, probabilities * float(1/sum), then V^T * p: tinyBLAS over the 16-padded
// keys when n_tok >= 2 and head_dim % 4 == 0, else vec_dot over the keys padded to 64
// (n_kv_total = n_past + n_tok rounded up). out: [n_tok][n_head * head_dim].
// `scratch` holds attention_scratch_floats(n_ctx, n_tok, n_head) floats.
size_t attention_scratch_floats(int n_ctx, int max_tok, int n_head);
void attention(const float* q, const float* k_cache, const float* v_cache, float* out, int n_tok,
               const AttnShape& s, int n_ctx, const int32_t* d_n_past, float* scratch,
               cudaStream_t stream);

// The same two ops over an FP16 KV cache (llama.cpp's default; M0-W-1201), as the CPU
// reference's F16-KV mode computes them (exact_attn16.cu): K and V rounded to fp16 when
// stored; q rounded to fp16 before the KQ products and the probabilities rounded to fp16
// before the KQV products, each product summed in the order llama.cpp's mul_mat takes for
// F16 x F16 (tinyBLAS for a batch of >= 2 tokens where it applies, else vec_dot_f16).
// Caches: [n_ctx][n_head_kv * head_dim] fp16 bits.
void bias_rope_store_f16(float* q, const float* k, const float* v, const float* bq, const float* bk,
                         const float* bv, const AttnShape& s, const float* rope_table, int n_tok,
                         const int32_t* d_n_past, uint16_t* k_cache, uint16_t* v_cache,
                         cudaStream_t stream);
size_t attention_f16_scratch_floats(int n_ctx, int max_tok, int n_head);
void attention_f16(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, float* out,
                   int n_tok, const AttnShape& s, int n_ctx, const int32_t* d_n_past,
                   float* scratch, cudaStream_t stream);

// g[t][i] = silu(g[t][i]) * u[t][i] for i < F: ggml_silu (ggml_expf) for the first F & ~15,
// x / (1 + expf(-x)) for the rest, where the CPU calls libm's expf: here glibc's expf
// algorithm (double arithmetic, a 32-entry 2^(i/32) table, rounded once), equal to this
// machine's glibc on every float tried but 2 in 3.3e8 (kernels/exact_ops_math.cuh).
void swiglu(float* g, const float* u, int n_tok, int F, cudaStream_t stream);

}  // namespace worker::kern::exact
