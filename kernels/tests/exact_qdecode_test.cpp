// One-token quantized products (kernels/matvec1_quant.cu, exact::matvec1_quant) against the
// CPU reference (cpu::dot_quantized with repacked = cpu::repacked_on_x86, gemv), bit for bit:
//  - HOST EMULATION tests (ExactQDecodeHost.*, run everywhere): the kernel's decomposition
//    (per-lane unit slots, passes of 32 units, chain lanes, combine) replayed on the host
//    with the same __host__ __device__ functions (kernels/exact_qdecode_math.cuh).
//  - GPU tests (ExactQDecodeGpu.*, "not run" without a CUDA device): matvec1_quant over the
//    full NaN-poisoned outputs, accumulate on and off, and against exact::matmul (n_tok 1) at
//    the decode shapes; the fused decode launches (matvec1_quant_multi: Q/K/V in one launch;
//    matvec1_quant_swiglu: gate + up + SwiGLU in one launch) bit for bit against
//    matvec1_quant per weight and the CPU reference. Timings: bench/kernel_bench.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "exact_ops_math.cuh"
#include "exact_qdecode_math.cuh"
#include "gguf/ggml_types.h"
#include "weights.cuh"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "common/test_helpers.h"
#include "exact_test_blocks.h"
#include "gpu_test_util.h"
#pragma GCC diagnostic pop

