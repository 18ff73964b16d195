// Exact kernels for quantized weights (see exact.cuh): activation quantization and the
// quantized matmul, bit for bit the floats of the CPU reference (worker/engine/cpu/
// act_quant.cpp).
//
// quantize_act: cpu::quantize_activation row by row.
//  - F32 / F16 / BF16: elementwise copy / round to nearest even (__float2half_rn,
//    __float2bfloat16_rn: the same rounding as fp32_to_fp16 / fp32_to_bf16).
//  - Q8_0 (for Q8_0 / Q4_0 / Q5_0 weights): one warp per 32-block, amax by warp max (max is
//    exact in any order), d = amax / 127 (IEEE division) rounded through fp16,
//    q = round-half-even(x * (127 / amax)).
//  - Q8_K (Q4_K / Q6_K): one warp per 256-block; the element of largest |x|, first in index
//    order on ties (the CPU's strict >: each lane scans its 8 elements in order, lanes merge
//    with the lower lane winning ties), iscale = -127 / max, q = min(127, rint(iscale * x)),
//    bsum per 16 (integers), d = 1 / iscale.
//
// matmul (quantized): one warp per weight row and per tile of NT tokens. The reference's
// float steps are independent chains (its SIMD lanes) that each run over the blocks in
// order; what feeds a chain step is an integer (exact in any order, so computed in
// parallel with dp4a) and a float scale (one product, as the reference forms it). The warp
// walks the row in chunks: (1) every lane computes the integer slots and scales of its
// blocks (Q8_0/Q4_0/Q5_0: one 32-block per lane; Q4_K/Q6_K: one 32-element sub-block per
// lane, 8 lanes per super-block, their partial integers summed with shuffles) for each
// token, into shared memory; (2) one lane per (token, chain) runs the chain's steps over the
// chunk's blocks in order, with the reference's fma. At the end each (row, token) gathers its
// chains and combines them in the reference's fixed tree. Orders reproduced
// (exact_quant_math.cuh, Flavor):
//  - Q0Lanes (Q8_0, Q5_0, Q4_0 with rows % 8 != 0): dot_q0_lanes: 8 chains,
//    acc[i] = fma(d_w * d_a, float(int dot of elements 4i..4i+3), acc[i]); hsum_float_8.
//  - Q4_0Rep (Q4_0 repacked, rows % 8 == 0): dot_q4_0_repack: one chain,
//    acc = fma(float(block int dot), d_w * d_a, acc).
//  - Q6K: dot_q6_k: 8 chains over super-blocks, lane ints with the bsum correction of lane t,
//    acc[t] = fma(d_a * d_w, float(lane t), acc[t]); hsum_float_8.
//  - Q4KLanes (Q4_K, rows % 8 != 0): dot_q4_k: 8 lane chains (d_a * d) and 4 min chains
//    (-d_a * dmin); hsum8(acc) + ((m0 + m2) + (m1 + m3)).
//  - Q4KRep (Q4_K repacked): dot_q4_k_repack: acc / accm chains with one step per
//    super-block (gemv: tokens with batch index >= batch_n - batch_n % 4) or one per
//    64-element pair (gemm: the other tokens); result acc - accm.
// One token with rows longer than one chunk (decode of e.g. FFN down) takes qmv_row_kernel:
// one row per block, the block's 4 warps compute all the row's slots at once (every weight
// load of the row in flight together), then warp 0 runs the chains over the whole row.
// Weights of the first chunk are loaded before the PDL wait (weights are never written by a
// kernel); activations and y only after it.
//
// The per-thread code of every kernel lives in exact_quant_math.cuh as __host__ __device__
// functions (qm::qmm_block, qm::qmv_row_block, qm::act_q8_0_block, qm::act_q8_k_block); the
// kernels here are thin wrappers. The host tests run that same code in a warp simulator (one
// host thread per GPU thread) against the CPU reference, besides the GPU tests.
// The file is compiled with -fmad=false: every fma is explicit, products and sums are
// rounded on their own as in the reference. Deterministic: no atomics, fixed orders.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact.cuh"
#include "exact_quant_math.cuh"
#include "launch.cuh"

namespace worker::kern::exact {

namespace {

size_t align256(size_t n) {
  return (n + 255) & ~size_t{255};
}

// ---------------------------------------------------------------------------------------
// quantize_act

template <ActType A>  // F32 (a copy), F16 or BF16
__global__ void act_float_kernel(const float* __restrict__ x, float* __restrict__ f, size_t n) {
  griddep_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    if constexpr (A == ActType::F32)
      f[i] = v;
    else if constexpr (A == ActType::F16)
      f[i] = __half2float(__float2half_rn(v));
    else
      f[i] = __bfloat162float(__float2bfloat16_rn(v));
  }
}

constexpr int kActThreads = 256;

// One warp per 32-block; blocks are numbered over the whole [n_tok][cols] array (a row's
// blocks are contiguous and rows follow each other, in x as in a.q / a.d).
__global__ void __launch_bounds__(kActThreads)
    act_q8_0_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ d,
                    size_t n_blocks) {
  griddep_wait();
  const size_t warps = static_cast<size_t>(gridDim.x) * (kActThreads / kWarp);
  for (size_t k = blockIdx.x * static_cast<size_t>(kActThreads / kWarp) + threadIdx.x / kWarp;
       k < n_blocks; k += warps)  // warp-uniform
    qm::act_q8_0_block(x, q, d, k);
}

