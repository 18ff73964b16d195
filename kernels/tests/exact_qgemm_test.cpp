// Exact quantized prompt GEMM (kernels/matmul_qgemm.cu: qgemm) against the CPU reference
// (cpu::dot_quantized with CpuEngine::matmul's order flags) and against exact::matmul, bit
// for bit:
//  - HOST EMULATION tests (ExactQgemmHost.*, run everywhere, CI included): the kernel's CTA
//    replayed on the host thread by thread with the same __host__ __device__ functions
//    (kernels/exact_qgemm_math.cuh: weight unpacking, shared-memory staging, per-thread chain
//    steps, the combine butterfly written on arrays, the tile store), every flavour and
//    several tile sizes, partial row / token tiles, BatchOrder slices, accumulate on / off.
//  - GPU tests (ExactQgemmGpu.*, "not run" without a CUDA device): qgemm on the device, full
//    outputs (NaN-poisoned) vs exact::matmul, and vs the CPU reference on every row when the
//    CPU work is small, on a strided subset of rows (all tokens) otherwise; and vs matmul at
//    the model's shapes (timings: bench/kernel_bench).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/errors.h"
#include "engine/cpu/act_quant.h"
#include "exact.cuh"
#include "exact_qgemm_math.cuh"
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

namespace qg = kern::exact::qg;
using gputest::DevArray;
using kern::exact::ActBuf;
using kern::exact::BatchOrder;
using qg::Flavor;

using exacttest::put_half;
using exacttest::XorShift;

// Random valid blocks (exact_test_blocks.h), Q8_0 / Q6_K keeping -128 in some blocks: the
// kernel must not assume ggml's [-127, 127].
std::vector<uint8_t> random_weights(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  return exacttest::random_weights(type, rows, cols, seed, /*ggml_range=*/false);
}

std::vector<float> random_acts(int n_tok, int cols, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<float> x(static_cast<size_t>(n_tok) * static_cast<size_t>(cols));
  for (int t = 0; t < n_tok; ++t) {
    std::uniform_real_distribution<float> mag(0.05f, 8.0f);
    std::normal_distribution<float> nd(0.0f, mag(rng));
    float* r = x.data() + static_cast<size_t>(t) * cols;
    for (int i = 0; i < cols; ++i) r[i] = nd(rng);
  }
  return x;
}

// The reference's activations (cpu::quantize_activation row by row), flattened as
// act_buffer_at lays them out: q [n_tok][cols], d [n_tok][nb], bsum [n_tok][cols / 16].
struct HostActs {
  std::vector<cpu::QuantizedActivation> rows;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bs;
};

// x [n_tok][cols] quantized for `type`'s activations row by row (cpu::quantize_activation).
HostActs quantize_rows(GgmlType type, const std::vector<float>& x, int n_tok, int cols) {
  HostActs h;
  h.rows.resize(static_cast<size_t>(n_tok));
  for (int t = 0; t < n_tok; ++t) {
    auto& r = h.rows[static_cast<size_t>(t)];
    cpu::quantize_activation(type, x.data() + static_cast<size_t>(t) * cols, cols, r);
    h.q.insert(h.q.end(), r.q.begin(), r.q.end());
    h.d.insert(h.d.end(), r.d.begin(), r.d.end());
    h.bs.insert(h.bs.end(), r.bsum.begin(), r.bsum.end());
  }
  return h;
}

HostActs make_acts(GgmlType type, int n_tok, int cols, uint64_t seed) {
  return quantize_rows(type, random_acts(n_tok, cols, seed), n_tok, cols);
}

// Activation quants at their extremes, every quant +127 or -127: token t's values all +1 / -1
// (t % 3 == 0 / 1: every 16-quant sum +-2032), or (t % 3 == 2) +1 on lane 3's elements (4 * 3
// .. + 3 of each 32) and -1 elsewhere, so that dot_q6_k's bsum correction no longer cancels half
// of lane 3's integer: with quants 63 and scales -128 / 127 it passes 2^24 (4.5e7), where the
// int -> float conversion rounds.
HostActs extreme_acts(GgmlType type, int n_tok, int cols) {
  std::vector<float> x(static_cast<size_t>(n_tok) * cols);
  for (int t = 0; t < n_tok; ++t) {
    for (int i = 0; i < cols; ++i) {
      x[static_cast<size_t>(t) * cols + i] =
          t % 3 == 0 ? 1.0f : (t % 3 == 1 ? -1.0f : ((i % 32) / 4 == 3 ? 1.0f : -1.0f));
    }
  }
  return quantize_rows(type, x, n_tok, cols);
}

// CpuEngine::matmul's flags for a BatchOrder slice, then cpu::dot_quantized for the rows
// listed (all tokens); other entries of y keep their value.
void cpu_rows(GgmlType type, const std::vector<uint8_t>& w, int rows, int cols, HostActs& acts,
              const BatchOrder& order, const std::vector<int>& which, bool accumulate,
              std::vector<float>& y) {
  const int n_tok = static_cast<int>(acts.rows.size());
  const size_t rb = ggml_row_bytes(type, cols);
  const bool rep = repacked(type, rows);
  for (int t = 0; t < n_tok; ++t) {
    auto& a = acts.rows[static_cast<size_t>(t)];
    a.repacked = rep;
    a.repack_gemm = rep && (order.t0 + t) < order.batch_n - order.batch_n % 4;
  }
  for (const int r : which) {
    for (int t = 0; t < n_tok; ++t) {
      float& o = y[static_cast<size_t>(t) * rows + r];
      const float v = cpu::dot_quantized(type, w.data() + rb * static_cast<size_t>(r),
                                         acts.rows[static_cast<size_t>(t)], nullptr);
      o = accumulate ? o + v : v;
    }
  }
}

// Bitwise mismatches over the listed rows (all tokens); prints the first few.
size_t count_mismatch(const std::vector<float>& got, const std::vector<float>& ref, int rows,
                      int n_tok, const std::vector<int>& which, const std::string& what) {
  size_t bad = 0;
  for (const int r : which) {
    for (int t = 0; t < n_tok; ++t) {
      const size_t i = static_cast<size_t>(t) * rows + r;
      if (bits(got[i]) != bits(ref[i])) {
        if (bad < 5)
          std::printf("  %s: mismatch at token %d row %d: got %a ref %a\n", what.c_str(), t, r,
                      static_cast<double>(got[i]), static_cast<double>(ref[i]));
        ++bad;
      }
    }
  }
  return bad;
}