namespace worker {
namespace {

using test::bits;

namespace qd = kern::exact::qd;
using gputest::DevArray;
using kern::exact::ActBuf;

using exacttest::put_half;
using exacttest::random_weights;
using exacttest::XorShift;

cpu::QuantizedActivation random_act(GgmlType type, int64_t rows, int cols, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> mag(0.05f, 8.0f);
  std::normal_distribution<float> nd(0.0f, mag(rng));
  std::vector<float> x(static_cast<size_t>(cols));
  for (auto& v : x) v = nd(rng);
  cpu::QuantizedActivation a;
  cpu::quantize_activation(type, x.data(), cols, a);
  a.repacked = repacked(type, rows);
  a.repack_gemm = false;
  return a;
}

std::vector<float> cpu_ref(GgmlType type, const std::vector<uint8_t>& w, int64_t rows, int cols,
                           const cpu::QuantizedActivation& a) {
  const size_t rb = ggml_row_bytes(type, cols);
  std::vector<float> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    y[static_cast<size_t>(r)] =
        cpu::dot_quantized(type, w.data() + rb * static_cast<size_t>(r), a, nullptr);
  return y;
}

size_t count_mismatch(const std::vector<float>& got, const std::vector<float>& ref,
                      const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (bits(got[i]) != bits(ref[i])) {
      if (bad < 5)
        std::printf("  %s: mismatch at row %zu: got %a ref %a\n", what.c_str(), i,
                    static_cast<double>(got[i]), static_cast<double>(ref[i]));
      ++bad;
    }
  }
  return bad;
}

std::string type_str(GgmlType t) {
  return std::string(ggml_type_name(static_cast<uint32_t>(t)));
}

// WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh sets it under compute-sanitizer racecheck, which
// instruments every shared-memory access): fewer fused cases.
bool quick() {
  return std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
}

bool is_k(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}

// ---------------------------------------------------------------------------------------
// HOST EMULATION of qdecode_kernel's work on one tile of nr rows: 4 warps; warp w takes
// groups of G rows (g0 + 4 i); per pass of 32 units lane l computes unit p0 + l of every
// group row into the warp's slot arrays, then lane (j, c) steps chain c of group row j; the
// chains of row j (lanes j * kCL + k) combine in the reference's tree.
constexpr int kEmuWarps = 4;

template <GgmlType T, bool REP>
void emulate_tile(const uint8_t* tile, size_t rb, int nr, int cols,
                  const cpu::QuantizedActivation& a, float* y) {
  const int units = qd::units_of(cols);
  constexpr int kC = qd::chains<T, REP>();
  constexpr int kCL = qd::chain_lanes<T, REP>();
  constexpr int G = qd::group_rows<T, REP>();
  std::vector<int> S(qd::kWarpSlotInts);
  std::vector<float> F(qd::kWarpScaleFloats);
  for (int warp = 0; warp < kEmuWarps; ++warp) {
    for (int g0 = warp; g0 < nr; g0 += kEmuWarps * G) {
      float acc[32] = {};
      for (int p0 = 0; p0 < units; p0 += qd::kUnitsPerPass) {
        std::fill(S.begin(), S.end(), 0x7EADBEEF);  // stale slots must not be read
        for (int lane = 0; lane < 32; ++lane) {
          const int u = p0 + lane;
          if (u >= units) continue;
          uint32_t yw[8];
          qd::act_words(a.q.data(), u, yw);
          const float yd = qd::act_scale<T>(a.d.data(), u);
          for (int i = 0; i < G; ++i) {
            const int ri = g0 + kEmuWarps * i;
            if (ri < nr)
              qd::unit_slots<T, REP>(tile + static_cast<size_t>(ri) * rb, u, yw, yd, a.bsum.data(),
                                     S.data() + (i * qd::kUnitsPerPass + lane) * qd::kSlotStride,
                                     F.data() + (i * qd::kUnitsPerPass + lane) * qd::kScaleStride);
          }
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int j = lane / kCL, c = lane % kCL;
          if (j < G && c < kC && g0 + kEmuWarps * j < nr)
            acc[lane] =
                qd::chain_pass<T, REP>(c, S.data() + j * qd::kUnitsPerPass * qd::kSlotStride,
                                       F.data() + j * qd::kUnitsPerPass * qd::kScaleStride,
                                       std::min(qd::kUnitsPerPass, units - p0), acc[lane]);
        }
      }
      for (int j = 0; j < G; ++j) {
        const int r = g0 + kEmuWarps * j;
        if (r >= nr) continue;
        float v[kC];
        for (int k = 0; k < kC; ++k) v[k] = acc[j * kCL + k];
        y[r] = qd::combine<T, REP>(v);
      }
    }
  }
}

// HOST EMULATION of qdecode_long_kernel on one tile of nr rows: the 128 threads compute the
// slots of every (row, unit) item (thread t: items t, t + 128, ...) into [row][unit] arrays;
// then warp r's lanes c < chains step row r's chains over the whole row, 32 units a call.
template <GgmlType T, bool REP>
void emulate_long_tile(const uint8_t* tile, size_t rb, int nr, int cols,
                       const cpu::QuantizedActivation& a, float* y) {
  const int units = qd::units_of(cols);
  constexpr int kC = qd::chains<T, REP>();
  std::vector<int> S(static_cast<size_t>(nr * units * qd::kSlotStride), 0x7EADBEEF);
  std::vector<float> F(static_cast<size_t>(nr * units * qd::kScaleStride));
  for (int thread = 0; thread < 128; ++thread) {
    for (int it = thread; it < nr * units; it += 128) {
      const int rr = it / units, u = it - rr * units;
      uint32_t yw[8];
      qd::act_words(a.q.data(), u, yw);
      qd::unit_slots<T, REP>(tile + static_cast<size_t>(rr) * rb, u, yw,
                             qd::act_scale<T>(a.d.data(), u), a.bsum.data(),
                             S.data() + it * qd::kSlotStride, F.data() + it * qd::kScaleStride);
    }
  }
  for (int warp = 0; warp < nr; ++warp) {
    float v[kC] = {};
    for (int c = 0; c < kC; ++c)
      for (int p0 = 0; p0 < units; p0 += qd::kUnitsPerPass)
        v[c] = qd::chain_pass<T, REP>(c, S.data() + (warp * units + p0) * qd::kSlotStride,
                                      F.data() + (warp * units + p0) * qd::kScaleStride,
                                      std::min(qd::kUnitsPerPass, units - p0), v[c]);
    y[warp] = qd::combine<T, REP>(v);
  }
}

template <GgmlType T, bool REP>
void host_case(int rows, int cols, uint64_t seed) {
  const auto w = random_weights(T, rows, cols, seed);
  const auto a = random_act(T, rows, cols, seed + 1);
  ASSERT_EQ(a.repacked, REP);
  const auto ref = cpu_ref(T, w, rows, cols, a);
  const size_t rb = ggml_row_bytes(T, cols);
  std::vector<float> got(static_cast<size_t>(rows), std::nanf(""));
  for (int R : {1, 2, 16, 32}) {  // tiles of R rows, the last one partial
    for (int r0 = 0; r0 < rows; r0 += R)
      emulate_tile<T, REP>(w.data() + rb * static_cast<size_t>(r0), rb, std::min(R, rows - r0),
                           cols, a, got.data() + r0);
    EXPECT_EQ(count_mismatch(got, ref, type_str(T)), 0u)
        << type_str(T) << " rows " << rows << " cols " << cols << " tile " << R;
    std::fill(got.begin(), got.end(), std::nanf(""));
  }
  for (int R : {1, 2, 4}) {  // the long-row kernel
    for (int r0 = 0; r0 < rows; r0 += R)
      emulate_long_tile<T, REP>(w.data() + rb * static_cast<size_t>(r0), rb, std::min(R, rows - r0),
                                cols, a, got.data() + r0);
    EXPECT_EQ(count_mismatch(got, ref, type_str(T)), 0u)
        << type_str(T) << " rows " << rows << " cols " << cols << " long tile " << R;
    std::fill(got.begin(), got.end(), std::nanf(""));
  }
}

// HOST EMULATION
// REQ: M0-W-1311
TEST(ExactQDecodeHost, EmulationMatchesCpuBitwise) {
  for (int cols : {256, 896, 4864}) {
    host_case<GgmlType::Q8_0, false>(37, cols, 11);
    host_case<GgmlType::Q5_0, false>(34, cols, 12);
    host_case<GgmlType::Q4_0, false>(34, cols, 13);
    host_case<GgmlType::Q4_0, true>(32, cols, 14);
  }
  for (int cols : {256, 1024, 4864}) {
    host_case<GgmlType::Q6_K, false>(37, cols, 15);
    host_case<GgmlType::Q4_K, false>(34, cols, 16);
    host_case<GgmlType::Q4_K, true>(32, cols, 17);
  }
}

TEST(ExactQDecodeHost, TakesDecodeShapes) {
  using kern::exact::matvec1_quant_takes;
  for (auto t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0})
    for (int64_t cols : {256, 896, 4864})
      EXPECT_TRUE(matvec1_quant_takes(static_cast<uint32_t>(t), 896, cols));
  for (auto t : {GgmlType::Q4_K, GgmlType::Q6_K})
    for (int64_t cols : {256, 4864})
      EXPECT_TRUE(matvec1_quant_takes(static_cast<uint32_t>(t), 896, cols));
  EXPECT_FALSE(matvec1_quant_takes(static_cast<uint32_t>(GgmlType::Q4_K), 896, 896));
  EXPECT_FALSE(matvec1_quant_takes(static_cast<uint32_t>(GgmlType::F32), 896, 896));
  EXPECT_TRUE(matvec1_quant_takes(static_cast<uint32_t>(GgmlType::Q8_0), 151936, 896));
}

