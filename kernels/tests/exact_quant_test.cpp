// Exact kernels for quantized weights (kernels/matmul_quant.cu) against the CPU reference
// (worker/engine/cpu/act_quant.cpp), bit for bit:
//  - HOST EMULATION tests (ExactQuantHost.*, run everywhere, CI included): the kernels'
//    thread decomposition replayed on the host with the same __host__ __device__ functions
//    (kernels/exact_quant_math.cuh): per-block / per-sub-block integer slots, their sums
//    across the 8 lanes of a super-block, the float chains over the blocks, the combine
//    tree; compared with cpu::dot_quantized and cpu::quantize_activation.
//  - GPU tests (ExactQuantGpu.*, "not run" without a CUDA device): quantize_act and matmul
//    on the device against the same CPU functions, over the full outputs (NaN-poisoned).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "engine/cpu/act_quant.h"
#include "exact.cuh"
#include "exact_quant_math.cuh"
#include "gguf/ggml_types.h"
#include "weights.cuh"
// gpu_test_util.h's rel_err promotes floats to double on purpose (not used here)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "common/test_helpers.h"
#include "exact_test_blocks.h"
#include "gpu_test_util.h"
#pragma GCC diagnostic pop

namespace worker {
namespace {

using test::bits;

namespace qm = kern::exact::qm;
using gputest::DevArray;
using kern::exact::ActBuf;
using kern::exact::BatchOrder;

const GgmlType kQuantTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K,
                                GgmlType::Q6_K};

using exacttest::put_half;
using exacttest::random_weights;
using exacttest::XorShift;

// Activations: normal values with a random magnitude per row; one 256-element block with
// a tie of magnitudes (x and -x, the first must win) when the row is long enough.
std::vector<float> random_acts(int n_tok, int cols, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<float> x(static_cast<size_t>(n_tok) * static_cast<size_t>(cols));
  for (int t = 0; t < n_tok; ++t) {
    std::uniform_real_distribution<float> mag(0.05f, 8.0f);
    std::normal_distribution<float> nd(0.0f, mag(rng));
    float* r = x.data() + static_cast<size_t>(t) * cols;
    for (int i = 0; i < cols; ++i) r[i] = nd(rng);
    if (cols >= 256) {
      float m = 0;
      for (int i = 0; i < 256; ++i) m = std::max(m, std::fabs(r[i]));
      r[17] = -m * 1.5f;  // first element of largest magnitude (negative)
      r[200] = m * 1.5f;  // same magnitude, later: must lose
    }
  }
  return x;
}

std::vector<cpu::QuantizedActivation> cpu_acts(GgmlType type, const std::vector<float>& x,
                                               int n_tok, int cols) {
  std::vector<cpu::QuantizedActivation> a(static_cast<size_t>(n_tok));
  for (int t = 0; t < n_tok; ++t)
    cpu::quantize_activation(type, x.data() + static_cast<size_t>(t) * cols, cols,
                             a[static_cast<size_t>(t)]);
  return a;
}

// The CPU reference matmul of a BatchOrder slice, as CpuEngine::matmul sets the flags.
std::vector<float> cpu_matmul(GgmlType type, const std::vector<uint8_t>& w, int rows, int cols,
                              std::vector<cpu::QuantizedActivation>& acts,
                              const BatchOrder& order) {
  const int n_tok = static_cast<int>(acts.size());
  const size_t rb = ggml_row_bytes(type, cols);
  const bool rep = repacked(type, rows);
  for (int t = 0; t < n_tok; ++t) {
    acts[static_cast<size_t>(t)].repacked = rep;
    acts[static_cast<size_t>(t)].repack_gemm =
        rep && (order.t0 + t) < order.batch_n - order.batch_n % 4;
  }
  std::vector<float> y(static_cast<size_t>(n_tok) * static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < n_tok; ++t)
      y[static_cast<size_t>(t) * rows + r] = cpu::dot_quantized(
          type, w.data() + rb * static_cast<size_t>(r), acts[static_cast<size_t>(t)], nullptr);
  return y;
}

// Counts bitwise mismatches; prints the first few.
template <typename T>
size_t count_mismatch(const std::vector<T>& got, const std::vector<T>& ref, const std::string& what,
                      int row_len) {
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    bool same;
    if constexpr (std::is_same_v<T, float>)
      same = bits(got[i]) == bits(ref[i]);
    else
      same = got[i] == ref[i];
    if (!same) {
      if (bad < 5) {
        if constexpr (std::is_same_v<T, float>)
          std::printf("  %s: mismatch at [%zu][%zu]: got %a ref %a\n", what.c_str(),
                      i / static_cast<size_t>(row_len), i % static_cast<size_t>(row_len),
                      static_cast<double>(got[i]), static_cast<double>(ref[i]));
        else
          std::printf("  %s: mismatch at [%zu][%zu]: got %lld ref %lld\n", what.c_str(),
                      i / static_cast<size_t>(row_len), i % static_cast<size_t>(row_len),
                      static_cast<long long>(got[i]), static_cast<long long>(ref[i]));
      }
      ++bad;
    }
  }
  return bad;
}

std::string type_str(GgmlType t) {
  return std::string(ggml_type_name(static_cast<uint32_t>(t)));
}

// WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh sets it under compute-sanitizer racecheck, which
// instruments every shared-memory access): fewer and smaller GPU cases, no timing loops.
bool quick() {
  return std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
}

bool cols_ok(GgmlType t, int cols) {
  const bool k = t == GgmlType::Q4_K || t == GgmlType::Q6_K;
  return cols % (k ? 256 : 32) == 0;
}

// ---------------------------------------------------------------------------------------
// Host emulation of the matmul kernel (qmm_kernel): the same slot / scale / chain / combine
// functions, in the kernel's decomposition.