std::vector<int> all_rows(int rows) {
  std::vector<int> v(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) v[static_cast<size_t>(r)] = r;
  return v;
}

// Rows whose CPU reference costs at most ~budget multiply-adds: all, or a stride through
// the matrix that also takes the first and last tile rows of every 32-row tile it meets.
std::vector<int> checked_rows(int rows, int cols, int n_tok, int64_t budget) {
  const int64_t per_row = static_cast<int64_t>(cols) * n_tok;
  if (per_row * rows <= budget) return all_rows(rows);
  const int want = static_cast<int>(std::max<int64_t>(budget / per_row, 4));
  const int stride = std::max(1, rows / want);
  std::vector<int> v;
  for (int r = 0; r < rows; r += stride) v.push_back(r);
  if (v.empty() || v.back() != rows - 1) v.push_back(rows - 1);
  return v;
}

// WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh sets it under compute-sanitizer racecheck, which
// instruments every shared-memory access): fewer and smaller GPU cases.
bool quick() {
  return std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
}

std::string type_str(GgmlType t) {
  return std::string(ggml_type_name(static_cast<uint32_t>(t)));
}

bool is_k(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}

// ---------------------------------------------------------------------------------------
// HOST EMULATION of qgemm_kernel: every CTA of the grid, its 256 threads stepping through
// fetch_w / fetch_a / commit / compute_step in the kernel's phases (prefetching or not), the
// combine butterfly of the lane flavours on arrays (butterfly8_host / butterfly4_host: the shuffle
// sequence), then store_tile.

template <GgmlType T, Flavor FL, int TT, bool PF, bool RING, int BR>
void emulate_qgemm(const std::vector<uint8_t>& w, int rows, int cols, const HostActs& acts,
                   int n_tok, const BatchOrder& order, std::vector<float>& y, bool accumulate) {
  using G = qg::Geo<FL, TT, BR>;
  const size_t row_bytes = ggml_row_bytes(T, cols);
  const int nb = cols / (qg::is_k<T>() ? 256 : 32);
  const int steps = qg::is_k<T>() ? nb : (nb + qg::kUnits - 1) / qg::kUnits;
  const int gemm_end = order.batch_n - order.batch_n % 4 - order.t0;
  auto s = std::make_unique<qg::Smem<FL, TT, BR>>();
  std::vector<qg::Acc<FL, TT, BR>> acc(qg::kThreads);
  std::vector<qg::Stage<T, FL, TT, BR>> stage(qg::kThreads);
  // RING: the raw bytes of a step as the kernel's cp.async pieces land them (zero outside the
  // matrix); fetch_w_ring reads each thread's unit from there.
  std::vector<uint8_t> ring(RING ? static_cast<size_t>(qg::ring_stage_bytes<T, BR>()) : 0);
  const int gx = (rows + BR - 1) / BR, gy = (n_tok + G::BT - 1) / G::BT;
  for (int bx = 0; bx < gx; ++bx) {
    for (int by = 0; by < gy; ++by) {
      const int row0 = bx * BR, tok0 = by * G::BT;
      // poison shared memory: every value the threads read must have been written
      std::memset(s.get(), 0xFF, sizeof(*s));
      for (auto& a : acc) qg::zero_acc(a);
      // The kernel's phases (PF: step + 1 fetched after the barrier, before step's chains;
      // otherwise fetched right before its commit). Stage registers: one per thread.
      auto fetch = [&](int step) {
        if constexpr (RING) {
          std::fill(ring.begin(), ring.end(), uint8_t{0xA5});  // past the rows: never used
          for (int n = 0; n < qg::ring_pieces<T, BR>(); ++n) {
            int dst = 0;
            const uint8_t* src = nullptr;
            if (qg::ring_piece<T>(n, step, w.data(), rows, row_bytes, row0, dst, src))
              std::memcpy(ring.data() + dst, src, 8);
            else
              std::memset(ring.data() + dst, 0, 8);
          }
        }
        for (int tid = 0; tid < qg::kThreads; ++tid) {
          auto& st = stage[static_cast<size_t>(tid)];
          if constexpr (RING)
            qg::fetch_w_ring(tid, step, ring.data(), rows, row0, nb, st);
          else
            qg::fetch_w(tid, step, w.data(), rows, row_bytes, row0, nb, st);
          qg::fetch_a(tid, step, acts.q.data(), acts.d.data(), acts.bs.data(), cols, nb, tok0,
                      n_tok, st);
        }
      };
      fetch(0);
      for (int step = 0; step < steps; ++step) {
        if (step > 0 && !PF) fetch(step);
        for (int tid = 0; tid < qg::kThreads; ++tid)
          qg::commit(tid, stage[static_cast<size_t>(tid)], *s);
        if (PF && step + 1 < steps) fetch(step + 1);
        const int nunits =
            qg::is_k<T>() ? qg::kUnits : std::min(qg::kUnits, nb - step * qg::kUnits);
        for (int tid = 0; tid < qg::kThreads; ++tid)
          qg::compute_step<T, FL, TT>(tid, *s, nunits,
                                      qg::gemm_mask_of<FL, TT>(tid, tok0, gemm_end),
                                      acc[static_cast<size_t>(tid)]);
      }
      for (int tid = 0; tid < qg::kThreads; ++tid) {
        for (int i = 0; i < G::RT; ++i) {
          for (int j = 0; j < TT; ++j) {
            float v = acc[static_cast<size_t>(tid)].acc[i][j];
            float m = acc[static_cast<size_t>(tid)].accm[i][j];
            if constexpr (FL == Flavor::Q0Lanes) {  // thread L: chains L (acc), L + 4 (accm)
              if ((tid & 3) != 0) continue;
              float lanes[8];
              for (int l = 0; l < 4; ++l) {
                lanes[l] = acc[static_cast<size_t>(tid + l)].acc[i][j];
                lanes[l + 4] = acc[static_cast<size_t>(tid + l)].accm[i][j];
              }
              v = qg::butterfly8_host(lanes);
            } else if constexpr (qg::lane_flavor<FL>()) {
              if ((tid & 7) != 0) continue;
              float lanes[8], mins[4];
              for (int l = 0; l < 8; ++l) lanes[l] = acc[static_cast<size_t>(tid + l)].acc[i][j];
              for (int l = 0; l < 4; ++l) mins[l] = acc[static_cast<size_t>(tid + l)].accm[i][j];
              v = qg::butterfly8_host(lanes);
              m = qg::butterfly4_host(mins);
            }
            s->out[qg::thread_tok<FL, TT>(tid, j) * G::OS + qg::thread_row<FL, TT>(tid, i)] =
                qg::final_value<FL>(v, m);
          }
        }
      }
      for (int tid = 0; tid < qg::kThreads; ++tid)
        qg::store_tile<FL, TT>(tid, *s, row0, rows, tok0, n_tok, y.data(), accumulate ? 1 : 0);
    }
  }
}