// One warp per 256-block, lane l holding elements 8l..8l+7.
__global__ void __launch_bounds__(kActThreads)
    act_q8_k_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float* __restrict__ d,
                    int32_t* __restrict__ bsum, size_t n_blocks) {
  griddep_wait();
  const size_t warps = static_cast<size_t>(gridDim.x) * (kActThreads / kWarp);
  for (size_t k = blockIdx.x * static_cast<size_t>(kActThreads / kWarp) + threadIdx.x / kWarp;
       k < n_blocks; k += warps)  // warp-uniform
    qm::act_q8_k_block(x, q, d, bsum, k);
}

int grid_for(size_t work_items, int per_block) {
  const size_t b =
      (work_items + static_cast<size_t>(per_block) - 1) / static_cast<size_t>(per_block);
  return static_cast<int>(std::min<size_t>(std::max<size_t>(b, 1), 65535));
}

// ---------------------------------------------------------------------------------------
// matmul: the kernels are thin wrappers of the per-thread bodies in exact_quant_math.cuh
// (qmm_block, qmv_row_block), which the host tests also run in a warp simulator.

using qm::Flavor;
using qm::FlavorInfo;
using qm::kMMWarps;

template <GgmlType T, bool REP, int NT>
__global__ void __launch_bounds__(kMMWarps* kWarp)
    qmm_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
               const int8_t* __restrict__ aq, const float* __restrict__ ad,
               const int32_t* __restrict__ abs, int n_tok, int gemm_end, float* __restrict__ y,
               int accumulate) {
  using Sm = qm::QmmSmem<T, REP, NT>;
  __shared__ __align__(16) int s_int[kMMWarps * Sm::kInts];
  __shared__ float s_f[kMMWarps * Sm::kFloats];
  qm::qmm_block<T, REP, NT>(w, rows, cols, row_bytes, aq, ad, abs, n_tok, gemm_end, y, accumulate,
                            static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), s_int, s_f);
}

template <GgmlType T, bool REP>
__global__ void __launch_bounds__(kMMWarps* kWarp)
    qmv_row_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                   const int8_t* __restrict__ aq, const float* __restrict__ ad,
                   const int32_t* __restrict__ abs, int gemm_end, float* __restrict__ y,
                   int accumulate) {
  extern __shared__ int4 s_raw[];
  qm::qmv_row_block<T, REP>(w, rows, cols, row_bytes, aq, ad, abs, gemm_end, y, accumulate,
                            static_cast<int>(blockIdx.x), reinterpret_cast<int*>(s_raw));
}

template <GgmlType T, bool REP, int NT>
void launch_qmm(const WeightView& w, const ActBuf& a, int n_tok, int gemm_end, float* y,
                bool accumulate, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((w.rows + kMMWarps - 1) / kMMWarps),
                  static_cast<unsigned>((n_tok + NT - 1) / NT));
  launch_pdl("exact_qmm_kernel", qmm_kernel<T, REP, NT>, grid, dim3(kMMWarps * kWarp), stream,
             static_cast<const uint8_t*>(w.data), static_cast<int>(w.rows),
             static_cast<int>(w.cols), w.row_bytes, static_cast<const int8_t*>(a.q),
             static_cast<const float*>(a.d), static_cast<const int32_t*>(a.bsum), n_tok, gemm_end,
             y, accumulate ? 1 : 0);
}

// Shared memory the one-row kernel may take without an opt-in (48 KB), with room to spare
// so that several blocks share an SM.
constexpr size_t kRowKernelMaxSmem = 40 * 1024;

template <GgmlType T, bool REP>
void launch_qmm_nt(const WeightView& w, const ActBuf& a, int n_tok, int gemm_end, float* y,
                   bool accumulate, cudaStream_t stream) {
  if (n_tok == 1) {
    const int nb = static_cast<int>(w.cols) / qm::block_elems<T>();
    const size_t smem = qm::row_block_smem<T, REP>(static_cast<int>(w.cols));
    if (nb > qm::chunk_blocks<T>() && smem <= kRowKernelMaxSmem) {
      launch_pdl_smem("exact_qmv_row_kernel", qmv_row_kernel<T, REP>,
                      dim3(static_cast<unsigned>(w.rows)), dim3(kMMWarps * kWarp), smem, stream,
                      static_cast<const uint8_t*>(w.data), static_cast<int>(w.rows),
                      static_cast<int>(w.cols), w.row_bytes, static_cast<const int8_t*>(a.q),
                      static_cast<const float*>(a.d), static_cast<const int32_t*>(a.bsum), gemm_end,
                      y, accumulate ? 1 : 0);
    } else {
      launch_qmm<T, REP, 1>(w, a, n_tok, gemm_end, y, accumulate, stream);
    }
  } else {
    launch_qmm<T, REP, 8>(w, a, n_tok, gemm_end, y, accumulate, stream);
  }
}

