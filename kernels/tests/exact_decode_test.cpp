// matvec1_float (kernels/matvec1_float.cu) against the CPU reference bit for bit: every output
// of one-token products of F32 / F16 / BF16 weights equals cpu::dot_vecdot /
// cpu::dot_bf16_vecdot on the activation cpu::quantize_activation rounds, at the decode
// shapes of the 0.5B model, few-row and odd-length matrices (the sequential leftovers), with
// and without the residual accumulate; and the same bits as exact::matmul's one-token path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "decode_step.cuh"
#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "gguf/ggml_types.h"
#include "gpu_test_util.h"

namespace worker {
namespace {

using gputest::DevArray;
namespace ex = kern::exact;

struct HostWeights {
  std::vector<uint8_t> bytes;
  size_t row_bytes = 0;
};

HostWeights random_weights(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  HostWeights h;
  const size_t es = t == GgmlType::F32 ? 4 : 2;
  h.row_bytes = static_cast<size_t>(cols) * es;
  h.bytes.resize(h.row_bytes * static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = nd(rng);
    if (t == GgmlType::F32) {
      std::memcpy(h.bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t b = t == GgmlType::F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
      std::memcpy(h.bytes.data() + 2 * i, &b, 2);
    }
  }
  return h;
}

// The CPU reference's dot of row r with the rounded activation, as CpuEngine::matmul calls it.
float reference_dot(GgmlType t, const HostWeights& w, int64_t r, int64_t cols,
                    const cpu::QuantizedActivation& a) {
  std::vector<float> row(static_cast<size_t>(cols));
  dequantize_row(t, w.bytes.data() + static_cast<size_t>(r) * w.row_bytes, row.data(), cols);
  if (t == GgmlType::BF16) return cpu::dot_bf16_vecdot(row.data(), a.f.data(), cols);
  return cpu::dot_vecdot(row.data(), a.f.data(), cols, t == GgmlType::F16);
}

struct Case {
  GgmlType type;
  int64_t rows, cols;
};

// REQ: M0-W-1201 M0-W-1214 WRK-D2 WRK-D15
TEST(ExactDecodeGpu, Matvec1FloatMatchesCpuBitForBit) {
  REQUIRE_GPU();
  std::mt19937 rng(2024);
  std::vector<Case> cases;
  // WORKER_KERNEL_TEST_QUICK (the compute-sanitizer runs): the small shapes only
  const bool quick = std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{{896, 896},
                                                                {128, 896},
                                                                {4864, 896},
                                                                {896, 4864},
                                                                {130, 172},
                                                                {7, 64},
                                                                {33, 8},
                                                                {2048, 256},
                                                                {5, 2052}}) {
      if (!quick || r * c <= 896 * 896) cases.push_back({t, r, c});
    }
  }
  int checked = 0;
  for (const Case& k : cases) {
    for (bool acc : {false, true}) {
      SCOPED_TRACE(std::string(ggml_type_name(static_cast<uint32_t>(k.type))) + " " +
                   std::to_string(k.rows) + "x" + std::to_string(k.cols) +
                   (acc ? " accumulate" : ""));
      ASSERT_TRUE(ex::matvec1_float_takes(static_cast<uint32_t>(k.type), k.cols));
      const HostWeights w = random_weights(k.type, k.rows, k.cols, rng);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(k.cols));
      for (auto& v : x) v = nd(rng);
      cpu::QuantizedActivation qa;
      cpu::quantize_activation(k.type, x.data(), k.cols, qa);
      std::vector<float> y0(static_cast<size_t>(k.rows));
      for (auto& v : y0) v = nd(rng);

      DevArray<uint8_t> dw(w.bytes);
      DevArray<float> dx(qa.f);
      DevArray<float> dy(static_cast<size_t>(k.rows));  // NaN-poisoned
      if (acc) dy.upload(y0);
      ex::ActBuf a;
      a.f = dx.get();
      kern::WeightView wv;
      wv.data = dw.get();
      wv.type = static_cast<uint32_t>(k.type);
      wv.rows = k.rows;
      wv.cols = k.cols;
      wv.row_bytes = w.row_bytes;
      ex::matvec1_float(wv, a, dy.get(), acc, nullptr);
      CK(cudaDeviceSynchronize());
      const auto got = dy.download();
      size_t bad = 0;
      for (int64_t r = 0; r < k.rows; ++r) {
        float want = reference_dot(k.type, w, r, k.cols, qa);
        if (acc) want = y0[static_cast<size_t>(r)] + want;
        const float g = got[static_cast<size_t>(r)];
        if (std::memcmp(&g, &want, 4) != 0) {
          if (bad < 5) {
            ADD_FAILURE() << "row " << r << ": gpu " << g << " cpu " << want;
          }
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0u);
      ++checked;
    }
  }
  std::printf("matvec1_float: %d cases, every output compared\n", checked);
}

kern::WeightView view_of(const DevArray<uint8_t>& d, GgmlType t, int64_t rows, int64_t cols,
                         size_t row_bytes) {
  kern::WeightView wv;
  wv.data = d.get();
  wv.type = static_cast<uint32_t>(t);
  wv.rows = rows;
  wv.cols = cols;
  wv.row_bytes = row_bytes;
  return wv;
}

// Q, K and V in one launch: each segment's rows are the single-weight products, bit for bit.
// REQ: M0-W-1214 WRK-D15
TEST(ExactDecodeGpu, Matvec1MultiMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  for (GgmlType t : {GgmlType::F16, GgmlType::F32, GgmlType::BF16}) {
    const int64_t cols = 896, rows[3] = {896, 128, 130};
    std::vector<HostWeights> hw;
    std::vector<std::unique_ptr<DevArray<uint8_t>>> dw;
    std::vector<std::unique_ptr<DevArray<float>>> dy;
    for (int i = 0; i < 3; ++i) {
      hw.push_back(random_weights(t, rows[i], cols, rng));
      dw.push_back(std::make_unique<DevArray<uint8_t>>(hw.back().bytes));
      dy.push_back(std::make_unique<DevArray<float>>(static_cast<size_t>(rows[i])));
    }
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(cols));
    for (auto& v : x) v = nd(rng);
    cpu::QuantizedActivation qa;
    cpu::quantize_activation(t, x.data(), cols, qa);
    DevArray<float> dx(qa.f);
    ex::ActBuf a;
    a.f = dx.get();
    kern::WeightView wv[3];
    const kern::WeightView* ws[3];
    float* ys[3];
    for (int i = 0; i < 3; ++i) {
      wv[i] = view_of(*dw[static_cast<size_t>(i)], t, rows[i], cols,
                      hw[static_cast<size_t>(i)].row_bytes);
      ws[i] = &wv[i];
      ys[i] = dy[static_cast<size_t>(i)]->get();
    }
    ex::matvec1_float_multi(ws, ys, 3, a, false, nullptr);
    CK(cudaDeviceSynchronize());
    size_t bad = 0;
    for (int i = 0; i < 3; ++i) {
      const auto got = dy[static_cast<size_t>(i)]->download();
      for (int64_t r = 0; r < rows[i]; ++r) {
        const float want = reference_dot(t, hw[static_cast<size_t>(i)], r, cols, qa);
        if (std::memcmp(&got[static_cast<size_t>(r)], &want, 4) != 0) ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << ggml_type_name(static_cast<uint32_t>(t));
  }
}

// SwiGLU of the gate and up products in one launch: cpu::swiglu_row of the CPU products (the
// libm-expf tail included: F = 172), and its rounding for an F32/F16/BF16 down weight as
// cpu::quantize_activation rounds it.
// REQ: M0-W-1214 WRK-D15
TEST(ExactDecodeGpu, Matvec1SwigluMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(12);
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    const bool quick = std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;  // sanitizer runs
    for (auto [F, cols] : std::vector<std::pair<int64_t, int64_t>>{{4864, 896}, {172, 64}}) {
      if (quick && F > 1024) continue;
      for (GgmlType down : {GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::Q8_0}) {
        const HostWeights hg = random_weights(t, F, cols, rng),
                          hu = random_weights(t, F, cols, rng);
        DevArray<uint8_t> dg(hg.bytes), du(hu.bytes);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(cols));
        for (auto& v : x) v = nd(rng) * 8.0f;  // products around +-3: both silu branches
        cpu::QuantizedActivation qa;
        cpu::quantize_activation(t, x.data(), cols, qa);
        DevArray<float> dx(qa.f), dgo(static_cast<size_t>(F)), dact(static_cast<size_t>(F));
        ex::ActBuf a, out;
        a.f = dx.get();
        out.f = dact.get();
        const auto wg = view_of(dg, t, F, cols, hg.row_bytes),
                   wu = view_of(du, t, F, cols, hu.row_bytes);
        ASSERT_TRUE(ex::matvec1_swiglu_takes(wg, wu));
        ex::matvec1_swiglu(wg, wu, a, dgo.get(), static_cast<uint32_t>(down), out, nullptr);
        CK(cudaDeviceSynchronize());
        std::vector<float> g(static_cast<size_t>(F)), u(static_cast<size_t>(F));
        for (int64_t r = 0; r < F; ++r) {
          g[static_cast<size_t>(r)] = reference_dot(t, hg, r, cols, qa);
          u[static_cast<size_t>(r)] = reference_dot(t, hu, r, cols, qa);
        }
        cpu::swiglu_row(g.data(), u.data(), F);
        const auto got = dgo.download();
        EXPECT_EQ(0, std::memcmp(got.data(), g.data(), g.size() * sizeof(float)))
            << ggml_type_name(static_cast<uint32_t>(t)) << " F=" << F;
        if (down != GgmlType::Q8_0) {
          cpu::QuantizedActivation qd;
          cpu::quantize_activation(down, g.data(), F, qd);
          const auto ga = dact.download();
          EXPECT_EQ(0, std::memcmp(ga.data(), qd.f.data(), qd.f.size() * sizeof(float)))
              << "act for " << ggml_type_name(static_cast<uint32_t>(down));
        }
      }
    }
  }
}