uint32_t word_at(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}
template <int N>
void words_at(const uint8_t* p, uint32_t (&w)[N]) {
  for (int i = 0; i < N; ++i) w[i] = word_at(p + 4 * i);
}
uint32_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The slots S[12] and scales F[2] of block b of `row` for activation `a`, as the kernel's
// lanes compute them (K-quants: 8 sub-block lanes, their partials summed as the shuffles do).
void emulate_block(GgmlType type, bool rep, const uint8_t* row, int b,
                   const cpu::QuantizedActivation& a, int* S, float* F) {
  for (int i = 0; i < 12; ++i) S[i] = 0;
  if (type == GgmlType::Q8_0 || type == GgmlType::Q4_0 || type == GgmlType::Q5_0) {
    uint32_t y[8];
    words_at(reinterpret_cast<const uint8_t*>(a.q.data()) + 32 * b, y);
    int s[8];
    float dw;
    if (type == GgmlType::Q8_0) {
      const uint8_t* p = row + 34 * b;
      uint32_t w[8];
      words_at(p + 2, w);
      qm::q8_0_ints(w, y, s);
      dw = qm::half_bits(u16_at(p));
    } else if (type == GgmlType::Q4_0) {
      const uint8_t* p = row + 18 * b;
      uint32_t w[4];
      words_at(p + 2, w);
      qm::q4_0_ints(w, y, s);
      dw = qm::half_bits(u16_at(p));
    } else {
      const uint8_t* p = row + 22 * b;
      uint32_t w[4];
      words_at(p + 6, w);
      qm::q5_0_ints(word_at(p + 2), w, y, s);
      dw = qm::half_bits(u16_at(p));
    }
    if (rep) {  // Q4_0 repacked: one slot, the block's integer dot
      S[0] = 0;
      for (int i = 0; i < 8; ++i) S[0] += s[i];
    } else {
      for (int i = 0; i < 8; ++i) S[i] = s[i];
    }
    F[0] = dw * a.d[static_cast<size_t>(b)];
    return;
  }
  const float yd = a.d[static_cast<size_t>(b)];
  int part[8][8];
  int msub[8] = {};
  for (int s = 0; s < 8; ++s) {  // lane s of the super-block's 8
    uint32_t y[8];
    words_at(reinterpret_cast<const uint8_t*>(a.q.data()) + 256 * b + 32 * s, y);
    const int bs0 = a.bsum[static_cast<size_t>(16 * b + 2 * s)];
    const int bs1 = a.bsum[static_cast<size_t>(16 * b + 2 * s + 1)];
    if (type == GgmlType::Q4_K) {
      const uint8_t* p = row + 144 * b;
      uint32_t hw[3], q[8];
      words_at(p + 4, hw);
      words_at(p + 16 + 32 * (s >> 1), q);
      int sc, mn;
      qm::q4k_scale_min_w(s, hw, sc, mn);
      int sc2, mn2;
      qm::q4k_scale_min(s, p + 4, sc2, mn2);  // the byte-pointer form agrees
      EXPECT_EQ(sc, sc2);
      EXPECT_EQ(mn, mn2);
      qm::q4k_sub_partials(s, sc, q, y, part[s]);
      msub[s] = mn * (bs0 + bs1);
    } else {
      const uint8_t* p = row + 210 * b;
      uint32_t ql[8], qh[8];
      words_at(p + qm::q6k_ql_off(s), ql);
      words_at(p + qm::q6k_qh_off(s), qh);
      const int sc0 = static_cast<int8_t>(p[192 + 2 * s]);
      const int sc1 = static_cast<int8_t>(p[192 + 2 * s + 1]);
      qm::q6k_sub_partials(s, ql, qh, sc0, sc1, bs0, bs1, y, part[s]);
    }
  }
  if (type == GgmlType::Q4_K && rep) {
    for (int j = 0; j < 4; ++j) {  // pairs: lanes 2j and 2j+1 (shuffle xor 1)
      int t0 = 0, t1 = 0;
      for (int t = 0; t < 8; ++t) {
        t0 += part[2 * j][t];
        t1 += part[2 * j + 1][t];
      }
      S[j] = t0 + t1;
      S[8 + j] = msub[2 * j] + msub[2 * j + 1];
    }
  } else {
    for (int t = 0; t < 8; ++t) {  // the transposing reduce: lane t gets the sum of index t
      int v = 0;
      for (int s = 0; s < 8; ++s) v += part[s][t];
      S[t] = v;
    }
    if (type == GgmlType::Q4_K)
      for (int j = 0; j < 4; ++j) S[8 + j] = msub[2 * j] + msub[2 * j + 1];
  }
  const uint8_t* p = row + (type == GgmlType::Q4_K ? 144 : 210) * b;
  if (type == GgmlType::Q6_K) {
    F[0] = yd * qm::half_bits(u16_at(p + 208));
  } else if (!rep) {
    F[0] = yd * qm::half_bits(u16_at(p));
    F[1] = -yd * qm::half_bits(u16_at(p + 2));
  } else {
    F[0] = qm::half_bits(u16_at(p)) * yd;
    F[1] = qm::half_bits(u16_at(p + 2)) * yd;
  }
}