struct HostCase {
  int rows, cols, n_tok;
  BatchOrder order;
};

template <GgmlType T, Flavor FL, int TT, int BR = qg::kBR>
void host_cases(const std::vector<HostCase>& cases, uint64_t seed) {
  int k = 0;
  for (const HostCase& c : cases) {
    const bool accumulate = (k++ % 2) == 1;
    const auto w = random_weights(T, c.rows, c.cols, ++seed);
    HostActs acts = make_acts(T, c.n_tok, c.cols, ++seed);
    std::vector<float> y0(static_cast<size_t>(c.n_tok) * c.rows, NAN);
    if (accumulate) {
      XorShift rng(seed);
      for (float& v : y0) v = rng.uniform(-4.0f, 4.0f);
    }
    std::vector<float> ref = y0, got = y0;
    const auto rows = all_rows(c.rows);
    cpu_rows(T, w, c.rows, c.cols, acts, c.order, rows, accumulate, ref);
    // the two kernel variants (prefetch on / off) on alternate cases
    const bool pf = (k / 2) % 2 == 0;
    // the weight ring where rows are 8-byte aligned (launch() takes it for batches of up to
    // 32 tokens; the emulation alternates the two load paths over the cases that allow it)
    const bool ring = qg::ring_type<T>() && ggml_row_bytes(T, c.cols) % 8 == 0 && k % 3 != 0;
    auto run = [&](auto pf_c, auto ring_c) {
      emulate_qgemm<T, FL, TT, decltype(pf_c)::value, decltype(ring_c)::value, BR>(
          w, c.rows, c.cols, acts, c.n_tok, c.order, got, accumulate);
    };
    if (ring) {
      if (pf)
        run(std::true_type{}, std::true_type{});
      else
        run(std::false_type{}, std::true_type{});
    } else {
      if (pf)
        run(std::true_type{}, std::false_type{});
      else
        run(std::false_type{}, std::false_type{});
    }
    const std::string what =
        std::string(pf ? "prefetch " : "") + (ring ? "ring " : "") + type_str(T) + " flavour " +
        std::to_string(static_cast<int>(FL)) + " TT " + std::to_string(TT) + " BR " +
        std::to_string(BR) + " rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) +
        " n_tok " + std::to_string(c.n_tok) + " batch_n " + std::to_string(c.order.batch_n) +
        " t0 " + std::to_string(c.order.t0) + (accumulate ? " accumulate" : "");
    EXPECT_EQ(count_mismatch(got, ref, c.rows, c.n_tok, rows, what), 0u) << what;
  }
}

// Q0 shapes: 40 rows (partial row tile, rows % 8 != 0), 64 rows (repacked for Q4_0); cols 288
// (a partial 8-block step) and 512; token counts across partial token tiles; BatchOrder
// slices crossing the gemm / gemv boundary.
// Rows of 512 and 384 columns (16 / 12 blocks, 8-byte aligned rows: the weight ring, 384
// with a 4-block last step), 288 and 96 (not aligned: fetch_w).
std::vector<HostCase> q0_cases(int rows_a, int rows_b) {
  return {{rows_a, 288, 5, {5, 0}},    {rows_b, 512, 17, {17, 0}}, {rows_a, 512, 19, {50, 31}},
          {rows_b, 288, 13, {63, 50}}, {rows_b, 96, 33, {33, 0}},  {rows_a, 384, 21, {21, 0}},
          {rows_b, 384, 9, {9, 0}}};
}
std::vector<HostCase> k_cases(int rows_a, int rows_b) {
  return {{rows_a, 256, 5, {5, 0}},
          {rows_b, 512, 17, {17, 0}},
          {rows_a, 512, 19, {50, 31}},
          {rows_b, 768, 13, {63, 50}},
          {rows_b, 256, 35, {35, 0}}};
}

// ActBuf::mma for a qgemm of n_tok tokens over weights of `elems` elements together
// (qgemm_weight_elems): the tensor-core Q0 tile's scratch, as the engine sizes it for batches
// that reach that tile by default (always: `variant`, the tile forced).
size_t mma_bytes_for(int n_tok, int cols, int64_t elems, bool variant = false) {
  if (!variant && n_tok < kern::exact::kQgemmMmaMinTokens) return 0;
  return kern::exact::qgemm_scratch_bytes(n_tok, cols, elems);
}

// REQ: WRK-D15
TEST(ExactQgemmHost, Q0LanesEmulationMatchesCpuReference) {
  host_cases<GgmlType::Q8_0, Flavor::Q0Lanes, 1>(q0_cases(40, 64), 100);
  host_cases<GgmlType::Q8_0, Flavor::Q0Lanes, 4>(q0_cases(40, 64), 200);
  host_cases<GgmlType::Q5_0, Flavor::Q0Lanes, 2>(q0_cases(40, 64), 300);
  host_cases<GgmlType::Q5_0, Flavor::Q0Lanes, 4>(q0_cases(40, 64), 400);
  host_cases<GgmlType::Q4_0, Flavor::Q0Lanes, 4>(q0_cases(42, 38), 500);  // rows % 8 != 0
  // 16-row tiles (small grids take them at the smallest token tile)
  host_cases<GgmlType::Q8_0, Flavor::Q0Lanes, 1, 16>(q0_cases(40, 64), 150);
  host_cases<GgmlType::Q5_0, Flavor::Q0Lanes, 1, 16>(q0_cases(24, 64), 350);
  host_cases<GgmlType::Q4_0, Flavor::Q0Lanes, 1, 16>(q0_cases(42, 38), 550);
}