// HOST EMULATION of qdecode_swiglu_kernel: per block of R rows, the nr gate rows and the nr
// up rows as one tile of 2 nr rows (rows 0..nr-1 gate, nr..2nr-1 up) through the same tile
// loop, then g[r] = math::swiglu_one(gate dot, up dot, r, F & ~15); compared with
// cpu::dot_quantized + cpu::swiglu_row (F = 172: the libm tail from 160).
template <GgmlType T, bool REP>
void host_swiglu_case(int rows, int cols, uint64_t seed) {
  const auto wg = random_weights(T, rows, cols, seed);
  const auto wu = random_weights(T, rows, cols, seed + 1);
  const auto a = random_act(T, rows, cols, seed + 2);
  ASSERT_EQ(a.repacked, REP);
  auto ref = cpu_ref(T, wg, rows, cols, a);
  const auto ru = cpu_ref(T, wu, rows, cols, a);
  cpu::swiglu_row(ref.data(), ru.data(), rows);
  const size_t rb = ggml_row_bytes(T, cols);
  for (int R : {1, 8, 32}) {
    std::vector<float> got(static_cast<size_t>(rows), std::nanf(""));
    for (int r0 = 0; r0 < rows; r0 += R) {
      const int nr = std::min(R, rows - r0);
      std::vector<uint8_t> tile(2 * static_cast<size_t>(nr) * rb + 16);
      std::memcpy(tile.data(), wg.data() + rb * static_cast<size_t>(r0), nr * rb);
      std::memcpy(tile.data() + nr * rb, wu.data() + rb * static_cast<size_t>(r0), nr * rb);
      std::vector<float> dots(2 * static_cast<size_t>(nr));
      emulate_tile<T, REP>(tile.data(), rb, 2 * nr, cols, a, dots.data());
      for (int i = 0; i < nr; ++i)
        got[static_cast<size_t>(r0 + i)] = kern::exact::math::swiglu_one(
            dots[static_cast<size_t>(i)], dots[static_cast<size_t>(nr + i)], r0 + i, rows & ~15);
    }
    EXPECT_EQ(count_mismatch(got, ref, type_str(T) + " swiglu"), 0u)
        << type_str(T) << " rows " << rows << " cols " << cols << " tile " << R;
  }
}