std::string type_name(uint32_t t) {
  return std::string(ggml_type_name(t));
}

}  // namespace

size_t act_buffer_bytes(int max_tok, int max_cols) {
  const size_t n = static_cast<size_t>(max_tok) * static_cast<size_t>(max_cols);
  const size_t nt = static_cast<size_t>(max_tok);
  const size_t mc = static_cast<size_t>(max_cols);
  return align256(n * sizeof(float)) + align256(n) + align256(nt * (mc / 32) * sizeof(float)) +
         align256(nt * (mc / 16) * sizeof(int32_t));
}

ActBuf act_buffer_at(void* base, int max_tok, int max_cols) {
  const size_t n = static_cast<size_t>(max_tok) * static_cast<size_t>(max_cols);
  const size_t nt = static_cast<size_t>(max_tok);
  const size_t mc = static_cast<size_t>(max_cols);
  auto* p = static_cast<uint8_t*>(base);
  ActBuf a;
  a.f = reinterpret_cast<float*>(p);
  p += align256(n * sizeof(float));
  a.q = reinterpret_cast<int8_t*>(p);
  p += align256(n);
  a.d = reinterpret_cast<float*>(p);
  p += align256(nt * (mc / 32) * sizeof(float));
  a.bsum = reinterpret_cast<int32_t*>(p);
  return a;
}

void quantize_act(uint32_t weight_type, const float* x, int n_tok, int cols, const ActBuf& a,
                  cudaStream_t stream) {
  if (n_tok <= 0 || cols <= 0) throw WorkerError(ErrorCode::Internal, "quantize_act: empty shape");
  const ActType t = act_type_for(weight_type, "quantize_act");
  if (cols % act_block(t) != 0) {
    throw WorkerError(ErrorCode::Internal, "quantize_act: row length " + std::to_string(cols) +
                                               " is not a multiple of " +
                                               std::to_string(act_block(t)) + " (" +
                                               type_name(weight_type) + " activation blocks)");
  }
  const size_t n = static_cast<size_t>(n_tok) * static_cast<size_t>(cols);
  const size_t nb = n / static_cast<size_t>(act_block(t));
  const dim3 per_elem(grid_for(n, kActThreads)), per_block(grid_for(nb, kActThreads / kWarp));
  switch (t) {
    case ActType::F32:
      launch_pdl("exact_act_float_kernel", act_float_kernel<ActType::F32>, per_elem,
                 dim3(kActThreads), stream, x, a.f, n);
      break;
    case ActType::F16:
      launch_pdl("exact_act_float_kernel", act_float_kernel<ActType::F16>, per_elem,
                 dim3(kActThreads), stream, x, a.f, n);
      break;
    case ActType::BF16:
      launch_pdl("exact_act_float_kernel", act_float_kernel<ActType::BF16>, per_elem,
                 dim3(kActThreads), stream, x, a.f, n);
      break;
    case ActType::Q8_0:
      launch_pdl("exact_act_q8_0_kernel", act_q8_0_kernel, per_block, dim3(kActThreads), stream, x,
                 a.q, a.d, nb);
      break;
    case ActType::Q8_K:
      launch_pdl("exact_act_q8_k_kernel", act_q8_k_kernel, per_block, dim3(kActThreads), stream, x,
                 a.q, a.d, a.bsum, nb);
      break;
  }
}

void matmul(const WeightView& w, const ActBuf& a, int n_tok, const BatchOrder& order, float* y,
            bool accumulate, cudaStream_t stream) {
  dispatch_or_throw(w.type, "exact matmul", [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (Tr::kFamily == DotFamily::Float) {
      detail::matmul_float(w, a, n_tok, order, y, accumulate, stream);
    } else {
      if (n_tok <= 0 || w.rows <= 0 || w.cols <= 0)
        throw WorkerError(ErrorCode::Internal, "exact matmul: empty shape");
      if (w.cols % Tr::kBlock != 0) {
        throw WorkerError(ErrorCode::Internal,
                          "exact matmul: row length " + std::to_string(w.cols) +
                              " is not a multiple of the " + type_name(w.type) + " block");
      }
      if (w.rows > (int64_t{1} << 30) || w.cols > (int64_t{1} << 24))
        throw WorkerError(ErrorCode::Internal, "exact matmul: matrix too large");
      // CpuEngine::matmul: repack_gemm for batch tokens < batch_n - batch_n % 4.
      const int gemm_end = order.batch_n - order.batch_n % 4 - order.t0;
      if constexpr (Tr::kRepack) {
        if (w.rows % 8 == 0)
          return launch_qmm_nt<Tr::kType, true>(w, a, n_tok, gemm_end, y, accumulate, stream);
      }
      launch_qmm_nt<Tr::kType, false>(w, a, n_tok, gemm_end, y, accumulate, stream);
    }
  });
}

}  // namespace worker::kern::exact