// REQ: WRK-D15
TEST(ExactQgemmHost, Q4_0RepackEmulationMatchesCpuReference) {
  host_cases<GgmlType::Q4_0, Flavor::Q4_0Rep, 1>(q0_cases(40, 64), 600);
  host_cases<GgmlType::Q4_0, Flavor::Q4_0Rep, 4>(q0_cases(48, 64), 700);
  host_cases<GgmlType::Q4_0, Flavor::Q4_0Rep, 1, 16>(q0_cases(40, 64), 650);
}

// REQ: WRK-D15
TEST(ExactQgemmHost, KQuantEmulationMatchesCpuReference) {
  host_cases<GgmlType::Q6_K, Flavor::Q6K, 2>(k_cases(40, 64), 800);
  host_cases<GgmlType::Q6_K, Flavor::Q6K, 8>(k_cases(40, 64), 900);
  host_cases<GgmlType::Q4_K, Flavor::Q4KLanes, 4>(k_cases(42, 38), 1000);
  host_cases<GgmlType::Q4_K, Flavor::Q4KRep, 1>(k_cases(40, 64), 1100);
  host_cases<GgmlType::Q4_K, Flavor::Q4KRep, 2>(k_cases(48, 64), 1200);
  host_cases<GgmlType::Q6_K, Flavor::Q6K, 2, 16>(k_cases(40, 24), 850);
  host_cases<GgmlType::Q4_K, Flavor::Q4KLanes, 2, 16>(k_cases(42, 38), 1050);
  host_cases<GgmlType::Q4_K, Flavor::Q4KRep, 1, 16>(k_cases(40, 64), 1150);
}

// The tensor-core tile's scratch as the engine and the tests size it: act_buffer_at carves it
// after the activation regions, 256-aligned, inside act_buffer_bytes; qgemm_scratch_bytes holds
// at least the f16 weights (2 bytes an element, rows rounded up to the tile's 64) and the f16
// activations of the largest batch, and never shrinks as a launch or batch grows.
// REQ: WRK-D15
TEST(ExactQgemmHost, TensorCoreScratchLayout) {
  namespace ex = kern::exact;
  EXPECT_EQ(ex::qgemm_weight_elems(64, 896), 64 * 896);
  EXPECT_EQ(ex::qgemm_weight_elems(65, 896), 128 * 896);
  EXPECT_EQ(ex::qgemm_weight_elems(1, 128), 64 * 128);
  for (const int n_tok : {1, 31, 512, 530}) {
    for (const int cols : {128, 896, 4864}) {
      const int64_t elems = 2 * ex::qgemm_weight_elems(200, cols);
      const size_t mb = ex::qgemm_scratch_bytes(n_tok, cols, elems);
      const size_t tp = static_cast<size_t>((n_tok + 31) / 32 * 32);
      EXPECT_GE(mb, static_cast<size_t>(elems) * 2 + tp * static_cast<size_t>(cols) * 2);
      EXPECT_LE(ex::qgemm_scratch_bytes(n_tok, cols, elems / 2), mb);
      EXPECT_LE(mb, ex::qgemm_scratch_bytes(n_tok + 32, cols, elems));
      const size_t total = ex::act_buffer_bytes(n_tok, cols, mb);
      std::vector<uint8_t> mem(total + 256);  // only addresses are taken; base 256-aligned
      uint8_t* base = mem.data() + (256 - reinterpret_cast<uintptr_t>(mem.data()) % 256) % 256;
      const ActBuf a = ex::act_buffer_at(base, n_tok, cols, mb);
      ASSERT_NE(a.mma, nullptr);
      EXPECT_EQ(a.mma_bytes, mb);
      const auto off = static_cast<size_t>(a.mma - base);
      EXPECT_EQ(off % 256, 0u);
      // after bsum ([n_tok][cols / 16] int32), the last of the activation regions
      EXPECT_GE(off, static_cast<size_t>(reinterpret_cast<const uint8_t*>(a.bsum) - base) +
                         static_cast<size_t>(n_tok) * (cols / 16) * sizeof(int32_t));
      EXPECT_LE(off + mb, total);
      EXPECT_EQ(ex::act_buffer_at(base, n_tok, cols).mma, nullptr);  // no scratch asked for
      EXPECT_EQ(ex::act_buffer_bytes(n_tok, cols, 0) + (mb + 255) / 256 * 256, total);
    }
  }
}

// The int8 byte arithmetic of the weight unpacking (nibble - 8, 5-bit - 16) over all values.
TEST(ExactQgemmHost, ByteOffsetsAreExact) {
  for (uint32_t v = 0; v < 16; ++v) {
    const uint32_t x = qg::sub8_bytes(v | (v << 8) | ((15 - v) << 16) | (v << 24));
    EXPECT_EQ(static_cast<int8_t>(x & 0xFF), static_cast<int>(v) - 8);
    EXPECT_EQ(static_cast<int8_t>((x >> 16) & 0xFF), 7 - static_cast<int>(v));
  }
  for (uint32_t v = 0; v < 32; ++v) {
    const uint32_t x = qg::sub16_bytes(v | ((31 - v) << 8) | (v << 16) | (v << 24));
    EXPECT_EQ(static_cast<int8_t>(x & 0xFF), static_cast<int>(v) - 16);
    EXPECT_EQ(static_cast<int8_t>((x >> 8) & 0xFF), 15 - static_cast<int>(v));
    EXPECT_EQ(static_cast<int8_t>((x >> 24) & 0xFF), static_cast<int>(v) - 16);
  }
  for (int s = -(1 << 22); s < (1 << 22); s += 997)
    EXPECT_EQ(qg::small_i2f(s), static_cast<float>(s));
  EXPECT_EQ(bits(qg::small_i2f(0)), 0u);
  EXPECT_EQ(qg::small_i2f((1 << 22) - 1), static_cast<float>((1 << 22) - 1));
  // dp4a with the bias as its accumulator input gives the same floats
  std::mt19937 rb(5);
  for (int k = 0; k < 100000; ++k) {
    const uint32_t a = static_cast<uint32_t>(rb()), b = static_cast<uint32_t>(rb());
    const int plain = kern::exact::qm::dp4a(a, b, 0);
    EXPECT_EQ(bits(qg::biased_i2f(kern::exact::qm::dp4a(a, b, qg::kI2fBias))),
              bits(qg::small_i2f(plain)));
    EXPECT_EQ(qg::small_i2f(plain), static_cast<float>(plain));
  }
}

