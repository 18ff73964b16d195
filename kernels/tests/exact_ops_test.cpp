// Exact rmsnorm / swiglu kernels (kernels/exact_ops.cu) and their math against the CPU
// reference's functions (worker/engine/cpu/cpu_ops.h, act_quant.h), bit for bit (see
// kernels/exact.cuh; the attention's tests: attention_exact_test.cpp).
//  - ExactOpsHost.*: HOST EMULATION, runs everywhere (also without a GPU): the kernels' thread
//    decompositions (per-thread strided double sums + the shuffle tree of rmsnorm, its
//    certainty check and sequential fallback) replayed on the host with the same math::
//    helpers the kernels call (kernels/exact_ops_math.cuh), compared with cpu::rms_norm_row /
//    rope_row / swiglu_row / ggml_expf. Proves the algorithms.
//  - ExactOpsGpu.*: the CUDA kernels, compared over the full output with the cpu:: functions;
//    outputs poisoned (NaN) before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_exact.cuh"
#include "attention_exact_math.cuh"  // rope_pair
#include "common/rope.h"
#include "embed.cuh"
#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "exact_ops_math.cuh"
#include "exact_test_util.h"
#include "gguf/ggml_types.h"

namespace worker {
namespace {

namespace ex = kern::exact;
namespace xm = kern::exact::math;
using gputest::DevArray;
using namespace exacttest;  // NOLINT(google-build-using-namespace): the shared test helpers

// A row of n (a power of two) values whose sum of squares is n * (1 + 2^-24) exactly: n - 1
// ones and 1 + n * 2^-25 (its square rounds to 1 + n * 2^-24). The mean sits exactly on a
// float rounding tie, so rmsnorm's tree result is uncertain and the kernel must take its
// sequential fallback.
std::vector<float> tie_row(int n) {
  std::vector<float> x(static_cast<size_t>(n - 1), 1.0f);
  x.push_back(1.0f + static_cast<float>(n) * 0x1p-25f);
  return x;
}

// ---- host emulation of the kernels' decompositions ------------------------------------

// ex_rmsnorm_kernel for one row (256 threads). *fallback tells whether the sequential
// fallback ran.
void emu_rmsnorm(const float* x, const float* w, float* y, int n, float eps, bool* fallback) {
  constexpr int kT = 256;
  std::vector<double> part(kT, 0.0);
  for (int k = 0; k < kT; ++k) {
    for (int i = k; i < n; i += kT)
      part[static_cast<size_t>(k)] += static_cast<double>(x[i] * x[i]);
  }
  const double s = emu_block_sum_double(part);
  float mean;
  *fallback = !xm::rms_mean_certain(s, n, &mean);
  if (*fallback) {
    double q = 0.0;
    for (int i = 0; i < n; ++i) q += static_cast<double>(x[i] * x[i]);
    mean = xm::rms_mean(q, n);
  }
  const float scale = xm::rms_scale(mean, eps);
  for (int i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// REQ: WRK-D15
TEST(ExactOpsHost, ExpfAndSiluMatchCpuOverWideRange) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> wide(-200.0f, 200.0f), narrow(-90.0f, 90.0f);
  std::uniform_int_distribution<uint32_t> any_bits;
  size_t bad_exp = 0, bad_silu = 0, n = 0;
  auto check = [&](float x) {
    ++n;
    const float a = xm::expf_ggml(x), b = cpu::ggml_expf(x);
    if (bits(a) != bits(b) && !(std::isnan(a) && std::isnan(b))) {
      if (bad_exp++ < 5) std::printf("expf(%a): %a vs cpu %a\n", double(x), double(a), double(b));
    }
    const float c = xm::silu_ggml(x), d = cpu::ggml_silu(x);
    if (bits(c) != bits(d) && !(std::isnan(c) && std::isnan(d))) {
      if (bad_silu++ < 5) std::printf("silu(%a): %a vs cpu %a\n", double(x), double(c), double(d));
    }
  };
  for (int i = 0; i < 1000000; ++i) check(narrow(rng));
  for (int i = 0; i < 1000000; ++i) check(wide(rng));
  for (int i = 0; i < 1000000; ++i) {  // every bit pattern: huge, tiny, subnormal, inf, NaN
    const uint32_t u = any_bits(rng);
    float x;
    std::memcpy(&x, &u, 4);
    check(x);
  }
  // The branch edges: |n| around 192 (results subnormal / zero / inf), 0, +-inf, NaN.
  for (float x = -140.0f; x < -60.0f; x += 0.001953125f) check(x);
  for (float x = 80.0f; x < 140.0f; x += 0.001953125f) check(x);
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(), 133.0f,
                  133.5f, -133.0f, -133.5f, 88.7f, -103.9f, -87.4f}) {
    check(x);
  }
  EXPECT_EQ(bad_exp, 0u) << "of " << n;
  EXPECT_EQ(bad_silu, 0u) << "of " << n;
}

// math::act_round, the one element-wise activation rounding the exact kernels share (quantize_act,
// the fused norms / SwiGLU, the decode attention's output, the persistent decode step): F16 and
// BF16 as the CPU reference's conversions round trip, F32 and the block types unchanged.
// REQ: WRK-D15
TEST(ExactOpsHost, ActRoundMatchesCpuConversions) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f / 3.0f, 65504.0f, 65520.0f, 1e-8f, -2.5e-5f, 1e30f};
  for (int i = 0; i < 2000; ++i) xs.push_back(nd(rng) * std::ldexp(1.0f, (i % 40) - 20));
  for (float x : xs) {
    const float f16 = fp16_to_fp32(fp32_to_fp16(x)), b16 = bf16_to_fp32(fp32_to_bf16(x));
    EXPECT_EQ(bits(kern::exact::math::act_round(ActType::F16, x)), bits(f16)) << x;
    EXPECT_EQ(bits(kern::exact::math::act_round(ActType::BF16, x)), bits(b16)) << x;
    for (ActType t : {ActType::F32, ActType::Q8_0, ActType::Q8_K}) {
      EXPECT_EQ(bits(kern::exact::math::act_round(t, x)), bits(x)) << x;
    }
  }
}