// matvec1_float and exact::matmul's one-token path give the same bits at the 0.5B model's
// decode shapes (timings: bench/kernel_bench).
// REQ: M0-W-1214
TEST(ExactDecodeGpu, MatchesMatmulAtModelShapes) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {896, 896}, {128, 896}, {4864, 896}, {896, 4864}, {151936, 896}}) {
      if (t != GgmlType::F16 && rows == 151936) continue;
      const HostWeights w = random_weights(t, rows, cols, rng);
      std::vector<float> x(static_cast<size_t>(cols));
      for (auto& v : x) v = ud(rng);
      cpu::QuantizedActivation qa;  // x as the kernels take it: rounded for the weight type
      cpu::quantize_activation(t, x.data(), static_cast<int>(cols), qa);
      DevArray<uint8_t> dw(w.bytes);
      DevArray<float> dx(qa.f);
      DevArray<float> y1(static_cast<size_t>(rows)), y2(static_cast<size_t>(rows));
      ex::ActBuf a;
      a.f = dx.get();
      kern::WeightView wv{dw.get(), static_cast<uint32_t>(t), rows, cols, w.row_bytes};
      ex::matvec1_float(wv, a, y1.get(), false, nullptr);
      ex::matmul(wv, a, 1, ex::BatchOrder{1, 0}, y2.get(), false, nullptr);
      CK(cudaDeviceSynchronize());
      const auto o1 = y1.download(), o2 = y2.download();
      EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)))
          << "matvec1_float and matmul differ: " << ggml_type_name(static_cast<uint32_t>(t)) << " "
          << rows << "x" << cols;
    }
  }
}