// HOST EMULATION
// REQ: M0-W-1311
TEST(ExactQDecodeHost, SwigluEmulationMatchesCpuBitwise) {
  host_swiglu_case<GgmlType::Q5_0, false>(172, 256, 31);
  host_swiglu_case<GgmlType::Q8_0, false>(172, 896, 32);
  host_swiglu_case<GgmlType::Q4_0, false>(172, 256, 33);
  host_swiglu_case<GgmlType::Q4_0, true>(160, 256, 34);
  host_swiglu_case<GgmlType::Q4_K, true>(96, 256, 35);
  host_swiglu_case<GgmlType::Q6_K, false>(37, 256, 36);
}

// Host-only: the fused decode launches accept the 0.5B model's shapes and refuse mixtures
// that cannot share one activation quantization.
// REQ: M0-W-1311
TEST(ExactQDecodeHost, FusedTakesDecodeShapes) {
  auto wv = [](GgmlType t, int64_t rows, int64_t cols) {
    kern::WeightView w;
    w.type = static_cast<uint32_t>(t);
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = ggml_row_bytes(t, cols);
    return w;
  };
  const auto q = wv(GgmlType::Q5_0, 896, 896), k = wv(GgmlType::Q5_0, 128, 896),
             v8 = wv(GgmlType::Q8_0, 128, 896), v4k = wv(GgmlType::Q4_K, 128, 1024),
             q4k = wv(GgmlType::Q4_K, 896, 1024), v6k = wv(GgmlType::Q6_K, 128, 1024),
             k1024 = wv(GgmlType::Q5_0, 128, 1024);
  const kern::WeightView* same[3] = {&q, &k, &k};
  const kern::WeightView* mixed[3] = {&q, &k, &v8};
  const kern::WeightView* kmix[3] = {&q4k, &v4k, &v6k};
  const kern::WeightView* fam[2] = {&k1024, &v4k};
  const kern::WeightView* cols[2] = {&q, &k1024};
  EXPECT_TRUE(kern::exact::matvec1_quant_multi_takes(same, 3));
  EXPECT_TRUE(kern::exact::matvec1_quant_multi_takes(mixed, 3));
  EXPECT_TRUE(kern::exact::matvec1_quant_multi_takes(kmix, 3));
  EXPECT_FALSE(kern::exact::matvec1_quant_multi_takes(fam, 2));   // Q8_0 vs Q8_K activation
  EXPECT_FALSE(kern::exact::matvec1_quant_multi_takes(cols, 2));  // row lengths differ
  EXPECT_FALSE(kern::exact::matvec1_quant_multi_takes(same, 0));
  for (auto t : {GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_0}) {
    EXPECT_TRUE(kern::exact::matvec1_quant_swiglu_takes(wv(t, 4864, 896), wv(t, 4864, 896)));
    EXPECT_TRUE(kern::exact::matvec1_quant_swiglu_takes(wv(t, 172, 256), wv(t, 172, 256)));
  }
  EXPECT_FALSE(kern::exact::matvec1_quant_swiglu_takes(wv(GgmlType::Q5_0, 4864, 896),
                                                       wv(GgmlType::Q8_0, 4864, 896)));
  EXPECT_FALSE(kern::exact::matvec1_quant_swiglu_takes(wv(GgmlType::F16, 4864, 896),
                                                       wv(GgmlType::F16, 4864, 896)));
}

// ---------------------------------------------------------------------------------------
// GPU

