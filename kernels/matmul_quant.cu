// matmul() for quantized weights (matmul.cuh), bit for bit the floats of the CPU reference
// (worker/engine/cpu/act_quant.cpp); matmul() itself, which sends float weights to
// matmul_float.cu.
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
// functions (qm::qmm_block, qm::qmv_row_block); the kernels here are thin wrappers. The host tests
// run that same code in a warp simulator (one host thread per GPU thread) against the CPU
// reference, besides the GPU tests. The file is compiled with -fmad=false: every fma is explicit,
// products and sums are rounded on their own as in the reference. Deterministic: no atomics, fixed
// orders.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "exact_quant_math.cuh"
#include "launch.cuh"
#include "matmul.cuh"

namespace worker::kern::exact {

namespace {

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