// ---------------------------------------------------------------------------------------
// GPU tests

struct GpuCase {
  int n_tok;
  BatchOrder order;
};

kern::WeightView view_of(GgmlType type, const DevArray<uint8_t>& dw, int rows, int cols) {
  kern::WeightView wv;
  wv.data = dw.get();
  wv.type = static_cast<uint32_t>(type);
  wv.rows = rows;
  wv.cols = cols;
  wv.row_bytes = ggml_row_bytes(type, cols);
  return wv;
}

void upload_acts(const HostActs& h, const ActBuf& a) {
  cudaMemcpy(a.q, h.q.data(), h.q.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(a.d, h.d.data(), h.d.size() * 4, cudaMemcpyHostToDevice);
  if (!h.bs.empty()) cudaMemcpy(a.bsum, h.bs.data(), h.bs.size() * 4, cudaMemcpyHostToDevice);
}

// One type: rows 896 / 4864 / 130 / 2048 x cols 896 / 4864 / 256 (as the block allows) x
// token counts and BatchOrder slices, accumulate alternating. Full output vs exact::matmul,
// and vs the CPU reference on checked_rows (all rows when cheap).
void run_type(GgmlType type) {
  const std::vector<int> rows_list =
      quick() ? std::vector<int>{130, 896} : std::vector<int>{896, 4864, 130, 2048};
  const std::vector<int> cols_list =
      quick() ? std::vector<int>{256, 896} : std::vector<int>{896, 4864, 256};
  const std::vector<GpuCase> quick_cases = {
      {8, {8, 0}}, {17, {17, 0}}, {64, {64, 0}}, {32, {64, 32}}, {19, {50, 31}}};
  const std::vector<GpuCase> all_cases = {
      {8, {8, 0}},    {16, {16, 0}},  {17, {17, 0}},  {31, {31, 0}}, {64, {64, 0}}, {512, {512, 0}},
      {32, {64, 32}}, {19, {50, 31}}, {13, {63, 50}}, {33, {37, 0}}, {45, {47, 0}}};
  const std::vector<GpuCase>& cases = quick() ? quick_cases : all_cases;
  uint64_t seed = static_cast<uint64_t>(type) * 7919;
  int case_no = 0;
  for (const int cols : cols_list) {
    if (cols % (is_k(type) ? 256 : 32) != 0) continue;
    for (const int rows : rows_list) {
      const auto w = random_weights(type, rows, cols, ++seed);
      DevArray<uint8_t> dw(w);
      const kern::WeightView wv = view_of(type, dw, rows, cols);
      for (const GpuCase& gc : cases) {
        const bool accumulate = (case_no++ % 2) == 1;
        const int n_tok = gc.n_tok;
        HostActs acts = make_acts(type, n_tok, cols, ++seed);
        const size_t mb = mma_bytes_for(n_tok, cols, kern::exact::qgemm_weight_elems(rows, cols));
        DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(n_tok, cols, mb));
        const ActBuf a = kern::exact::act_buffer_at(buf.get(), n_tok, cols, mb);
        upload_acts(acts, a);
        std::vector<float> y0(static_cast<size_t>(n_tok) * rows, NAN);
        if (accumulate) {
          XorShift rng(seed);
          for (float& v : y0) v = rng.uniform(-4.0f, 4.0f);
        }
        DevArray<float> dq(y0.size()), dn(y0.size()), dm(y0.size());  // NaN-poisoned
        if (accumulate) {
          dq.upload(y0);
          dn.upload(y0);
          dm.upload(y0);
        }
        kern::exact::qgemm(wv, a, n_tok, gc.order, dq.get(), accumulate, nullptr);
        qg::qgemm_variant(wv, a, n_tok, gc.order, dn.get(), accumulate, nullptr, 0);
        kern::exact::matmul(wv, a, n_tok, gc.order, dm.get(), accumulate, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = dq.download();
        const auto nopf = dn.download();
        const auto mm = dm.download();
        const std::string what = type_str(type) + " rows " + std::to_string(rows) + " cols " +
                                 std::to_string(cols) + " n_tok " + std::to_string(n_tok) +
                                 " batch_n " + std::to_string(gc.order.batch_n) + " t0 " +
                                 std::to_string(gc.order.t0) + (accumulate ? " accumulate" : "");
        const auto every = all_rows(rows);
        ASSERT_EQ(count_mismatch(got, mm, rows, n_tok, every, what + " vs matmul"), 0u) << what;
        ASSERT_EQ(count_mismatch(nopf, mm, rows, n_tok, every, what + " no prefetch vs matmul"), 0u)
            << what;
        const auto which = checked_rows(rows, cols, n_tok, 4'000'000);
        std::vector<float> ref = y0;
        cpu_rows(type, w, rows, cols, acts, gc.order, which, accumulate, ref);
        ASSERT_EQ(count_mismatch(got, ref, rows, n_tok, which, what + " vs cpu"), 0u) << what;
      }
    }
  }
}

// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQgemmGpu, Q8_0MatchesMatmulAndCpuReference) {
  REQUIRE_GPU();
  run_type(GgmlType::Q8_0);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQgemmGpu, Q4_0MatchesMatmulAndCpuReference) {
  REQUIRE_GPU();
  run_type(GgmlType::Q4_0);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQgemmGpu, Q5_0MatchesMatmulAndCpuReference) {
  REQUIRE_GPU();
  run_type(GgmlType::Q5_0);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQgemmGpu, Q4_KMatchesMatmulAndCpuReference) {
  REQUIRE_GPU();
  run_type(GgmlType::Q4_K);
}
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQgemmGpu, Q6_KMatchesMatmulAndCpuReference) {
  REQUIRE_GPU();
  run_type(GgmlType::Q6_K);
}