struct DevAct {
  DevArray<uint8_t> buf;
  ActBuf a;
  DevAct(const cpu::QuantizedActivation& h, int cols)
      : buf(kern::exact::act_buffer_bytes(1, cols)) {
    a = kern::exact::act_buffer_at(buf.get(), 1, cols);
    cudaMemcpy(a.q, h.q.data(), h.q.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(a.d, h.d.data(), h.d.size() * sizeof(float), cudaMemcpyHostToDevice);
    if (!h.bsum.empty())
      cudaMemcpy(a.bsum, h.bsum.data(), h.bsum.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  }
};

kern::WeightView view(GgmlType t, const DevArray<uint8_t>& d, int64_t rows, int cols) {
  kern::WeightView w;
  w.data = d.get();
  w.type = static_cast<uint32_t>(t);
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = ggml_row_bytes(t, cols);
  return w;
}

// Runs matvec1_quant (accumulate off, then on over a known y) and compares with the CPU.
void gpu_case(GgmlType t, int64_t rows, int cols, uint64_t seed) {
  SCOPED_TRACE(type_str(t) + " rows " + std::to_string(rows) + " cols " + std::to_string(cols));
  ASSERT_TRUE(kern::exact::matvec1_quant_takes(static_cast<uint32_t>(t), rows, cols));
  const auto w = random_weights(t, rows, cols, seed);
  const auto a = random_act(t, rows, cols, seed + 7);
  const auto ref = cpu_ref(t, w, rows, cols, a);
  DevArray<uint8_t> dw(w);
  DevAct da(a, cols);
  DevArray<float> dy(static_cast<size_t>(rows));  // NaN-poisoned
  kern::exact::matvec1_quant(view(t, dw, rows, cols), da.a, dy.get(), false, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(count_mismatch(dy.download(), ref, "plain"), 0u);
  // accumulate: y = y0 + dot, one rounding
  std::vector<float> y0(static_cast<size_t>(rows)), ref_acc(static_cast<size_t>(rows));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t i = 0; i < y0.size(); ++i) {
    y0[i] = nd(rng);
    ref_acc[i] = y0[i] + ref[i];
  }
  dy.upload(y0);
  kern::exact::matvec1_quant(view(t, dw, rows, cols), da.a, dy.get(), true, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(count_mismatch(dy.download(), ref_acc, "accumulate"), 0u);
  // Weights at a 2-byte (not 16-byte) aligned address, as a view into a packed buffer.
  DevArray<uint8_t> dw2(w.size() + 16);
  CK(cudaMemcpy(dw2.get() + 6, w.data(), w.size(), cudaMemcpyHostToDevice));
  kern::WeightView wv2 = view(t, dw, rows, cols);
  wv2.data = dw2.get() + 6;
  dy.poison();
  kern::exact::matvec1_quant(wv2, da.a, dy.get(), false, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(count_mismatch(dy.download(), ref, "unaligned"), 0u);
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, Q0TypesBitwise) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (auto t : {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0})
    for (int64_t rows : {896, 128, 4864, 130})
      for (int cols : {896, 4864, 256}) gpu_case(t, rows, cols, ++seed);
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, KQuantsBitwise) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (auto t : {GgmlType::Q6_K, GgmlType::Q4_K})
    for (int64_t rows : {896, 128, 4864, 130})
      for (int cols : {4864, 256, 1024}) gpu_case(t, rows, cols, ++seed);
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, LmHeadQ8_0Bitwise) {
  REQUIRE_GPU();
  gpu_case(GgmlType::Q8_0, 151936, 896, 300);
}

// matvec1_quant and exact::matmul with n_tok 1 give the same bits at the 0.5B model's decode
// shapes (timings: bench/kernel_bench).
// REQ: M0-W-1311
TEST(ExactQDecodeGpu, MatchesMatmulAtModelShapes) {
  REQUIRE_GPU();
  struct Shape {
    GgmlType t;
    int64_t rows;
    int cols;
    const char* what;
  };
  const Shape shapes[] = {
      {GgmlType::Q5_0, 4864, 896, "ffn gate/up"},   {GgmlType::Q5_0, 896, 896, "attn q/o"},
      {GgmlType::Q5_0, 128, 896, "attn k/v"},       {GgmlType::Q6_K, 896, 4864, "ffn down Q6_K"},
      {GgmlType::Q4_K, 896, 4864, "ffn down Q4_K"}, {GgmlType::Q4_0, 4864, 896, "Q4_0 4864x896"},
      {GgmlType::Q8_0, 4864, 896, "Q8_0 4864x896"}, {GgmlType::Q8_0, 151936, 896, "LM head Q8_0"},
  };
  for (const auto& sh : shapes) {
    const auto w = random_weights(sh.t, sh.rows, sh.cols, 400);
    const auto a = random_act(sh.t, sh.rows, sh.cols, 401);
    DevArray<uint8_t> dw(w);
    DevAct da(a, sh.cols);
    DevArray<float> y1(static_cast<size_t>(sh.rows)), y2(static_cast<size_t>(sh.rows));
    const auto wv = view(sh.t, dw, sh.rows, sh.cols);
    kern::exact::matvec1_quant(wv, da.a, y1.get(), false, nullptr);
    kern::exact::matmul(wv, da.a, 1, kern::exact::BatchOrder{}, y2.get(), false, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(count_mismatch(y1.download(), y2.download(), std::string("vs matmul ") + sh.what),
              0u);
  }
}

// ---------------------------------------------------------------------------------------
// Fused decode launches.

struct QWeight {
  GgmlType t;
  int64_t rows;
};

// matvec1_quant_multi over 1..3 weights of one row length: each output bit for bit
// matvec1_quant's and the CPU reference's, accumulate off and on.
void multi_case(const std::vector<QWeight>& qs, int cols, uint64_t seed) {
  std::string what;
  for (const auto& q : qs) what += type_str(q.t) + " " + std::to_string(q.rows) + "x, ";
  SCOPED_TRACE(what + "cols " + std::to_string(cols));
  const int n = static_cast<int>(qs.size());
  // one activation (the first weight's vec_dot_type); the reference's repack flag per weight
  const auto a = random_act(qs[0].t, qs[0].rows, cols, seed + 7);
  DevAct da(a, cols);
  std::vector<std::vector<uint8_t>> w(qs.size());
  std::vector<std::vector<float>> ref(qs.size()), y0(qs.size());
  std::deque<DevArray<uint8_t>> dw;
  std::deque<DevArray<float>> dy, dsep;
  std::vector<kern::WeightView> wv(qs.size());
  for (size_t i = 0; i < qs.size(); ++i) {
    w[i] = random_weights(qs[i].t, qs[i].rows, cols, seed + 13 * i);
    auto ai = a;
    ai.repacked = repacked(qs[i].t, qs[i].rows);
    ref[i] = cpu_ref(qs[i].t, w[i], qs[i].rows, cols, ai);
    dw.emplace_back(w[i]);
    dy.emplace_back(static_cast<size_t>(qs[i].rows));
    dsep.emplace_back(static_cast<size_t>(qs[i].rows));
  }
  const kern::WeightView* ws[3] = {};
  float* ys[3] = {};
  for (size_t i = 0; i < qs.size(); ++i) {
    wv[i] = view(qs[i].t, dw[i], qs[i].rows, cols);
    ws[i] = &wv[i];
    ys[i] = dy[i].get();
  }
  ASSERT_TRUE(kern::exact::matvec1_quant_multi_takes(ws, n));
  kern::exact::matvec1_quant_multi(ws, ys, n, da.a, false, nullptr);
  for (size_t i = 0; i < qs.size(); ++i)
    kern::exact::matvec1_quant(wv[i], da.a, dsep[i].get(), false, nullptr);
  CK(cudaDeviceSynchronize());
  for (size_t i = 0; i < qs.size(); ++i) {
    const auto got = dy[i].download();
    EXPECT_EQ(count_mismatch(got, ref[i], "multi vs cpu, weight " + std::to_string(i)), 0u);
    EXPECT_EQ(count_mismatch(got, dsep[i].download(),
                             "multi vs matvec1_quant, weight " + std::to_string(i)),
              0u);
  }
  // accumulate: y = y0 + dot, one rounding
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t i = 0; i < qs.size(); ++i) {
    y0[i].resize(ref[i].size());
    for (auto& v : y0[i]) v = nd(rng);
    dy[i].upload(y0[i]);
  }
  kern::exact::matvec1_quant_multi(ws, ys, n, da.a, true, nullptr);
  CK(cudaDeviceSynchronize());
  for (size_t i = 0; i < qs.size(); ++i) {
    std::vector<float> ra(ref[i].size());
    for (size_t r = 0; r < ra.size(); ++r) ra[r] = y0[i][r] + ref[i][r];
    EXPECT_EQ(count_mismatch(dy[i].download(), ra, "multi accumulate, weight " + std::to_string(i)),
              0u);
  }
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, MultiQkvBitwise) {
  REQUIRE_GPU();
  // the 0.5B model's Q, K, V (Q5_0; Q8_0 and Q4_0 below)
  multi_case({{GgmlType::Q5_0, 896}, {GgmlType::Q5_0, 128}, {GgmlType::Q5_0, 128}}, 896, 500);
  // mixed types sharing the Q8_0 activation (a V of another type), odd row counts
  multi_case({{GgmlType::Q5_0, 896}, {GgmlType::Q5_0, 128}, {GgmlType::Q8_0, 128}}, 896, 510);
  if (quick()) return;
  for (auto t : {GgmlType::Q8_0, GgmlType::Q4_0})
    multi_case({{t, 896}, {t, 128}, {t, 128}}, 896, 505 + static_cast<uint64_t>(t));
  multi_case({{GgmlType::Q4_0, 896}, {GgmlType::Q8_0, 130}, {GgmlType::Q4_0, 172}}, 896, 520);
  multi_case({{GgmlType::Q8_0, 2048}, {GgmlType::Q5_0, 256}, {GgmlType::Q4_0, 130}}, 2048, 530);
  // Q8_K activation types (repacked and lane-order Q4_K, Q6_K)
  multi_case({{GgmlType::Q4_K, 896}, {GgmlType::Q4_K, 130}, {GgmlType::Q6_K, 128}}, 1024, 540);
  multi_case({{GgmlType::Q6_K, 896}, {GgmlType::Q6_K, 128}}, 256, 550);
  // long rows (more than one pass of 32 units), one and two weights
  multi_case({{GgmlType::Q5_0, 896}}, 4864, 560);
  multi_case({{GgmlType::Q6_K, 130}, {GgmlType::Q4_K, 896}}, 4864, 570);
}

// matvec1_quant_swiglu against matvec1_quant(gate), matvec1_quant(up), swiglu() on the GPU
// and against cpu::dot_quantized + cpu::swiglu_row.
void swiglu_case(GgmlType t, int64_t rows, int cols, uint64_t seed) {
  SCOPED_TRACE(type_str(t) + " rows " + std::to_string(rows) + " cols " + std::to_string(cols));
  const auto wg = random_weights(t, rows, cols, seed);
  const auto wu = random_weights(t, rows, cols, seed + 1);
  const auto a = random_act(t, rows, cols, seed + 7);
  auto ref = cpu_ref(t, wg, rows, cols, a);
  const auto ru = cpu_ref(t, wu, rows, cols, a);
  cpu::swiglu_row(ref.data(), ru.data(), rows);
  DevArray<uint8_t> dwg(wg), dwu(wu);
  DevAct da(a, cols);
  const auto vg = view(t, dwg, rows, cols), vu = view(t, dwu, rows, cols);
  ASSERT_TRUE(kern::exact::matvec1_quant_swiglu_takes(vg, vu));
  DevArray<float> dg(static_cast<size_t>(rows)), sg(static_cast<size_t>(rows)),
      su(static_cast<size_t>(rows));
  kern::exact::matvec1_quant_swiglu(vg, vu, da.a, dg.get(), nullptr);
  kern::exact::matvec1_quant(vg, da.a, sg.get(), false, nullptr);
  kern::exact::matvec1_quant(vu, da.a, su.get(), false, nullptr);
  kern::exact::swiglu(sg.get(), su.get(), 1, static_cast<int>(rows), nullptr);
  CK(cudaDeviceSynchronize());
  const auto got = dg.download();
  EXPECT_EQ(count_mismatch(got, ref, "swiglu vs cpu"), 0u);
  EXPECT_EQ(count_mismatch(got, sg.download(), "swiglu vs separate launches"), 0u);
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, SwigluBitwise) {
  REQUIRE_GPU();
  uint64_t seed = 600;
  for (auto t : {GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_0}) {
    swiglu_case(t, 4864, 896, ++seed);
    swiglu_case(t, 172, 256, ++seed);  // libm tail: F & ~15 = 160
    if (quick()) continue;
    swiglu_case(t, 130, 896, ++seed);
  }
  if (quick()) return;
  swiglu_case(GgmlType::Q4_K, 4864, 1024, ++seed);
  swiglu_case(GgmlType::Q4_K, 172, 256, ++seed);
  swiglu_case(GgmlType::Q6_K, 172, 256, ++seed);
  swiglu_case(GgmlType::Q5_0, 896, 4864, ++seed);  // long rows
}

}  // namespace
}  // namespace worker