template <qm::Flavor FL>
float emulate_chains(GgmlType type, bool rep, const uint8_t* row, int nb,
                     const cpu::QuantizedActivation& a, bool gemm) {
  constexpr int C = qm::FlavorInfo<FL>::kChains;
  float acc[12] = {};
  // The kernel: chunks of blocks; per chunk the slots of every block, then each chain lane
  // steps over the chunk's blocks in order (chunking does not change the per-chain order).
  const int CB = (type == GgmlType::Q4_K || type == GgmlType::Q6_K) ? 8 : 32;
  std::vector<int> S(static_cast<size_t>(CB) * 12);
  std::vector<float> F(static_cast<size_t>(CB) * 2);
  for (int c0 = 0; c0 < nb; c0 += CB) {
    const int cnt = std::min(CB, nb - c0);
    for (int b = 0; b < cnt; ++b)
      emulate_block(type, rep, row, c0 + b, a, S.data() + 12 * b, F.data() + 2 * b);
    for (int c = 0; c < C; ++c)
      for (int b = 0; b < cnt; ++b)
        acc[c] = qm::chain_step<FL>(c, S.data() + 12 * b, F.data() + 2 * b, gemm, acc[c]);
  }
  return qm::combine<FL>(acc);
}

float emulate_dot(GgmlType type, const uint8_t* row, int cols, const cpu::QuantizedActivation& a,
                  bool rep, bool gemm) {
  switch (type) {
    case GgmlType::Q8_0:
    case GgmlType::Q5_0:
      return emulate_chains<qm::Flavor::Q0Lanes>(type, false, row, cols / 32, a, gemm);
    case GgmlType::Q4_0:
      return rep ? emulate_chains<qm::Flavor::Q4_0Rep>(type, true, row, cols / 32, a, gemm)
                 : emulate_chains<qm::Flavor::Q0Lanes>(type, false, row, cols / 32, a, gemm);
    case GgmlType::Q4_K:
      return rep ? emulate_chains<qm::Flavor::Q4KRep>(type, true, row, cols / 256, a, gemm)
                 : emulate_chains<qm::Flavor::Q4KLanes>(type, false, row, cols / 256, a, gemm);
    default: return emulate_chains<qm::Flavor::Q6K>(type, false, row, cols / 256, a, gemm);
  }
}

// HOST EMULATION: the matmul decomposition against cpu::dot_quantized, every quantized type,
// rows a multiple of 8 (repacked Q4_0 / Q4_K) and not, gemm and gemv token slices.
// REQ: M0-W-1430 WRK-D15
TEST(ExactQuantHost, MatmulEmulationMatchesCpuReference) {
  struct Shape {
    int rows, cols;
  };
  const Shape shapes[] = {{24, 256}, {13, 768}, {16, 896}, {9, 1024}, {8, 4864}, {10, 64}};
  uint64_t seed = 1;
  for (GgmlType type : kQuantTypes) {
    for (const Shape& sh : shapes) {
      if (!cols_ok(type, sh.cols)) continue;
      const auto w = random_weights(type, sh.rows, sh.cols, ++seed);
      const int n_tok = 6;
      const auto x = random_acts(n_tok, sh.cols, ++seed);
      auto acts = cpu_acts(type, x, n_tok, sh.cols);
      const BatchOrder order{6, 0};  // tokens 0..3 gemm, 4..5 gemv (repacked Q4_K)
      const auto ref = cpu_matmul(type, w, sh.rows, sh.cols, acts, order);
      const size_t rb = ggml_row_bytes(type, sh.cols);
      const bool rep = repacked(type, sh.rows);
      std::vector<float> got(ref.size());
      for (int t = 0; t < n_tok; ++t) {
        const bool gemm = rep && t < order.batch_n - order.batch_n % 4;
        for (int r = 0; r < sh.rows; ++r)
          got[static_cast<size_t>(t) * sh.rows + r] =
              emulate_dot(type, w.data() + rb * static_cast<size_t>(r), sh.cols,
                          acts[static_cast<size_t>(t)], rep, gemm);
      }
      const std::string what =
          type_str(type) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
      EXPECT_EQ(count_mismatch(got, ref, what, sh.rows), 0u) << what;
    }
  }
}

// HOST EMULATION: the gemm and gemv orders of repacked Q4_K really differ somewhere (so the
// test above distinguishes them), and the emulation follows the flag.
// REQ: M0-W-1430
TEST(ExactQuantHost, Q4KGemmAndGemvOrdersDiffer) {
  const int rows = 64, cols = 4864;
  const auto w = random_weights(GgmlType::Q4_K, rows, cols, 77);
  const auto x = random_acts(1, cols, 78);
  auto acts = cpu_acts(GgmlType::Q4_K, x, 1, cols);
  const size_t rb = ggml_row_bytes(GgmlType::Q4_K, cols);
  int differ = 0;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = w.data() + rb * static_cast<size_t>(r);
    acts[0].repacked = true;
    acts[0].repack_gemm = true;
    const float g = cpu::dot_quantized(GgmlType::Q4_K, row, acts[0], nullptr);
    acts[0].repack_gemm = false;
    const float v = cpu::dot_quantized(GgmlType::Q4_K, row, acts[0], nullptr);
    EXPECT_EQ(bits(emulate_dot(GgmlType::Q4_K, row, cols, acts[0], true, true)), bits(g));
    EXPECT_EQ(bits(emulate_dot(GgmlType::Q4_K, row, cols, acts[0], true, false)), bits(v));
    differ += bits(g) != bits(v);
  }
  EXPECT_GT(differ, 0);
}

// HOST: the helpers' fp16 decode, dp4a emulation and the host build of CUDA's fp16 / bf16
// conversions against worker/gguf's (the CPU reference's) conversions on random values.
// REQ: M0-W-1430
TEST(ExactQuantHost, ConversionsAgreeWithCpuReference) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 0x1F) == 31) continue;  // inf / NaN
    ASSERT_EQ(bits(qm::half_bits(h)), bits(fp16_to_fp32(static_cast<uint16_t>(h)))) << h;
  }
  XorShift rng(5);
  for (int i = 0; i < 200000; ++i) {
    const float f =
        rng.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, static_cast<int>(rng.next() % 40) - 20);
    const __half hh = __float2half_rn(f);
    uint16_t hb;
    std::memcpy(&hb, &hh, 2);
    ASSERT_EQ(hb, fp32_to_fp16(f)) << f;
    const __nv_bfloat16 bb = __float2bfloat16_rn(f);
    uint16_t bbits;
    std::memcpy(&bbits, &bb, 2);
    ASSERT_EQ(bbits, fp32_to_bf16(f)) << f;
    const uint32_t a = static_cast<uint32_t>(rng.next()), b = static_cast<uint32_t>(rng.next());
    int ref = 0;
    for (int k = 0; k < 4; ++k)
      ref += static_cast<int8_t>(a >> (8 * k)) * static_cast<int8_t>(b >> (8 * k));
    ASSERT_EQ(qm::dp4a(a, b, 0), ref);
  }
}