// The 0.5B Q4_K_M model's matrices (q/o 896x896 and k/v 128x896 Q5_0, gate/up 4864x896 Q5_0,
// down 896x4864 Q4_K (repacked) or Q6_K, output 151936x896 Q8_0) and the other types at
// the FFN shape, per token count: qgemm and its no-prefetch variant bitwise equal to matmul
// over the whole output (timings: bench/kernel_bench).
// REQ: WRK-D15
TEST(ExactQgemmGpu, MatchesMatmulAtModelShapes) {
  REQUIRE_GPU();
  struct Shape {
    GgmlType type;
    int rows, cols;
    const char* name;
  };
  const Shape shapes[] = {{GgmlType::Q5_0, 896, 896, "attn q/o"},
                          {GgmlType::Q5_0, 128, 896, "attn k/v"},
                          {GgmlType::Q5_0, 4864, 896, "ffn gate/up"},
                          {GgmlType::Q4_K, 896, 4864, "ffn down Q4_K"},
                          {GgmlType::Q6_K, 896, 4864, "ffn down Q6_K"},
                          {GgmlType::Q8_0, 4864, 896, "Q8_0 4864x896"},
                          {GgmlType::Q4_0, 4864, 896, "Q4_0 4864x896"},
                          {GgmlType::Q4_K, 4864, 1024, "Q4_K 4864x1024"},
                          {GgmlType::Q4_K, 4866, 1024, "Q4_K 4866x1024 (lanes)"},
                          {GgmlType::Q8_0, 151936, 896, "output Q8_0"}};
  const int toks[] = {8, 16, 32, 64, 128, 512};
  uint64_t seed = 77;
  for (const Shape& sh : shapes) {
    const auto w = random_weights(sh.type, sh.rows, sh.cols, ++seed);
    DevArray<uint8_t> dw(w);
    const kern::WeightView wv = view_of(sh.type, dw, sh.rows, sh.cols);
    for (const int n_tok : toks) {
      if (sh.rows > 100000 && n_tok > 64) continue;  // 151936 x 512 outputs: 300 MB each
      if (quick() && (sh.rows > 5000 || n_tok != 64)) continue;
      HostActs acts = make_acts(sh.type, n_tok, sh.cols, ++seed);
      const size_t mb =
          mma_bytes_for(n_tok, sh.cols, kern::exact::qgemm_weight_elems(sh.rows, sh.cols));
      DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(n_tok, sh.cols, mb));
      const ActBuf a = kern::exact::act_buffer_at(buf.get(), n_tok, sh.cols, mb);
      upload_acts(acts, a);
      DevArray<float> dq(static_cast<size_t>(n_tok) * sh.rows), dn(dq.size()), dm(dq.size());
      const BatchOrder order{n_tok, 0};
      kern::exact::qgemm(wv, a, n_tok, order, dq.get(), false, nullptr);
      qg::qgemm_variant(wv, a, n_tok, order, dn.get(), false, nullptr, 0);
      kern::exact::matmul(wv, a, n_tok, order, dm.get(), false, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto mm = dm.download();
      const std::string what = std::string(sh.name) + " n_tok " + std::to_string(n_tok);
      const auto every = all_rows(sh.rows);
      ASSERT_EQ(count_mismatch(dq.download(), mm, sh.rows, n_tok, every, what), 0u) << what;
      ASSERT_EQ(count_mismatch(dn.download(), mm, sh.rows, n_tok, every, what + " no prefetch"), 0u)
          << what;
    }
  }
}