// HOST: how the persistent decode step copies a block's rows (ex::step::span_of,
// ex::step::slot_bytes): for the row sizes of the step's types (Q8_0 / Q5_0 / Q4_K / Q6_K / float
// rows of the test and 0.5B shapes) and every split of a matrix over 1 .. 140 blocks, each block's
// copy starts and ends on 16-byte units, holds its rows (row r0 at `off`), ends no later than the
// unit that holds the matrix's last byte (inside the weights' 256-byte aligned allocation), fits
// its slot with 4 bytes to spare past the last row where rows are not multiples of 16 (qd::rd32
// reads the next word), and is exactly the rows where they are (float tiles stay contiguous).
// REQ: M0-W-1214 WRK-D15
TEST(DecodeStepHost, SpansHoldTheRowsInsideTheirSlots) {
  const size_t row_bytes[] = {952, 616, 68, 44, 5168, 3344, 2736, 3990, 576, 840, 1792, 256, 3584};
  const int matrix_rows[] = {1, 7, 128, 896, 1152, 2051, 4864, 151936};
  for (const size_t rb : row_bytes) {
    for (const int R : matrix_rows) {
      for (int G = 1; G <= 140; ++G) {
        for (int c = 0; c < G; ++c) {
          const int r0 = static_cast<int>(static_cast<long long>(R) * c / G);
          const int r1 = static_cast<int>(static_cast<long long>(R) * (c + 1) / G);
          const ex::step::Span sp = ex::step::span_of(rb, r0, r1);
          SCOPED_TRACE("rb " + std::to_string(rb) + " rows " + std::to_string(R) + " block " +
                       std::to_string(c) + " of " + std::to_string(G));
          if (r1 == r0) {
            ASSERT_EQ(sp.bytes, 0u);
            ASSERT_EQ(ex::step::slot_bytes(0, rb), 0u);
            continue;
          }
          const size_t a = static_cast<size_t>(r0) * rb, b = static_cast<size_t>(r1) * rb;
          ASSERT_EQ(sp.lo % 16, 0u);
          ASSERT_EQ(sp.bytes % 16, 0u);
          ASSERT_EQ(sp.lo + sp.off, a);
          ASSERT_LT(sp.off, 16u);
          ASSERT_GE(sp.lo + sp.bytes, b);
          ASSERT_LE(sp.lo + sp.bytes, ex::step::align16(static_cast<size_t>(R) * rb));
          const size_t slot = ex::step::slot_bytes(r1 - r0, rb);
          ASSERT_EQ(slot % 16, 0u);
          ASSERT_LE(sp.bytes, slot);
          if (rb % 16 == 0) {
            ASSERT_EQ(sp.off, 0u);
            ASSERT_EQ(sp.bytes, b - a);
            ASSERT_EQ(slot, b - a);
          } else {
            ASSERT_GE(slot, sp.off + (b - a) + 4);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace worker