// HOST: Q5_0's per-lane integer (qm::q5_0_int: the 4 fifth bits of a lane placed by one
// multiply, the persistent decode step's and the per-op kernels' helper) against the block's
// elements as ggml's dequantize_row_q5_0 reads them (element j: low nibble of qs[j] and bit j
// of qh; element j + 16: high nibble and bit j + 16), on random blocks and activations: lane i
// is the integer dot of elements 4i .. 4i + 3 (minus 16 each) with the lane's 4 quants.
// REQ: M0-W-1430
TEST(ExactQuantHost, Q5_0LaneIntegerIsTheDotOfItsFourElements) {
  XorShift rng(11);
  for (int n = 0; n < 200000; ++n) {
    const uint32_t qh = static_cast<uint32_t>(rng.next());
    uint8_t qs[16];
    for (auto& b : qs) b = static_cast<uint8_t>(rng.next());
    int q[32];
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int>((qs[j] & 0xF) | (((qh >> j) & 1u) << 4)) - 16;
      q[j + 16] = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
    }
    uint32_t w[4];
    std::memcpy(w, qs, sizeof w);
    for (int i = 0; i < 8; ++i) {
      const uint32_t y = static_cast<uint32_t>(rng.next());
      int ref = 0;
      for (int k = 0; k < 4; ++k) ref += q[4 * i + k] * static_cast<int8_t>(y >> (8 * k));
      ASSERT_EQ(qm::q5_0_int(i, qh, w[i % 4], y), ref) << "qh " << qh << " lane " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------
// HOST WARP SIMULATOR: the matmul kernels' own per-thread code (qm::qmm_block,
// qm::qmv_row_block) run by one host thread per GPU thread, kMMWarps x 32 per block; warp
// shuffles and barriers go through qm::host_warp. A lane that skipped a shuffle or a barrier
// would hang the block (the GPU's behaviour would be undefined); shared memory starts as
// garbage.

struct SimBlock {
  static constexpr int kThreads = qm::kMMWarps * qm::kLanes;
  std::barrier<> block_bar{kThreads};
  std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
  int xi[kThreads] = {};
  float xf[kThreads] = {};
  SimBlock() {
    for (int w = 0; w < qm::kMMWarps; ++w)
      warp_bars.push_back(std::make_unique<std::barrier<>>(qm::kLanes));
  }
};
thread_local SimBlock* t_blk = nullptr;
thread_local int t_lane = 0, t_warp = 0;

int sim_lane() {
  return t_lane;
}
int sim_warp() {
  return t_warp;
}
int sim_shfl_xor(int v, int mask) {
  const int base = t_warp * qm::kLanes;
  t_blk->xi[base + t_lane] = v;
  t_blk->warp_bars[static_cast<size_t>(t_warp)]->arrive_and_wait();
  const int r = t_blk->xi[base + (t_lane ^ mask)];
  t_blk->warp_bars[static_cast<size_t>(t_warp)]->arrive_and_wait();
  return r;
}
float sim_shfl_xor_f(float v, int mask) {
  const int base = t_warp * qm::kLanes;
  t_blk->xf[base + t_lane] = v;
  t_blk->warp_bars[static_cast<size_t>(t_warp)]->arrive_and_wait();
  const float r = t_blk->xf[base + (t_lane ^ mask)];
  t_blk->warp_bars[static_cast<size_t>(t_warp)]->arrive_and_wait();
  return r;
}
float sim_shfl_idx(float v, int src) {
  const int base = t_warp * qm::kLanes;
  t_blk->xf[base + t_lane] = v;
  t_blk->warp_bars[static_cast<size_t>(t_warp)]->arrive_and_wait();
  const float r = t_blk->xf[base + src];
  t_blk->warp_bars[static_cast<size_t>(t_warp)]->arrive_and_wait();
  return r;
}
void sim_sync_warp() {
  t_blk->warp_bars[static_cast<size_t>(t_warp)]->arrive_and_wait();
}
void sim_sync_block() {
  t_blk->block_bar.arrive_and_wait();
}

// Runs body(bx, by, smem) for every block of the grid on kThreads host threads (one per GPU
// thread; the same threads walk the blocks one after the other, a block barrier between
// two), with `smem_words` words of shared memory refilled with garbage for each block.
template <typename Body>
void sim_launch(int grid_x, int grid_y, size_t smem_words, Body body) {
  qm::host_warp.lane = sim_lane;
  qm::host_warp.warp = sim_warp;
  qm::host_warp.shfl_xor = sim_shfl_xor;
  qm::host_warp.shfl_xor_f = sim_shfl_xor_f;
  qm::host_warp.shfl_idx = sim_shfl_idx;
  qm::host_warp.sync_warp = sim_sync_warp;
  qm::host_warp.sync_block = sim_sync_block;
  SimBlock blk;
  std::vector<int4> smem((smem_words + 3) / 4 + 1);
  std::vector<std::thread> th;
  for (int i = 0; i < SimBlock::kThreads; ++i) {
    th.emplace_back([&, i] {
      t_blk = &blk;
      t_lane = i % qm::kLanes;
      t_warp = i / qm::kLanes;
      for (int by = 0; by < grid_y; ++by) {
        for (int bx = 0; bx < grid_x; ++bx) {
          if (i == 0) std::memset(smem.data(), 0x7F, smem.size() * sizeof(int4));
          blk.block_bar.arrive_and_wait();  // smem ready
          body(bx, by, reinterpret_cast<int*>(smem.data()));
          blk.block_bar.arrive_and_wait();  // block done (threads that returned early too)
        }
      }
    });
  }
  for (auto& t : th) t.join();
}

// The device dispatch of exact.cuh's matmul (matmul_quant.cu: launch_qmm_nt), replayed on the
// simulator with host copies of the weights and activations.
template <GgmlType T, bool REP>
void sim_matmul_t(const std::vector<uint8_t>& w, int rows, int cols, const std::vector<int8_t>& q,
                  const std::vector<float>& d, const std::vector<int32_t>& bs, int n_tok,
                  int gemm_end, float* y, int acc, bool* used_row_kernel) {
  const size_t rb = ggml_row_bytes(T, cols);
  const int nb = cols / qm::block_elems<T>();
  const size_t row_smem = qm::row_block_smem<T, REP>(cols);
  *used_row_kernel = n_tok == 1 && nb > qm::chunk_blocks<T>() && row_smem <= 40 * 1024;
  if (*used_row_kernel) {
    sim_launch(rows, 1, row_smem / 4, [&](int bx, int, int* smem) {
      qm::qmv_row_block<T, REP>(w.data(), rows, cols, rb, q.data(), d.data(), bs.data(), gemm_end,
                                y, acc, bx, smem);
    });
    return;
  }
  auto run = [&](auto nt_tag) {
    constexpr int NT = decltype(nt_tag)::value;
    using Sm = qm::QmmSmem<T, REP, NT>;
    const size_t ints = static_cast<size_t>(qm::kMMWarps) * Sm::kInts;
    const size_t words = ints + static_cast<size_t>(qm::kMMWarps) * Sm::kFloats;
    sim_launch((rows + qm::kMMWarps - 1) / qm::kMMWarps, (n_tok + NT - 1) / NT, words,
               [&](int bx, int by, int* smem) {
                 qm::qmm_block<T, REP, NT>(w.data(), rows, cols, rb, q.data(), d.data(), bs.data(),
                                           n_tok, gemm_end, y, acc, bx, by, smem,
                                           reinterpret_cast<float*>(smem + ints));
               });
  };
  if (n_tok == 1)
    run(std::integral_constant<int, 1>{});
  else
    run(std::integral_constant<int, 8>{});
}

void sim_matmul(GgmlType type, const std::vector<uint8_t>& w, int rows, int cols,
                const std::vector<cpu::QuantizedActivation>& acts, const BatchOrder& order,
                float* y, int acc, bool* used_row_kernel) {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bs;
  for (const auto& r : acts) {
    q.insert(q.end(), r.q.begin(), r.q.end());
    d.insert(d.end(), r.d.begin(), r.d.end());
    bs.insert(bs.end(), r.bsum.begin(), r.bsum.end());
  }
  bs.push_back(0);  // non-empty for the Q0 types (unused there)
  const int n_tok = static_cast<int>(acts.size());
  const bool rep = repacked(type, rows);
  const int gemm_end = order.batch_n - order.batch_n % 4 - order.t0;
  dispatch(type, [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (quantized(Tr::kFamily)) {
      if constexpr (Tr::kRepack) {
        if (rep)
          return sim_matmul_t<Tr::kType, true>(w, rows, cols, q, d, bs, n_tok, gemm_end, y, acc,
                                               used_row_kernel);
      }
      sim_matmul_t<Tr::kType, false>(w, rows, cols, q, d, bs, n_tok, gemm_end, y, acc,
                                     used_row_kernel);
    }
  });
}

// HOST WARP SIMULATION of the matmul kernels (the code the GPU runs, thread by thread):
// every quantized type, rows a multiple of 8 and not, the warp kernel (chunks, token tiles
// of 8, tails) and the one-token row kernel, gemm / gemv slices, accumulate; bit for bit
// against cpu::dot_quantized over the full output.
// REQ: M0-W-1430 WRK-D15
TEST(ExactQuantHost, MatmulKernelSimulationMatchesCpuReference) {
  struct Case {
    int cols_q0, cols_k;  // row length for Q8_0/Q4_0/Q5_0 and for Q4_K/Q6_K
    int n_tok;
    BatchOrder order;
  };
  // 1088 / 2304: two chunks per row (the chunk loop, tails); 4864 / 8448: one token through
  // the row kernel with more chunks than warps; n_tok 9: two token tiles of 8.
  const Case cases[] = {{1088, 2304, 1, {1, 0}},
                        {1088, 2304, 3, {8, 4}},
                        {1088, 2304, 9, {9, 0}},
                        {1088, 2304, 1, {8, 3}},
                        {4864, 8448, 1, {1, 0}}};
  int row_kernel_runs = 0, warp_kernel_runs = 0, case_no = 0;
  uint64_t seed = 500;
  for (GgmlType type : kQuantTypes) {
    const bool k = type == GgmlType::Q4_K || type == GgmlType::Q6_K;
    const bool repackable = type == GgmlType::Q4_0 || type == GgmlType::Q4_K;
    for (const int rows : {13, 16}) {
      if (rows == 16 && !repackable) continue;  // rows % 8 == 0 changes only Q4_0 / Q4_K
      for (const Case& c : cases) {
        const int cols = k ? c.cols_k : c.cols_q0;
        const auto w = random_weights(type, rows, cols, ++seed);
        const int acc = (case_no++ % 2);
        const auto x = random_acts(c.n_tok, cols, ++seed);
        auto acts = cpu_acts(type, x, c.n_tok, cols);
        auto ref = cpu_matmul(type, w, rows, cols, acts, c.order);
        std::vector<float> y(ref.size(), std::nanf(""));
        if (acc) {
          XorShift rng(seed);
          for (size_t i = 0; i < y.size(); ++i) {
            y[i] = rng.uniform(-4.0f, 4.0f);
            ref[i] = y[i] + ref[i];
          }
        }
        bool row_kernel = false;
        sim_matmul(type, w, rows, cols, acts, c.order, y.data(), acc, &row_kernel);
        (row_kernel ? row_kernel_runs : warp_kernel_runs)++;
        const std::string what = type_str(type) + " rows " + std::to_string(rows) + " cols " +
                                 std::to_string(cols) + " n_tok " + std::to_string(c.n_tok) +
                                 " batch_n " + std::to_string(c.order.batch_n) + " t0 " +
                                 std::to_string(c.order.t0) + (acc ? " accumulate" : "") +
                                 (row_kernel ? " (row kernel)" : " (warp kernel)");
        ASSERT_EQ(count_mismatch(y, ref, what, rows), 0u) << what;
      }
    }
  }
  EXPECT_GT(row_kernel_runs, 0);
  EXPECT_GT(warp_kernel_runs, 0);
}

// HOST WARP SIMULATION of quantize_act's Q8_0 / Q8_K kernels (qm::act_q8_0_block,
// qm::act_q8_k_block, one warp per block), against cpu::quantize_activation bit for bit:
// random rows, an all-zero block, magnitude ties across lanes and within a lane.
// REQ: M0-W-1430 WRK-D15
TEST(ExactQuantHost, QuantizeKernelSimulationMatchesCpuReference) {
  for (const int cols : {256, 1024, 4864}) {
    const int n_tok = 3;
    auto x = random_acts(n_tok, cols, static_cast<uint64_t>(cols));
    for (int i = 0; i < 256; ++i) x[static_cast<size_t>(cols) + i] = 0.0f;  // zero block
    if (cols >= 512) {  // ties: across lanes (3 vs 130), within a lane (260 vs 261)
      x[256 + 3] = 9.0f;
      x[256 + 130] = -9.0f;
      x[2 * static_cast<size_t>(cols) + 260] = -11.0f;
      x[2 * static_cast<size_t>(cols) + 261] = 11.0f;
    }
    for (const GgmlType type : {GgmlType::Q8_0, GgmlType::Q6_K}) {
      const bool k = type == GgmlType::Q6_K;
      const size_t n = static_cast<size_t>(n_tok) * cols;
      const size_t nblk = n / (k ? 256 : 32);
      std::vector<int8_t> q(n, 99);
      std::vector<float> d(nblk, std::nanf(""));
      std::vector<int32_t> bs(n / 16, -12345);
      sim_launch(static_cast<int>((nblk + 3) / 4), 1, 0, [&](int bx, int, int*) {
        const size_t blk = static_cast<size_t>(bx) * qm::kMMWarps + static_cast<size_t>(t_warp);
        if (blk >= nblk) return;
        if (k)
          qm::act_q8_k_block(x.data(), q.data(), d.data(), bs.data(), blk);
        else
          qm::act_q8_0_block(x.data(), q.data(), d.data(), blk);
      });
      const auto ref = cpu_acts(type, x, n_tok, cols);
      std::vector<int8_t> rq;
      std::vector<float> rd;
      std::vector<int32_t> rbs;
      for (const auto& r : ref) {
        rq.insert(rq.end(), r.q.begin(), r.q.end());
        rd.insert(rd.end(), r.d.begin(), r.d.end());
        rbs.insert(rbs.end(), r.bsum.begin(), r.bsum.end());
      }
      const std::string what = type_str(type) + " cols " + std::to_string(cols);
      EXPECT_EQ(count_mismatch(q, rq, what + " q", cols), 0u) << what;
      EXPECT_EQ(count_mismatch(d, rd, what + " d", cols / (k ? 256 : 32)), 0u) << what;
      if (k) {
        EXPECT_EQ(count_mismatch(bs, rbs, what + " bsum", cols / 16), 0u) << what;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// GPU tests

// REQ: M0-W-1430 M0-W-1431 WRK-D15
TEST(ExactQuantGpu, QuantizeActMatchesCpuReference) {
  REQUIRE_GPU();
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                            GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K};
  for (GgmlType type : types) {
    const bool fl = type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
    const std::vector<int> cols_list = quick()
                                           ? std::vector<int>{64, 172, 256, 4864}
                                           : std::vector<int>{64, 172, 256, 768, 896, 1024, 4864};
    for (const int cols : cols_list) {
      if (!fl && !cols_ok(type, cols)) continue;
      for (const int n_tok : quick() ? std::vector<int>{1, 3} : std::vector<int>{1, 3, 17, 64}) {
        auto x = random_acts(n_tok, cols, static_cast<uint64_t>(cols * 131 + n_tok));
        if (!fl && n_tok > 1)  // an all-zero block (d = 0, q = 0, bsums 0)
          for (int i = 0; i < std::min(cols, 256); ++i) x[static_cast<size_t>(cols) + i] = 0.0f;
        DevArray<float> dx(x);
        DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(n_tok, cols));
        const ActBuf a = kern::exact::act_buffer_at(buf.get(), n_tok, cols);
        kern::exact::quantize_act(static_cast<uint32_t>(type), dx.get(), n_tok, cols, a, nullptr);
        CK(cudaDeviceSynchronize());
        const auto ref = cpu_acts(type, x, n_tok, cols);
        const std::string what =
            type_str(type) + " cols " + std::to_string(cols) + " n_tok " + std::to_string(n_tok);
        const size_t n = static_cast<size_t>(n_tok) * cols;
        if (fl) {
          std::vector<float> f(n), rf;
          CK(cudaMemcpy(f.data(), a.f, n * 4, cudaMemcpyDeviceToHost));
          for (const auto& r : ref) rf.insert(rf.end(), r.f.begin(), r.f.end());
          EXPECT_EQ(count_mismatch(f, rf, what + " f", cols), 0u) << what;
          continue;
        }
        const bool k = type == GgmlType::Q4_K || type == GgmlType::Q6_K;
        const int nd = cols / (k ? 256 : 32);
        std::vector<int8_t> q(n), rq;
        std::vector<float> d(static_cast<size_t>(n_tok) * nd), rd;
        CK(cudaMemcpy(q.data(), a.q, n, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(d.data(), a.d, d.size() * 4, cudaMemcpyDeviceToHost));
        for (const auto& r : ref) {
          rq.insert(rq.end(), r.q.begin(), r.q.end());
          rd.insert(rd.end(), r.d.begin(), r.d.end());
        }
        EXPECT_EQ(count_mismatch(q, rq, what + " q", cols), 0u) << what;
        EXPECT_EQ(count_mismatch(d, rd, what + " d", nd), 0u) << what;
        if (k) {
          std::vector<int32_t> bs(static_cast<size_t>(n_tok) * (cols / 16)), rbs;
          CK(cudaMemcpy(bs.data(), a.bsum, bs.size() * 4, cudaMemcpyDeviceToHost));
          for (const auto& r : ref) rbs.insert(rbs.end(), r.bsum.begin(), r.bsum.end());
          EXPECT_EQ(count_mismatch(bs, rbs, what + " bsum", cols / 16), 0u) << what;
        }
      }
    }
  }
}

// Uploads the CPU reference's quantized activations into an ActBuf (the matmul is tested on
// exactly the reference's inputs; QuantizeActMatchesCpuReference tests the quantizer).
void upload_acts(const std::vector<cpu::QuantizedActivation>& acts, GgmlType type, int cols,
                 const ActBuf& a) {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bs;
  for (const auto& r : acts) {
    q.insert(q.end(), r.q.begin(), r.q.end());
    d.insert(d.end(), r.d.begin(), r.d.end());
    bs.insert(bs.end(), r.bsum.begin(), r.bsum.end());
  }
  cudaMemcpy(a.q, q.data(), q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(a.d, d.data(), d.size() * 4, cudaMemcpyHostToDevice);
  if (type == GgmlType::Q4_K || type == GgmlType::Q6_K)
    cudaMemcpy(a.bsum, bs.data(), bs.size() * 4, cudaMemcpyHostToDevice);
  (void)cols;
}

struct MmCase {
  int n_tok;
  BatchOrder order;
};

// One type: every shape x token count x batch slice, accumulate alternating; y is NaN-poisoned
// (plain) or random (accumulate) and compared with the reference over the full output.
void run_matmul_type(GgmlType type) {
  const std::vector<int> cols_list =
      quick() ? std::vector<int>{64, 256, 4864} : std::vector<int>{64, 256, 768, 896, 1024, 4864};
  const std::vector<int> rows_list =
      quick() ? std::vector<int>{130, 136} : std::vector<int>{130, 172, 896, 2048};
  const std::vector<MmCase> cases =
      quick()
          ? std::vector<MmCase>{{1, {1, 0}}, {5, {5, 0}}, {3, {8, 4}}, {1, {8, 3}}}
          : std::vector<MmCase>{{1, {1, 0}}, {2, {2, 0}},   {3, {3, 0}},   {4, {4, 0}}, {5, {5, 0}},
                                {8, {8, 0}}, {17, {17, 0}}, {64, {64, 0}}, {4, {8, 4}}, {3, {7, 4}},
                                {5, {7, 2}}, {1, {5, 4}},   {2, {6, 3}},   {1, {8, 3}}};
  uint64_t seed = static_cast<uint64_t>(type) * 1000;
  int case_no = 0;
  for (const int cols : cols_list) {
    if (!cols_ok(type, cols)) continue;
    for (const int rows : rows_list) {
      const auto w = random_weights(type, rows, cols, ++seed);
      DevArray<uint8_t> dw(w);
      kern::WeightView wv;
      wv.data = dw.get();
      wv.type = static_cast<uint32_t>(type);
      wv.rows = rows;
      wv.cols = cols;
      wv.row_bytes = ggml_row_bytes(type, cols);
      for (const MmCase& mc : cases) {
        // keep the CPU reference's work bounded (<= ~20M multiply-adds per case)
        if (static_cast<int64_t>(rows) * cols * mc.n_tok > 20'000'000 && mc.n_tok > 4) continue;
        if (quick() && cols > 1024 && mc.n_tok > 1) continue;  // long rows: the row kernel
        const bool acc = (case_no++ % 2) == 1;
        const int n_tok = mc.n_tok;
        const auto x = random_acts(n_tok, cols, ++seed);
        auto acts = cpu_acts(type, x, n_tok, cols);
        auto ref = cpu_matmul(type, w, rows, cols, acts, mc.order);
        DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(n_tok, cols));
        const ActBuf a = kern::exact::act_buffer_at(buf.get(), n_tok, cols);
        upload_acts(acts, type, cols, a);
        DevArray<float> dy(ref.size());
        if (acc) {
          std::vector<float> y0(ref.size());
          XorShift rng(seed);
          for (size_t i = 0; i < y0.size(); ++i) {
            y0[i] = rng.uniform(-4.0f, 4.0f);
            ref[i] = y0[i] + ref[i];  // the residual add: x += tmp, one rounding
          }
          dy.upload(y0);
        }
        kern::exact::matmul(wv, a, n_tok, mc.order, dy.get(), acc, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = dy.download();
        const std::string what = type_str(type) + " rows " + std::to_string(rows) + " cols " +
                                 std::to_string(cols) + " n_tok " + std::to_string(n_tok) +
                                 " batch_n " + std::to_string(mc.order.batch_n) + " t0 " +
                                 std::to_string(mc.order.t0) + (acc ? " accumulate" : "");
        ASSERT_EQ(count_mismatch(got, ref, what, rows), 0u) << what;
      }
    }
  }
}

// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQuantGpu, MatmulQ8_0MatchesCpuReference) {
  REQUIRE_GPU();
  run_matmul_type(GgmlType::Q8_0);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQuantGpu, MatmulQ4_0MatchesCpuReference) {
  REQUIRE_GPU();
  run_matmul_type(GgmlType::Q4_0);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQuantGpu, MatmulQ5_0MatchesCpuReference) {
  REQUIRE_GPU();
  run_matmul_type(GgmlType::Q5_0);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQuantGpu, MatmulQ4_KMatchesCpuReference) {
  REQUIRE_GPU();
  run_matmul_type(GgmlType::Q4_K);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQuantGpu, MatmulQ6_KMatchesCpuReference) {
  REQUIRE_GPU();
  run_matmul_type(GgmlType::Q6_K);
}

// End to end on the device: quantize_act then matmul, against CpuEngine::matmul's steps.
// REQ: M0-W-1430 WRK-D15
TEST(ExactQuantGpu, QuantizeThenMatmulMatchesCpuReference) {
  REQUIRE_GPU();
  for (GgmlType type : kQuantTypes) {
    const int rows = quick() ? 136 : 896, cols = 1024, n_tok = 7;
    const auto w = random_weights(type, rows, cols, 4242 + static_cast<uint64_t>(type));
    const auto x = random_acts(n_tok, cols, 99);
    auto acts = cpu_acts(type, x, n_tok, cols);
    const BatchOrder order{n_tok, 0};
    const auto ref = cpu_matmul(type, w, rows, cols, acts, order);
    DevArray<uint8_t> dw(w);
    kern::WeightView wv{dw.get(), static_cast<uint32_t>(type), rows, cols,
                        ggml_row_bytes(type, cols)};
    DevArray<float> dx(x);
    DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(n_tok, cols));
    const ActBuf a = kern::exact::act_buffer_at(buf.get(), n_tok, cols);
    DevArray<float> dy(ref.size());
    kern::exact::quantize_act(wv.type, dx.get(), n_tok, cols, a, nullptr);
    kern::exact::matmul(wv, a, n_tok, order, dy.get(), false, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(count_mismatch(dy.download(), ref, type_str(type), rows), 0u) << type_str(type);
  }
}

// The decode shapes of a 0.5B model (Qwen2-0.5B: FFN down 896 x 4864, gate/up 4864 x 896,
// LM head 151936 x 896), one token: quantize_act then matmul exact against the CPU reference
// (timings, next to the fast matvec: bench/kernel_bench).
// REQ: M0-W-1430 WRK-D15
TEST(ExactQuantGpu, DecodeModelShapesMatchCpu) {
  REQUIRE_GPU();
  struct Shape {
    int rows, cols;
  };
  // quick: the FFN-down shape only
  const std::vector<Shape> shapes =
      quick() ? std::vector<Shape>{{896, 4864}}
              : std::vector<Shape>{{896, 4864}, {4864, 896}, {151936, 896}};
  for (GgmlType type : kQuantTypes) {
    for (const Shape& sh : shapes) {
      if (!cols_ok(type, sh.cols)) continue;
      const auto w = random_weights(type, sh.rows, sh.cols, 9000 + static_cast<uint64_t>(sh.rows));
      const auto x = random_acts(1, sh.cols, 31);
      auto acts = cpu_acts(type, x, 1, sh.cols);
      const auto ref = cpu_matmul(type, w, sh.rows, sh.cols, acts, BatchOrder{});
      DevArray<uint8_t> dw(w);
      kern::WeightView wv{dw.get(), static_cast<uint32_t>(type), sh.rows, sh.cols,
                          ggml_row_bytes(type, sh.cols)};
      DevArray<float> dx(x);
      DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(1, sh.cols));
      const ActBuf a = kern::exact::act_buffer_at(buf.get(), 1, sh.cols);
      DevArray<float> dy(ref.size());
      kern::exact::quantize_act(wv.type, dx.get(), 1, sh.cols, a, nullptr);
      kern::exact::matmul(wv, a, 1, BatchOrder{}, dy.get(), false, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::string what =
          type_str(type) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
      EXPECT_EQ(count_mismatch(dy.download(), ref, what, sh.rows), 0u) << what;
    }
  }
}

// Bad shapes are refused with an error naming the problem, before any launch.
// REQ: M0-W-1431
TEST(ExactQuantGpu, RejectsBadShapes) {
  REQUIRE_GPU();
  DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(2, 512));
  const ActBuf a = kern::exact::act_buffer_at(buf.get(), 2, 512);
  DevArray<float> x(2 * 512);
  EXPECT_THROW(
      kern::exact::quantize_act(static_cast<uint32_t>(GgmlType::Q4_K), x.get(), 2, 320, a, nullptr),
      WorkerError);
  EXPECT_THROW(
      kern::exact::quantize_act(static_cast<uint32_t>(GgmlType::Q8_0), x.get(), 2, 48, a, nullptr),
      WorkerError);
  kern::WeightView wv{buf.get(), static_cast<uint32_t>(GgmlType::Q6_K), 4, 320, 0};
  EXPECT_THROW(kern::exact::matmul(wv, a, 1, BatchOrder{}, x.get(), false, nullptr), WorkerError);
}

}  // namespace
}  // namespace worker