// The SwiGLU tail's expf: libm's (CPU) vs math::expf_libm (glibc's algorithm, what the GPU
// runs), over 10M random inputs in [-30, 30] and every 16th float with |x| in [2^-12, 110].
// Measured on glibc 2.36 (x86-64, FMA): 0 differ here (an exhaustive run over every float in
// that range found 2 of 3.3e8, where glibc is 0.5013 ulp off). For comparison, exp in double
// rounded once (the correctly rounded expf) differs from glibc for ~6.3e-4 of the random
// inputs (12624 of 2e7), which is why the kernels do not use it.
// REQ: WRK-D15
TEST(ExactOpsHost, SwigluTailExpMatchesLibm) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> d(-30.0f, 30.0f);
  size_t bad = 0, bad_dr = 0, bad_swiglu = 0, n = 0;
  auto check = [&](float x) {
    ++n;
    const float libm = std::exp(x), ours = xm::expf_libm(x);
    if (bits(libm) != bits(ours) && !(std::isnan(libm) && std::isnan(ours))) {
      if (bad++ < 5) {
        std::printf("exp(%a): libm %a, expf_libm %a\n", double(x), double(libm), double(ours));
      }
    }
    if (bits(libm) != bits(xm::expf_double_rounded(x))) ++bad_dr;
    float ref = x;
    const float u = 1.5f;
    cpu::swiglu_row(&ref, &u, 1);  // F = 1: the scalar tail only
    if (bits(xm::swiglu_tail(x, u)) != bits(ref)) ++bad_swiglu;
  };
  for (int i = 0; i < 10000000; ++i) check(d(rng));
  const float lo = 0x1p-12f, hi = 110.0f;
  uint32_t ulo, uhi;
  std::memcpy(&ulo, &lo, 4);
  std::memcpy(&uhi, &hi, 4);
  for (uint32_t u = ulo; u <= uhi; u += 16) {
    float x;
    std::memcpy(&x, &u, 4);
    check(x);
    check(-x);
  }
  for (float x : {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 88.0f,
                  88.72283f, 88.72284f, -103.97f, -103.98f, -104.5f, 200.0f, -200.0f}) {
    check(x);
  }
  std::printf(
      "expf: glibc vs expf_libm differ for %zu of %zu inputs (exp in double rounded "
      "once: %zu); swiglu tail outputs differ for %zu\n",
      bad, n, bad_dr, bad_swiglu);
  EXPECT_LE(bad, 2u);
  EXPECT_LE(bad_swiglu, 2u);
}

