// matvec1_float (kernels/matvec1_float.cu) against the CPU reference bit for bit: every output
// of one-token products of F32 / F16 / BF16 weights equals cpu::dot_vecdot /
// cpu::dot_bf16_vecdot on the activation cpu::quantize_activation rounds, at the decode
// shapes of the 0.5B model, few-row and odd-length matrices (the sequential leftovers), with
// and without the residual accumulate; and the same bits as exact::matmul's one-token path.
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

// The persistent step's shared-memory layout (step::smem_layout, what DecodeStep::plan launches
// with): for the 0.5B shape in every weight type the step takes, other shapes and SM counts,
// with and without the attention's K / V stage, the regions that are live together never
// overlap, each holds what its op puts there, and a layout said to fit fits.
// REQ: M0-W-1214 WRK-D15
TEST(DecodeStepHost, SharedMemoryRegionsLiveTogetherDoNotOverlap) {
  struct Types {
    const char* name;
    size_t qkv, o, gu, down, out;  // bytes a row for a model of n_embd E, n_ff F
    bool quant, kdown;
  };
  const auto q0 = [](int64_t cols, size_t block) { return static_cast<size_t>(cols / 32) * block; };
  const auto kq = [](int64_t cols, size_t block) {
    return static_cast<size_t>(cols / 256) * block;
  };
  struct Shape {
    int64_t E, QD, KD, F;
  };
  const Shape shapes[] = {
      {896, 896, 128, 4864}, {512, 512, 128, 1536}, {2048, 2048, 512, 8192}, {64, 64, 32, 192}};
  const int blocks[] = {132, 114, 78, 170, 16};
  const size_t optins[] = {232448, 101376};
  const size_t dec_smems[] = {40528, 8192};
  const size_t stages[] = {0, 122880};
  int fitted = 0, checked = 0;
  for (const Shape& sh : shapes) {
    const Types types[] = {
        {"f16", 2 * size_t(sh.E), 2 * size_t(sh.QD), 2 * size_t(sh.E), 2 * size_t(sh.F),
         2 * size_t(sh.E), false, false},
        {"f32", 4 * size_t(sh.E), 4 * size_t(sh.QD), 4 * size_t(sh.E), 4 * size_t(sh.F),
         4 * size_t(sh.E), false, false},
        {"q8_0", q0(sh.E, 34), q0(sh.QD, 34), q0(sh.E, 34), q0(sh.F, 34), q0(sh.E, 34), true,
         false},
        {"q5_0", q0(sh.E, 22), q0(sh.QD, 22), q0(sh.E, 22), q0(sh.F, 22), q0(sh.E, 34), true,
         false},
        {"mix q6_k down", q0(sh.E, 34), q0(sh.QD, 22), q0(sh.E, 22), kq(sh.F, 210), q0(sh.E, 34),
         true, true},
        {"mix q4_k down", q0(sh.E, 22), q0(sh.QD, 22), q0(sh.E, 22), kq(sh.F, 144), q0(sh.E, 34),
         true, true},
    };
    for (const Types& ty : types) {
      if (ty.kdown && sh.F % 256 != 0) continue;
      for (const int G : blocks) {
        for (const size_t optin : optins) {
          for (const size_t dec : dec_smems) {
            for (const size_t kst : stages) {
              ex::step::SmemIn in;
              in.blocks = G;
              in.E = sh.E;
              in.QD = sh.QD;
              in.KD = sh.KD;
              in.F = sh.F;
              in.rb_q = in.rb_k = in.rb_v = ty.qkv;
              in.rb_o = ty.o;
              in.rb_gate = in.rb_up = ty.gu;
              in.rb_down = ty.down;
              in.rb_out = ty.out;
              in.quant = ty.quant;
              in.kdown = ty.kdown;
              in.long_unit_b = 44;
              in.n_layer = 24;
              in.shape_b = 56;
              in.dec_smem_b = dec;
              in.kv_stage_b = kst;
              in.static_b = 384;
              in.optin = optin;
              const ex::step::SmemLayout l = ex::step::smem_layout(in);
              SCOPED_TRACE(std::string(ty.name) + " E " + std::to_string(sh.E) + " G " +
                           std::to_string(G) + " optin " + std::to_string(optin) + " DecSmem " +
                           std::to_string(dec) + " stage " + std::to_string(kst));
              ++checked;
              if (!l.fits) {
                // not fitting means it does not: fewer than 2 LM-head stages, or too big
                ASSERT_TRUE(l.lm_stages < 2 || l.smem + in.static_b > optin);
                continue;
              }
              ++fitted;
              const auto share = [G](int64_t rows) { return static_cast<int>((rows + G - 1) / G); };
              const auto disjoint = [](size_t a0, size_t a1, size_t b0, size_t b1) {
                return a1 <= b0 || b1 <= a0 || a0 == a1 || b0 == b1;
              };
              // every region starts and ends on 16 bytes (bulk copies, float4 and cp.async)
              for (const size_t v : {l.wo_b, l.qkv_b, l.down_b, l.p_b, l.gu_b, l.kst_at, l.pg,
                                     l.xf_b, l.aq_b, l.ad_b, l.abs_b, l.rx_b, l.slot}) {
                ASSERT_EQ(v % 16, 0u) << v;
              }
              // each holds its op's rows: every block's share, with the slots' pads
              ASSERT_GE(l.wo_b, ex::step::slot_bytes(share(sh.E), ty.o));
              ASSERT_GE(l.qkv_b, ex::step::slot_bytes(share(sh.QD + 2 * sh.KD), ty.qkv) +
                                     (ty.quant ? 3 * 48 : 0));
              ASSERT_GE(l.down_b, ex::step::slot_bytes(share(sh.E), ty.down));
              ASSERT_GE(l.gu_b, 2 * ex::step::slot_bytes(share(sh.F), ty.gu));
              ASSERT_GE(l.xf_b, 4 * static_cast<size_t>(std::max({sh.E, sh.QD, sh.F})));
              ASSERT_EQ(l.kst_b, kst);
              // Q/K/V: Wo's tile and Q/K/V's; the attention: Wo's tile, its arrays, its stage
              ASSERT_TRUE(disjoint(l.wo_b, l.wo_b + l.qkv_b, l.kst_at, l.kst_at + kst));
              ASSERT_TRUE(disjoint(l.wo_b, l.wo_b + dec, l.kst_at, l.kst_at + kst));
              ASSERT_TRUE(disjoint(0, l.wo_b, l.kst_at, l.kst_at + kst));
              ASSERT_LE(l.kst_at + kst, l.pg);
              // gate + up are copied after the attention while Wo's tile is live, and down's
              // tile after Wo while gate + up's are
              ASSERT_TRUE(disjoint(0, l.wo_b, l.p_b, l.p_b + l.gu_b));
              ASSERT_TRUE(disjoint(l.wo_b, l.wo_b + std::max(l.qkv_b, dec), l.p_b, l.p_b + l.gu_b));
              ASSERT_TRUE(disjoint(0, l.down_b, l.p_b, l.p_b + l.gu_b));
              ASSERT_LE(l.down_b + 32, l.pg);  // qd::rd32's reads past its last row: inside
              ASSERT_LE(l.p_b + l.gu_b, l.pg);
              // a K-quant down's slot arrays after its tile (and the 32 bytes read past it)
              if (ty.kdown) {
                ASSERT_GE(l.sf_at, l.down_b + 32);
                ASSERT_GE(l.sf_b, static_cast<size_t>(share(sh.E)) * (sh.F / 32) * 44);
              }
              ASSERT_LE(l.sf_at + l.sf_b, l.pg);
              // the LM head's ring (at least 2 stages of lm_rows rows) in P and G
              ASSERT_GE(l.lm_stages, 2);
              ASSERT_GE(l.slot, ex::step::slot_bytes(l.lm_rows, ty.out));
              ASSERT_LE(static_cast<size_t>(l.lm_stages) * l.slot, l.pg);
              // XS and the rows of x after P and G; the whole within the device's limit
              ASSERT_GE(l.xs_b, l.xf_b + l.aq_b + l.ad_b + l.abs_b);
              ASSERT_GE(l.res_b, l.rx_b + size_t{24} * 56);
              ASSERT_EQ(l.smem, l.pg + l.xs_b + l.res_b);
              ASSERT_LE(l.smem + in.static_b, optin);
            }
          }
        }
      }
    }
  }
  // the 0.5B shape fits on 132 SMs in every type but F32, with the stage
  ASSERT_GT(fitted, 0);
  ASSERT_GT(checked, fitted);
  for (const size_t down : {size_t{9728}, size_t{5168}, size_t{3990}}) {
    ex::step::SmemIn in;
    in.blocks = 132;
    in.E = in.QD = 896;
    in.KD = 128;
    in.F = 4864;
    in.rb_q = in.rb_k = in.rb_v = in.rb_o = in.rb_gate = in.rb_up = down == 9728 ? 1792 : 952;
    in.rb_down = down;
    in.rb_out = down == 9728 ? 1792 : 952;
    in.quant = down != 9728;
    in.kdown = down == 3990;
    in.long_unit_b = 44;
    in.n_layer = 24;
    in.shape_b = 56;
    in.dec_smem_b = 40528;
    in.kv_stage_b = 122880;
    in.static_b = 384;
    in.optin = 232448;
    EXPECT_TRUE(ex::step::smem_layout(in).fits) << down;
  }
}

}  // namespace
}  // namespace worker