// Q / K / V and gate + up in one launch (qgemm_multi, linear.cu's qkv and ffn): each weight's
// output bitwise equal to its own qgemm launch over the whole output (NaN-poisoned), and to the
// CPU reference on checked rows, for every type at the model's shapes (K-quants at a width of
// 1024: theirs must be a multiple of 256) and token counts on both sides of the ring's limit,
// incl. partial token tiles and a BatchOrder slice; weights that cannot share a launch are
// declined with nothing written.
// REQ: M0-W-1430 WRK-D15
TEST(ExactQgemmGpu, SeveralWeightsInOneLaunch) {
  REQUIRE_GPU();
  struct Set {
    std::vector<int> rows;
    const char* name;
  };
  const Set sets[] = {{{896, 128, 128}, "q/k/v"}, {{4864, 4864}, "gate/up"}, {{136, 40}, "136/40"}};
  const GgmlType types[] = {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0, GgmlType::Q4_K,
                            GgmlType::Q6_K};
  const std::vector<GpuCase> cases =
      quick() ? std::vector<GpuCase>{{32, {32, 0}}, {64, {64, 0}}}
              : std::vector<GpuCase>{{16, {16, 0}},  {32, {32, 0}},   {45, {47, 0}},
                                     {32, {64, 32}}, {128, {128, 0}}, {512, {512, 0}}};
  uint64_t seed = 4242;
  for (const GgmlType type : types) {
    const int cols = is_k(type) ? 1024 : 896;
    for (const Set& set : sets) {
      if (quick() && set.rows[0] > 1000) continue;
      const int n = static_cast<int>(set.rows.size());
      std::vector<std::vector<uint8_t>> hw;
      std::vector<std::unique_ptr<DevArray<uint8_t>>> dw;
      std::vector<kern::WeightView> wv;
      for (int i = 0; i < n; ++i) {
        hw.push_back(random_weights(type, set.rows[i], cols, ++seed));
        dw.push_back(std::make_unique<DevArray<uint8_t>>(hw.back()));
      }
      for (int i = 0; i < n; ++i) wv.push_back(view_of(type, *dw[i], set.rows[i], cols));
      const kern::WeightView* ws[3] = {&wv[0], n > 1 ? &wv[1] : nullptr, n > 2 ? &wv[2] : nullptr};
      for (const GpuCase& gc : cases) {
        const int n_tok = gc.n_tok;
        HostActs acts = make_acts(type, n_tok, cols, ++seed);
        int64_t elems = 0;
        for (const int r : set.rows) elems += kern::exact::qgemm_weight_elems(r, cols);
        const size_t mb = mma_bytes_for(n_tok, cols, elems);
        DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(n_tok, cols, mb));
        const ActBuf a = kern::exact::act_buffer_at(buf.get(), n_tok, cols, mb);
        upload_acts(acts, a);
        std::vector<std::unique_ptr<DevArray<float>>> ym, ys;
        float* yp[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < n; ++i) {
          const size_t sz = static_cast<size_t>(n_tok) * set.rows[i];
          ym.push_back(std::make_unique<DevArray<float>>(sz));  // NaN-poisoned
          ys.push_back(std::make_unique<DevArray<float>>(sz));
          yp[i] = ym.back()->get();
          kern::exact::qgemm(wv[i], a, n_tok, gc.order, ys.back()->get(), false, nullptr);
        }
        int64_t total_rows = 0;
        for (const int r : set.rows) total_rows += r;
        if (!kern::exact::qgemm_takes(static_cast<uint32_t>(type), n_tok, total_rows)) {
          // below qgemm's token limit (Q4_K under 32): declined, the per-weight path runs
          ASSERT_FALSE(kern::exact::qgemm_multi(ws, yp, n, a, n_tok, gc.order, nullptr));
          continue;
        }
        ASSERT_TRUE(kern::exact::qgemm_multi(ws, yp, n, a, n_tok, gc.order, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (int i = 0; i < n; ++i) {
          const int rows = set.rows[i];
          const std::string what = type_str(type) + " " + set.name + " weight " +
                                   std::to_string(i) + " n_tok " + std::to_string(n_tok) +
                                   " batch_n " + std::to_string(gc.order.batch_n);
          const auto got = ym[static_cast<size_t>(i)]->download();
          ASSERT_EQ(count_mismatch(got, ys[static_cast<size_t>(i)]->download(), rows, n_tok,
                                   all_rows(rows), what + " vs one launch"),
                    0u)
              << what;
          const auto which = checked_rows(rows, cols, n_tok, 1'000'000);
          std::vector<float> ref(got.size(), NAN);
          cpu_rows(type, hw[static_cast<size_t>(i)], rows, cols, acts, gc.order, which, false, ref);
          ASSERT_EQ(count_mismatch(got, ref, rows, n_tok, which, what + " vs cpu"), 0u) << what;
        }
      }
    }
  }
  // Declined, nothing launched: types or widths that differ, a token count qgemm does not take.
  const auto w8 = random_weights(GgmlType::Q8_0, 64, 256, 1);
  const auto w5 = random_weights(GgmlType::Q5_0, 64, 256, 2);
  const auto w8w = random_weights(GgmlType::Q8_0, 64, 512, 3);
  DevArray<uint8_t> d8(w8), d5(w5), d8w(w8w);
  const kern::WeightView v8 = view_of(GgmlType::Q8_0, d8, 64, 256),
                         v5 = view_of(GgmlType::Q5_0, d5, 64, 256),
                         v8w = view_of(GgmlType::Q8_0, d8w, 64, 512);
  DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(64, 512));
  const ActBuf a = kern::exact::act_buffer_at(buf.get(), 64, 512);
  DevArray<float> y0(64 * 64), y1(64 * 64);
  float* yp[2] = {y0.get(), y1.get()};
  const kern::WeightView* mixed[2] = {&v8, &v5};
  const kern::WeightView* widths[2] = {&v8, &v8w};
  const kern::WeightView* same[2] = {&v8, &v8};
  EXPECT_FALSE(kern::exact::qgemm_multi(mixed, yp, 2, a, 64, BatchOrder{64, 0}, nullptr));
  EXPECT_FALSE(kern::exact::qgemm_multi(widths, yp, 2, a, 64, BatchOrder{64, 0}, nullptr));
  EXPECT_FALSE(kern::exact::qgemm_multi(same, yp, 2, a, 8, BatchOrder{8, 0}, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const float v : y0.download()) ASSERT_TRUE(std::isnan(v));
  for (const float v : y1.download()) ASSERT_TRUE(std::isnan(v));
}

// The tensor-core tiles (qg::kVariantMma, the default for big Q8_0 / Q5_0 / Q4_0-lane, repacked
// Q4_K and Q6_K prompt batches) on their own, on shapes the default does not give them too
// (partial row and token tiles, one token, widths from one step, Q4_K's gemv tokens past
// n_tok - n_tok % 4, Q6_K rows at every offset mod 16): bitwise equal to the dp4a tile over the
// whole output (NaN-poisoned) and to the CPU reference on checked rows, accumulate alternating;
// Q6_K also at the extremes its exactness argument bounds (every quant 63, scales -128 and 127,
// activation quants all +-127: the lo chains' sums near their bound); weights they cannot take (a
// width that is not a multiple of the 128-element step, Q4_K that is not repacked, repacked
// Q4_0, Q6_K whose data is not 16-byte aligned, Q8_0 without the Q0 tile's scratch) are refused
// with an error.
// REQ: M0-W-1430 M0-W-1201 WRK-D15
TEST(ExactQgemmGpu, TensorCoreTileMatchesDp4aTileAndCpuReference) {
  REQUIRE_GPU();
  struct Shape {
    GgmlType type;
    int rows, cols;
    bool extreme = false;
  };
  const std::vector<Shape> shapes =
      quick() ? std::vector<Shape>{{GgmlType::Q8_0, 130, 256}, {GgmlType::Q8_0, 64, 128},
                                   {GgmlType::Q5_0, 70, 896},  {GgmlType::Q4_K, 136, 512},
                                   {GgmlType::Q6_K, 70, 512},  {GgmlType::Q6_K, 64, 256, true}}
              : std::vector<Shape>{{GgmlType::Q8_0, 130, 256},      {GgmlType::Q8_0, 4864, 896},
                                   {GgmlType::Q8_0, 896, 4864},     {GgmlType::Q8_0, 64, 128},
                                   {GgmlType::Q5_0, 1000, 896},     {GgmlType::Q5_0, 70, 1024},
                                   {GgmlType::Q4_0, 130, 896},      {GgmlType::Q4_0, 1001, 384},
                                   {GgmlType::Q4_K, 136, 512},      {GgmlType::Q4_K, 896, 4864},
                                   {GgmlType::Q4_K, 1000, 768},     {GgmlType::Q6_K, 896, 4864},
                                   {GgmlType::Q6_K, 130, 768},      {GgmlType::Q6_K, 71, 256},
                                   {GgmlType::Q6_K, 64, 1280, true}};
  const std::vector<int> toks =
      quick() ? std::vector<int>{1, 33} : std::vector<int>{1, 17, 64, 530};
  uint64_t seed = 31337;
  int case_no = 0;
  for (const Shape& sh : shapes) {
    auto w = random_weights(sh.type, sh.rows, sh.cols, ++seed);
    if (sh.extreme) {  // Q6_K: every quant 63, scales -128 / 127 by super-block
      const size_t nb = w.size() / 210;
      for (size_t b = 0; b < nb; ++b) {
        std::memset(w.data() + 210 * b, 0xFF, 192);
        std::memset(w.data() + 210 * b + 192, (b % 3) == 1 ? 0x7F : 0x80, 16);
      }
    }
    DevArray<uint8_t> dw(w);
    const kern::WeightView wv = view_of(sh.type, dw, sh.rows, sh.cols);
    for (const int n_tok : toks) {
      const bool accumulate = (case_no++ % 2) == 1;
      HostActs acts = sh.extreme ? extreme_acts(sh.type, n_tok, sh.cols)
                                 : make_acts(sh.type, n_tok, sh.cols, ++seed);
      const size_t mb = mma_bytes_for(
          n_tok, sh.cols, kern::exact::qgemm_weight_elems(sh.rows, sh.cols), /*variant=*/true);
      DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(n_tok, sh.cols, mb));
      const ActBuf a = kern::exact::act_buffer_at(buf.get(), n_tok, sh.cols, mb);
      upload_acts(acts, a);
      std::vector<float> y0(static_cast<size_t>(n_tok) * sh.rows, NAN);
      if (accumulate) {
        XorShift rng(seed);
        for (float& v : y0) v = rng.uniform(-4.0f, 4.0f);
      }
      DevArray<float> dm(y0.size()), dd(y0.size());
      if (accumulate) {
        dm.upload(y0);
        dd.upload(y0);
      }
      const BatchOrder order{n_tok, 0};
      qg::qgemm_variant(wv, a, n_tok, order, dm.get(), accumulate, nullptr, qg::kVariantMma);
      qg::qgemm_variant(wv, a, n_tok, order, dd.get(), accumulate, nullptr, 0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = dm.download();
      const std::string what = type_str(sh.type) + " rows " + std::to_string(sh.rows) + " cols " +
                               std::to_string(sh.cols) + " n_tok " + std::to_string(n_tok) +
                               (accumulate ? " accumulate" : "");
      ASSERT_EQ(count_mismatch(got, dd.download(), sh.rows, n_tok, all_rows(sh.rows),
                               what + " tensor cores vs dp4a"),
                0u)
          << what;
      const auto which = checked_rows(sh.rows, sh.cols, n_tok, 2'000'000);
      std::vector<float> ref = y0;
      cpu_rows(sh.type, w, sh.rows, sh.cols, acts, order, which, accumulate, ref);
      ASSERT_EQ(count_mismatch(got, ref, sh.rows, n_tok, which, what + " tensor cores vs cpu"), 0u)
          << what;
    }
  }
  // refused: a width that is not a multiple of 128, a Q4_K that is not repacked (rows % 8 != 0),
  // a repacked Q4_0 (rows % 8 == 0), a Q6_K 2 bytes past a 16-byte boundary (each with the Q0
  // tile's scratch, so that only that reason is left), and a Q8_0 the Q0 tile takes but whose
  // ActBuf has no scratch
  const struct {
    GgmlType type;
    int rows, cols;
    int offset;
    bool scratch;
  } refused[] = {{GgmlType::Q8_0, 64, 160, 0, true},
                 {GgmlType::Q4_K, 66, 256, 0, true},
                 {GgmlType::Q6_K, 64, 256, 2, true},
                 {GgmlType::Q4_0, 64, 256, 0, true},
                 {GgmlType::Q8_0, 64, 256, 0, false}};
  for (const auto& r : refused) {
    auto wr = random_weights(r.type, r.rows, r.cols, ++seed);
    wr.insert(wr.begin(), static_cast<size_t>(r.offset), uint8_t{0});
    DevArray<uint8_t> dw(wr);
    kern::WeightView wv = view_of(r.type, dw, r.rows, r.cols);
    wv.data = dw.get() + r.offset;
    const size_t mb =
        r.scratch ? mma_bytes_for(4, r.cols, kern::exact::qgemm_weight_elems(r.rows, r.cols), true)
                  : 0;
    DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(4, r.cols, mb));
    const ActBuf a = kern::exact::act_buffer_at(buf.get(), 4, r.cols, mb);
    DevArray<float> y(static_cast<size_t>(4) * r.rows);
    EXPECT_THROW(
        qg::qgemm_variant(wv, a, 4, BatchOrder{4, 0}, y.get(), false, nullptr, qg::kVariantMma),
        WorkerError)
        << type_str(r.type) << " cols " << r.cols << (r.scratch ? "" : " without scratch");
  }
}

