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
#include "matvec1.cuh"
#include "weights.cuh"  // WeightView

namespace worker::kern::exact {

// ---------------------------------------------------------------------------------------
// The ops of exact_ops.cu, each as CpuEngine computes it (the attention: attention_exact.cuh).

// ggml_rms_norm then the weight multiply: sum of float squares in double, mean = float(sum /
// n), scale = 1 / sqrtf(mean + eps), y = (x * scale) * w. w: n floats (F32, converted at load).
void rmsnorm(const float* x, const float* w, float* y, int n_rows, int n, float eps,
             cudaStream_t stream);

// g[t][i] = silu(g[t][i]) * u[t][i] for i < F: ggml_silu (ggml_expf) for the first F & ~15,
// x / (1 + expf(-x)) for the rest, where the CPU calls libm's expf: here glibc's expf
// algorithm (double arithmetic, a 32-entry 2^(i/32) table, rounded once), equal to this
// machine's glibc on every float tried but 2 in 3.3e8 (kernels/exact_ops_math.cuh).
void swiglu(float* g, const float* u, int n_tok, int F, cudaStream_t stream);

}  // namespace worker::kern::exact