// REQ: WRK-D15
TEST(ExactOpsHost, VecdotMatchesCpu) {
  std::mt19937 rng(13);
  size_t bad = 0;
  for (int n : {1, 7, 8, 15, 16, 24, 40, 64, 72, 100, 128, 136, 200, 256}) {
    for (int rep = 0; rep < 200; ++rep) {
      const auto x = uniform(static_cast<size_t>(n), rng, -2.0f, 2.0f);
      const auto y = uniform(static_cast<size_t>(n), rng, -2.0f, 2.0f);
      const float a = xm::KvF32::kq_vec(x.data(), y.data(), n, true);  // the scores' dot
      const float b = cpu::dot_vecdot(x.data(), y.data(), n);
      if (bits(a) != bits(b)) {
        if (bad++ < 5) std::printf("n %d: %a vs %a\n", n, double(a), double(b));
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

// HOST EMULATION of ex_rmsnorm_kernel (tree + certainty check + fallback).
// REQ: WRK-D15
TEST(ExactOpsHost, RmsnormTreeEmulationMatchesCpu) {
  std::mt19937 rng(14);
  size_t bad = 0, fallbacks = 0, rows = 0;
  for (int n : {64, 256, 896, 1000, 4864}) {
    const int n_rows = n <= 1000 ? 4000 : 500;
    for (int r = 0; r < n_rows; ++r) {
      const float amp = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
      const auto x = uniform(static_cast<size_t>(n), rng, -amp, amp);
      const auto w = uniform(static_cast<size_t>(n), rng, 0.5f, 1.5f);
      std::vector<float> y(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
      bool fb = false;
      emu_rmsnorm(x.data(), w.data(), y.data(), n, 1e-6f, &fb);
      cpu::rms_norm_row(x.data(), w.data(), ref.data(), n, 1e-6f);
      bad += mismatches(y, ref, "rmsnorm n " + std::to_string(n));
      fallbacks += fb ? 1 : 0;
      ++rows;
    }
  }
  std::printf("rmsnorm emulation: %zu rows, %zu took the sequential fallback\n", rows, fallbacks);
  EXPECT_EQ(bad, 0u);
  // Rows whose mean is exactly a float rounding tie must take the fallback (and match).
  for (int n : {64, 256}) {
    const auto x = tie_row(n);
    const std::vector<float> w(static_cast<size_t>(n), 1.25f);
    std::vector<float> y(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
    bool fb = false;
    emu_rmsnorm(x.data(), w.data(), y.data(), n, 0.0f, &fb);
    cpu::rms_norm_row(x.data(), w.data(), ref.data(), n, 0.0f);
    EXPECT_TRUE(fb) << n;
    EXPECT_EQ(mismatches(y, ref, "rmsnorm tie row"), 0u);
  }
}

// The certainty check itself: a sum right at a float rounding tie of the mean must be
// reported uncertain (the tree and the sequential sum may round to different floats there),
// one far from it certain; and the slack covers the real tree-vs-sequential differences.
// REQ: WRK-D15
TEST(ExactOpsHost, TreeSumCertaintyCheck) {
  float mean;
  const int n = 1024;                      // a power of two: sum = mean * n exactly
  const double tie = (1.0 + 0x1p-24) * n;  // halfway between 1 and 1 + 2^-23
  EXPECT_FALSE(xm::rms_mean_certain(tie, n, &mean));
  EXPECT_FALSE(xm::rms_mean_certain(std::nextafter(tie, 0.0), n, &mean));
  EXPECT_TRUE(xm::rms_mean_certain((1.0 + 0x1p-25) * n, n, &mean));
  EXPECT_EQ(mean, 1.0f);
  float inv;
  EXPECT_FALSE(xm::softmax_inv_certain(1.0 / (1.0 + 0x1p-24), 100, &inv));
  EXPECT_TRUE(xm::softmax_inv_certain(3.0, 100, &inv));
  EXPECT_EQ(bits(inv), bits(static_cast<float>(1.0 / 3.0)));
  // Measured slack: tree vs sequential double sums of random non-negative floats.
  std::mt19937 rng(15);
  double worst = 0.0;
  for (int rep = 0; rep < 2000; ++rep) {
    const int m = 1 + static_cast<int>(rng() % 5000);
    std::vector<double> part(256, 0.0);
    double seq = 0.0;
    std::uniform_real_distribution<float> d(0.0f, 1.0f);
    for (int i = 0; i < m; ++i) {
      const float t = d(rng) * d(rng) * d(rng);
      seq += static_cast<double>(t);
      part[static_cast<size_t>(i % 256)] += static_cast<double>(t);
    }
    const double tree = emu_block_sum_double(part);
    worst = std::max(worst, std::fabs(tree - seq) / xm::tree_sum_slack(tree, m));
  }
  std::printf("tree vs sequential: worst |difference| = %.3g of the slack\n", worst);
  EXPECT_LT(worst, 1.0);
}

// The RoPE table (built with the CPU's cos/sin code) and math::rope_pair reproduce
// cpu::rope_row; swiglu's split (ggml_silu below F & ~15, the tail above) cpu::swiglu_row.
// REQ: WRK-D15
TEST(ExactOpsHost, RopeTableAndSwigluEmulationMatchCpu) {
  std::mt19937 rng(17);
  size_t bad = 0;
  for (int neox = 0; neox < 2; ++neox) {
    for (int n_rot : {64, 32, 8}) {
      const int hd = 64, n_heads = 3, n_ctx = 300;
      const float ts = rope_theta_scale(neox ? 1000000.0f : 10000.0f, n_rot);
      std::vector<float> table(static_cast<size_t>(n_ctx) * n_rot);
      rope_table(n_ctx, n_rot, ts, table.data());
      for (int pos : {0, 1, 37, 299}) {
        auto x = uniform(static_cast<size_t>(n_heads) * hd, rng, -2.0f, 2.0f);
        auto ref = x;
        cpu::rope_row(ref.data(), n_heads, hd, n_rot, neox != 0, ts, pos);
        for (int h = 0; h < n_heads; ++h) {
          float* xh = x.data() + h * hd;
          for (int i = 0; i < n_rot / 2; ++i) {
            const int i0 = neox ? i : 2 * i, i1 = neox ? i + n_rot / 2 : 2 * i + 1;
            const float* cs = table.data() + (static_cast<size_t>(pos) * (n_rot / 2) + i) * 2;
            float d0, d1;
            xm::rope_pair(xh[i0], xh[i1], cs[0], cs[1], d0, d1);
            xh[i0] = d0;
            xh[i1] = d1;
          }
        }
        bad += mismatches(x, ref, "rope n_rot " + std::to_string(n_rot));
      }
    }
  }
  for (int F : {172, 512, 4864}) {
    const auto g = uniform(static_cast<size_t>(F), rng, -30.0f, 30.0f);
    const auto u = uniform(static_cast<size_t>(F), rng, -2.0f, 2.0f);
    auto ref = g;
    cpu::swiglu_row(ref.data(), u.data(), F);
    std::vector<float> out(static_cast<size_t>(F));
    for (int i = 0; i < F; ++i) {
      const size_t s = static_cast<size_t>(i);
      out[s] = i < (F & ~15) ? xm::silu_ggml(g[s]) * u[s] : xm::swiglu_tail(g[s], u[s]);
    }
    bad += mismatches(out, ref, "swiglu F " + std::to_string(F));
  }
  EXPECT_EQ(bad, 0u);
}

// ---- GPU ------------------------------------------------------------------------------

// The device expf / silu / libm-like exp against the CPU's on millions of inputs.
// REQ: WRK-D15
TEST(ExactOpsGpu, DeviceExpfSiluMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(21);
  const size_t n = quick() ? 100000 : 4000000;
  std::vector<float> x(n);
  std::uniform_real_distribution<float> narrow(-90.0f, 90.0f), wide(-200.0f, 200.0f);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (size_t i = 0; i < n; ++i) {
    if (i % 4 == 0) {
      const uint32_t u = any_bits(rng);
      std::memcpy(&x[i], &u, 4);
    } else {
      x[i] = i % 4 == 1 ? wide(rng) : narrow(rng);
    }
  }
  x[0] = INFINITY;
  x[1] = -INFINITY;
  x[2] = std::numeric_limits<float>::quiet_NaN();
  x[3] = -0.0f;
  DevArray<float> dx(x), dy(n);
  for (int which = 0; which < 3; ++which) {
    dy.poison();
    xm::device_map_for_tests(which, dx.get(), dy.get(), n);
    const auto y = dy.download();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      float ref;
      if (which == 0) {
        ref = cpu::ggml_expf(x[i]);
      } else if (which == 1) {
        ref = cpu::ggml_silu(x[i]);
      } else {
        ref = xm::expf_libm(x[i]);  // the host run of the same function
      }
      if (bits(y[i]) != bits(ref) && !(std::isnan(y[i]) && std::isnan(ref))) {
        if (bad++ < 5) {
          std::printf("fn %d x %a: gpu %a cpu %a\n", which, double(x[i]), double(y[i]),
                      double(ref));
        }
      }
    }
    EXPECT_EQ(bad, 0u) << "function " << which << " of " << n << " inputs";
  }
}

// The device's fp16 -> float (qm::half_bits: the hardware conversion, which the quantized
// kernels' block scales go through) is the CPU reference's fp16_to_fp32 for all 65,536 bit
// patterns: bit for bit for every number (subnormals, zeros, infinities), a NaN for a NaN.
// REQ: WRK-D15
TEST(ExactOpsGpu, HalfBitsOnTheDeviceIsTheCpusConversion) {
  REQUIRE_GPU();
  constexpr size_t n = 65536;
  std::vector<float> x(n);
  for (size_t h = 0; h < n; ++h) {
    const auto u = static_cast<uint32_t>(h) | 0x5A5A0000u;  // high half ignored
    std::memcpy(&x[h], &u, 4);
  }
  DevArray<float> dx(x), dy(n);
  dy.poison();
  xm::device_map_for_tests(3, dx.get(), dy.get(), n);
  const auto y = dy.download();
  size_t bad = 0, nans = 0;
  for (size_t h = 0; h < n; ++h) {
    const float ref = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      ++nans;
      if (!std::isnan(y[h]) && bad++ < 5)
        std::printf("fp16 %04zx: gpu %a, not a NaN\n", h, double(y[h]));
    } else if (bits(y[h]) != bits(ref) && bad++ < 5) {
      std::printf("fp16 %04zx: gpu %a cpu %a\n", h, double(y[h]), double(ref));
    }
  }
  EXPECT_EQ(nans, 2046u);  // 2 x (2^10 - 1) NaN patterns
  EXPECT_EQ(bad, 0u);
}

// REQ: WRK-D15
TEST(ExactOpsGpu, RmsnormMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(22);
  for (int n : {64, 256, 896}) {
    for (int rows = 1; rows <= 17; ++rows) {
      const auto x = uniform(static_cast<size_t>(rows) * n, rng, -3.0f, 3.0f);
      const auto w = uniform(static_cast<size_t>(n), rng, -1.5f, 1.5f);
      std::vector<float> ref(x.size());
      for (int r = 0; r < rows; ++r) {
        cpu::rms_norm_row(x.data() + r * n, w.data(), ref.data() + r * n, n, 1e-6f);
      }
      DevArray<float> dx(x), dw(w), dy(x.size());
      ex::rmsnorm(dx.get(), dw.get(), dy.get(), rows, n, 1e-6f, nullptr);
      CK(cudaDeviceSynchronize());
      EXPECT_EQ(mismatches(dy.download(), ref,
                           "rmsnorm n " + std::to_string(n) + " rows " + std::to_string(rows)),
                0u);
    }
  }
  // Rows on a rounding tie of the mean: the kernel's sequential fallback (mixed with
  // ordinary rows in the same launch).
  for (int n : {64, 256}) {
    auto x = uniform(static_cast<size_t>(3 * n), rng, -3.0f, 3.0f);
    const auto tie = tie_row(n);
    std::copy(tie.begin(), tie.end(), x.begin() + n);
    const auto w = uniform(static_cast<size_t>(n), rng, -1.5f, 1.5f);
    std::vector<float> ref(x.size());
    for (int r = 0; r < 3; ++r)
      cpu::rms_norm_row(x.data() + r * n, w.data(), ref.data() + r * n, n, 0.0f);
    DevArray<float> dx(x), dw(w), dy(x.size());
    ex::rmsnorm(dx.get(), dw.get(), dy.get(), 3, n, 0.0f, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(mismatches(dy.download(), ref, "rmsnorm tie rows n " + std::to_string(n)), 0u);
  }
}

// REQ: WRK-D15
TEST(ExactOpsGpu, SwigluMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(26);
  for (int F : {512, 4864, 172}) {
    for (int n_tok : {1, 3, 8}) {
      const auto g = uniform(static_cast<size_t>(n_tok) * F, rng, -30.0f, 30.0f);
      const auto u = uniform(static_cast<size_t>(n_tok) * F, rng, -2.0f, 2.0f);
      auto ref = g;
      for (int t = 0; t < n_tok; ++t) cpu::swiglu_row(ref.data() + t * F, u.data() + t * F, F);
      DevArray<float> dg(g), du(u);
      ex::swiglu(dg.get(), du.get(), n_tok, F, nullptr);
      CK(cudaDeviceSynchronize());
      EXPECT_EQ(mismatches(dg.download(), ref,
                           "swiglu F " + std::to_string(F) + " n_tok " + std::to_string(n_tok)),
                0u);
    }
  }
}

// kern::embed (kernels/embed.cu) against the CPU's dequantize_row, every type.
// REQ: WRK-D15
TEST(ExactOpsGpu, EmbedMatchesDequantizeRow) {
  REQUIRE_GPU();
  std::mt19937 rng(27);
  const int rows = 7, cols = 512;
  const std::vector<int32_t> tokens = {3, 0, 6, 3, 1};
  struct T {
    GgmlType type;
    std::vector<int> f16_offsets;  // fp16 scale fields in a block (kept finite)
  };
  for (const T& tt : {T{GgmlType::F32, {}}, T{GgmlType::F16, {}}, T{GgmlType::BF16, {}},
                      T{GgmlType::Q8_0, {0}}, T{GgmlType::Q4_0, {0}}, T{GgmlType::Q5_0, {0}},
                      T{GgmlType::Q4_K, {0, 2}}, T{GgmlType::Q6_K, {208}}}) {
    const uint32_t ty = static_cast<uint32_t>(tt.type);
    const size_t row_bytes = ggml_row_bytes(tt.type, cols);
    std::vector<uint8_t> data(row_bytes * rows);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f), sd(0.001f, 0.1f);
    if (tt.type == GgmlType::F32 || tt.type == GgmlType::F16 || tt.type == GgmlType::BF16) {
      for (size_t i = 0; i < static_cast<size_t>(rows) * cols; ++i) {
        const float x = d(rng);
        if (tt.type == GgmlType::F32) {
          std::memcpy(data.data() + 4 * i, &x, 4);
        } else {
          const uint16_t h = tt.type == GgmlType::F16 ? fp32_to_fp16(x) : fp32_to_bf16(x);
          std::memcpy(data.data() + 2 * i, &h, 2);
        }
      }
    } else {
      for (auto& b : data) b = static_cast<uint8_t>(rng());
      const size_t bb = *ggml_type_block_bytes(ty);
      for (size_t blk = 0; blk < data.size() / bb; ++blk) {
        for (int off : tt.f16_offsets) {
          const float sv = (tt.type == GgmlType::Q4_K && off == 2) ? sd(rng) * 0.5f : sd(rng);
          const uint16_t h = fp32_to_fp16(sv);
          std::memcpy(data.data() + blk * bb + static_cast<size_t>(off), &h, 2);
        }
      }
    }
    std::vector<float> ref(tokens.size() * cols);
    for (size_t t = 0; t < tokens.size(); ++t) {
      dequantize_row(tt.type, data.data() + static_cast<size_t>(tokens[t]) * row_bytes,
                     ref.data() + t * cols, cols);
    }
    DevArray<uint8_t> dd(data);
    DevArray<int32_t> dt(tokens);
    DevArray<float> dout(ref.size());
    kern::WeightView wv;
    wv.data = dd.get();
    wv.type = ty;
    wv.rows = rows;
    wv.cols = cols;
    wv.row_bytes = row_bytes;
    kern::embed(wv, dt.get(), static_cast<int>(tokens.size()), dout.get(), nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(
        mismatches(dout.download(), ref, std::string("embed ") + std::string(ggml_type_name(ty))),
        0u);
  }
}

}  // namespace
}  // namespace worker