// REQ: WRK-D15
TEST(ExactQgemmGpu, TakesAndRejects) {
  const auto takes = [](GgmlType t, int n_tok, int64_t rows) {
    return kern::exact::qgemm_takes(static_cast<uint32_t>(t), n_tok, rows);
  };
  EXPECT_TRUE(takes(GgmlType::Q5_0, 512, 896));
  EXPECT_FALSE(takes(GgmlType::F16, 512, 896));
  EXPECT_FALSE(takes(GgmlType::Q5_0, 1, 4864));
  EXPECT_TRUE(takes(GgmlType::Q4_K, 64, 896));
  // the measured limits: 16 tokens, 8 for tall launches, Q4_K 32
  EXPECT_TRUE(takes(GgmlType::Q8_0, 16, 128));
  EXPECT_FALSE(takes(GgmlType::Q8_0, 15, 896));
  EXPECT_TRUE(takes(GgmlType::Q8_0, 8, 9728));
  EXPECT_FALSE(takes(GgmlType::Q8_0, 8, 896));
  EXPECT_FALSE(takes(GgmlType::Q8_0, 7, 9728));
  EXPECT_FALSE(takes(GgmlType::Q4_K, 31, 9728));
  EXPECT_TRUE(takes(GgmlType::Q6_K, 16, 896));
  REQUIRE_GPU();
  DevArray<uint8_t> buf(kern::exact::act_buffer_bytes(16, 512));
  const ActBuf a = kern::exact::act_buffer_at(buf.get(), 16, 512);
  DevArray<uint8_t> dw(ggml_row_bytes(GgmlType::Q4_K, 512) * 8);
  DevArray<float> y(16 * 8);
  kern::WeightView wv = view_of(GgmlType::Q4_K, dw, 8, 300);  // 300: not a multiple of 256
  EXPECT_THROW(kern::exact::qgemm(wv, a, 16, BatchOrder{16, 0}, y.get(), false, nullptr),
               WorkerError);
  wv = view_of(GgmlType::F32, dw, 8, 64);
  EXPECT_THROW(kern::exact::qgemm(wv, a, 16, BatchOrder{16, 0}, y.get(), false, nullptr),
               WorkerError);
}

}  // namespace
}  // namespace worker
