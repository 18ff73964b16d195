// Exact fused kernels (kernels/act_round.cu: rmsnorm_act, swiglu_act) bit for bit against
//  (a) the unfused exact kernels (rmsnorm / swiglu then quantize_act) on the GPU, and
//  (b) the CPU reference (cpu::rms_norm_row / swiglu_row then cpu::quantize_activation),
// over every output they write (y / g and the ActBuf fields of the act type).
//  - ExactFusedHost.*: HOST EMULATION, runs everywhere: the fused kernels' new decomposition
//    of the activation rounding (Q8_K's max as a warp butterfly plus a scan of the 8 warps'
//    winners, bsums by halving, Q8_0 per warp) replayed with the same math:: helpers
//    (kernels/exact_ops_math.cuh), compared with cpu::quantize_activation.
//  - ExactFusedGpu.*: the CUDA kernels (skipped as "not run" without a GPU); outputs
//    poisoned (0xFF: NaN / -1) before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "exact_float_math.cuh"
#include "exact_ops_math.cuh"
#include "exact_test_util.h"
#include "gguf/ggml_types.h"

namespace worker {
namespace {

namespace ex = kern::exact;
namespace xm = kern::exact::math;
using gputest::DevArray;
using namespace exacttest;  // NOLINT(google-build-using-namespace): the shared test helpers

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                           GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K};

// Values with many exact |x| ties of both signs (Q8_K's "first largest" rule matters) or
// plain random ones.
std::vector<float> tie_heavy(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-6, 6);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(k(rng)) * 0.375f;
  return v;
}

// ---- host emulation -------------------------------------------------------------------

// act_store<kActQ8_K> (act_round.cu) for one 256-block: thread t holds x[t]; warp
// butterfly with math::q8k_max_merge (lower lane wins ties), the 8 warp winners scanned in
// order from amax = 0, quants, sums of 16 by halving, d.
void emu_q8k_block(const float* x, int8_t* q, float* d, int32_t* bsum) {
  float am[256], mx[256];
  for (int t = 0; t < 256; ++t) {
    am[t] = std::fabs(x[t]);
    mx[t] = x[t];
  }
  for (int w = 0; w < 8; ++w) {
    float* a = am + 32 * w;
    float* m = mx + 32 * w;
    for (int o = 1; o < 32; o <<= 1) {
      float na[32], nm[32];
      for (int l = 0; l < 32; ++l) {
        na[l] = a[l];
        nm[l] = m[l];
        xm::q8k_max_merge(na[l], nm[l], a[l ^ o], m[l ^ o], (l ^ o) < l);
      }
      std::memcpy(a, na, sizeof na);
      std::memcpy(m, nm, sizeof nm);
    }
  }
  float amax = 0.0f, mxv = 0.0f;
  for (int w = 0; w < 8; ++w) xm::q8k_max_merge(amax, mxv, am[32 * w], mx[32 * w], false);
  int qi[256];
  float dv = 0.0f;
  for (int t = 0; t < 256; ++t) qi[t] = 0;
  if (amax != 0.0f) {
    const float iscale = -127.f / mxv;
    for (int t = 0; t < 256; ++t) qi[t] = xm::act_q8_k_quant(x[t], iscale);
    dv = 1 / iscale;
  }
  for (int t = 0; t < 256; ++t) q[t] = static_cast<int8_t>(qi[t]);
  for (int g = 0; g < 16; ++g) {  // halving within 16 lanes: integers, any order is exact
    int s[16];
    for (int l = 0; l < 16; ++l) s[l] = qi[16 * g + l];
    for (int o = 1; o < 16; o <<= 1) {
      int n2[16];
      for (int l = 0; l < 16; ++l) n2[l] = s[l] + s[l ^ o];
      std::memcpy(s, n2, sizeof n2);
    }
    bsum[g] = s[0];
  }
  *d = dv;
}

// HOST EMULATION of the fused Q8_K / Q8_0 rounding vs cpu::quantize_activation.
// REQ: WRK-D15
TEST(ExactFusedHost, ActRoundingEmulationMatchesCpu) {
  std::mt19937 rng(41);
  size_t bad = 0;
  for (int rep = 0; rep < 200; ++rep) {
    const int n = 256 * (1 + rep % 3);
    auto x = rep % 2 == 0 ? tie_heavy(static_cast<size_t>(n), rng)
                          : uniform(static_cast<size_t>(n), rng, -3.0f, 3.0f);
    if (rep % 17 == 0) std::fill(x.begin(), x.begin() + 256, 0.0f);  // all-zero block
    // Q8_K
    {
      cpu::QuantizedActivation qa;
      cpu::quantize_activation(GgmlType::Q6_K, x.data(), n, qa);
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> d(static_cast<size_t>(n / 256));
      std::vector<int32_t> bs(static_cast<size_t>(n / 16));
      for (int b = 0; b < n / 256; ++b) {
        emu_q8k_block(x.data() + 256 * b, q.data() + 256 * b, d.data() + b, bs.data() + 16 * b);
      }
      bad += mismatches(q, qa.q, "emu q8k q") + mismatches(d, qa.d, "emu q8k d") +
             mismatches(bs, qa.bsum, "emu q8k bsum");
    }
    // Q8_0: per 32-block amax (max: any order), the helpers' formulas.
    {
      cpu::QuantizedActivation qa;
      cpu::quantize_activation(GgmlType::Q8_0, x.data(), n, qa);
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> d(static_cast<size_t>(n / 32));
      for (int b = 0; b < n / 32; ++b) {
        float am[32];
        for (int l = 0; l < 32; ++l) am[l] = std::fabs(x[static_cast<size_t>(32 * b + l)]);
        for (int o = 16; o > 0; o >>= 1) {
          float t[32];
          for (int l = 0; l < 32; ++l) t[l] = std::fmax(am[l], am[l ^ o]);
          std::memcpy(am, t, sizeof t);
        }
        for (int l = 0; l < 32; ++l) {
          q[static_cast<size_t>(32 * b + l)] =
              xm::act_q8_0_quant(x[static_cast<size_t>(32 * b + l)], xm::act_q8_0_id(am[l]));
        }
        d[static_cast<size_t>(b)] = xm::act_q8_0_d(am[0]);
      }
      bad += mismatches(q, qa.q, "emu q8_0 q") + mismatches(d, qa.d, "emu q8_0 d");
    }
    // F16 / BF16 rounding helpers
    {
      cpu::QuantizedActivation h, b;
      cpu::quantize_activation(GgmlType::F16, x.data(), n, h);
      cpu::quantize_activation(GgmlType::BF16, x.data(), n, b);
      std::vector<float> fh(x.size()), fb(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        fh[i] = xm::act_round_fp16(x[i]);
        fb[i] = xm::act_round_bf16(x[i]);
      }
      bad += mismatches(fh, h.f, "emu f16") + mismatches(fb, b.f, "emu bf16");
    }
  }
  EXPECT_EQ(bad, 0u);
}

// HOST EMULATION: swiglu_act's element function (math::swiglu_one with f16 = F & ~15) is
// cpu::swiglu_row.
// REQ: WRK-D15
TEST(ExactFusedHost, SwigluOneMatchesCpu) {
  std::mt19937 rng(42);
  size_t bad = 0;
  for (int F : {64, 172, 896}) {
    auto g = uniform(static_cast<size_t>(F), rng, -30.0f, 30.0f);
    const auto u = uniform(static_cast<size_t>(F), rng, -2.0f, 2.0f);
    std::vector<float> ref = g, got(g.size());
    cpu::swiglu_row(ref.data(), u.data(), F);
    for (int i = 0; i < F; ++i) {
      got[static_cast<size_t>(i)] =
          xm::swiglu_one(g[static_cast<size_t>(i)], u[static_cast<size_t>(i)], i, F & ~15);
    }
    bad += mismatches(got, ref, "swiglu_one F " + std::to_string(F));
  }
  EXPECT_EQ(bad, 0u);
}

// ---- GPU ------------------------------------------------------------------------------

const int kRows[] = {1, 2, 3, 5, 8, 17};

// The permuted rows (ActBuf::fp) the fused kernels write for tinyBLAS with F32 / F16 roundings:
// every position of each row (xf::tb_perm_cols(n) of them) against the reference's rounded rows
// f_ref permuted by xf::tb_perm_pos, the padding past n -0 (bits); and a.holds() says so. Other
// roundings: nothing permuted.
size_t fp_mismatches(GgmlType t, const ex::ActBuf& a, const std::vector<float>& f_ref, int rows,
                     int n, const std::string& what) {
  if (t != GgmlType::F32 && t != GgmlType::F16) {
    EXPECT_EQ(a.fp_of, nullptr) << what;
    return 0;
  }
  EXPECT_EQ(a.fp_of, a.f) << what;
  const int np = ex::xf::tb_perm_cols(n);
  const auto fp = dl(a.fp, static_cast<size_t>(rows) * np);
  std::vector<float> got(fp.size()), want(fp.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < np; ++c) {
      const size_t i = static_cast<size_t>(r) * np + static_cast<size_t>(c);
      got[i] = fp[static_cast<size_t>(r) * np + static_cast<size_t>(ex::xf::tb_perm_pos(c))];
      want[i] = c < n ? f_ref[static_cast<size_t>(r) * n + static_cast<size_t>(c)] : -0.0f;
    }
  }
  return mismatches(got, want, what + " fp");
}

// REQ: WRK-D15
TEST(ExactFusedGpu, RmsnormActMatchesUnfusedAndCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(43);
  size_t bad = 0, cases = 0;
  for (int n : {64, 256, 896, 4864}) {
    const auto w_rand = uniform(static_cast<size_t>(n), rng, -2.0f, 2.0f);
    // +-1 weights keep the |x| ties of tie-heavy rows (mixed signs) in y.
    std::vector<float> w_pm(static_cast<size_t>(n));
    for (size_t i = 0; i < w_pm.size(); ++i) w_pm[i] = w_rand[i] < 0.0f ? -1.0f : 1.0f;
    DevArray<float> dw_rand(w_rand), dw_pm(w_pm);
    for (int rows : kRows) {
      const bool pm = rows == 2 || rows == 8;
      const auto& w = pm ? w_pm : w_rand;
      DevArray<float>& dw = pm ? dw_pm : dw_rand;
      auto x = uniform(static_cast<size_t>(rows) * n, rng, -3.0f, 3.0f);
      if (rows >= 3 && n == 256) {  // a row on a float tie: the sequential fallback
        std::vector<float> tie(static_cast<size_t>(n - 1), 1.0f);
        tie.push_back(1.0f + static_cast<float>(n) * 0x1p-25f);
        std::copy(tie.begin(), tie.end(), x.begin() + n);
      }
      if (rows >= 2 && n >= 256) {  // tie-heavy row: Q8_K's first-largest rule
        const auto t = tie_heavy(static_cast<size_t>(n), rng);
        std::copy(t.begin(), t.end(), x.begin());
      }
      std::vector<float> y_ref(x.size());
      for (int r = 0; r < rows; ++r) {
        cpu::rms_norm_row(x.data() + static_cast<size_t>(r) * n, w.data(),
                          y_ref.data() + static_cast<size_t>(r) * n, n, 1e-6f);
      }
      DevArray<float> dx(x);
      for (GgmlType t : kTypes) {
        if (!type_fits(t, n)) continue;
        const std::string what = std::string("rmsnorm_act ") +
                                 std::string(ggml_type_name(static_cast<uint32_t>(t))) + " n " +
                                 std::to_string(n) + " rows " + std::to_string(rows);
        DevArray<float> y_f(x.size()), y_u(x.size());
        ActDev af(rows, n), au(rows, n);
        ex::rmsnorm_act(dx.get(), dw.get(), y_f.get(), rows, n, 1e-6f, static_cast<uint32_t>(t),
                        af.a, nullptr);
        ex::rmsnorm(dx.get(), dw.get(), y_u.get(), rows, n, 1e-6f, nullptr);
        ex::quantize_act(static_cast<uint32_t>(t), y_u.get(), rows, n, au.a, nullptr);
        if (cudaDeviceSynchronize() != cudaSuccess) {
          ADD_FAILURE() << what << ": " << cudaGetErrorString(cudaGetLastError());
          return;
        }
        const auto yf = y_f.download();
        bad += mismatches(yf, y_ref, what + " y vs cpu");
        bad += mismatches(yf, y_u.download(), what + " y vs unfused");
        const ActHost got = gpu_act(t, af.a, rows, n);
        const ActHost ref = cpu_act(t, y_ref, rows, n);
        bad += act_mismatches(got, ref, what + " vs cpu");
        bad += act_mismatches(got, gpu_act(t, au.a, rows, n), what + " vs unfused");
        bad += fp_mismatches(t, af.a, ref.f, rows, n, what);
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// REQ: WRK-D15
TEST(ExactFusedGpu, SwigluActMatchesUnfusedAndCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(44);
  size_t bad = 0, cases = 0;
  for (int F : {64, 172, 256, 896, 4864}) {
    // kRows, then 300 rows for the wide rows: a block takes several chunks of a row; 1100 rows
    // of 4864: one block a row, 19 chunks of it
    std::vector<int> row_counts(std::begin(kRows), std::end(kRows));
    if (F >= 896) row_counts.push_back(300);
    if (F == 4864) row_counts.push_back(1100);
    for (int rows : row_counts) {
      auto g = uniform(static_cast<size_t>(rows) * F, rng, -30.0f, 30.0f);
      auto u = uniform(static_cast<size_t>(rows) * F, rng, -2.0f, 2.0f);
      if (rows == 2 || rows == 8) {  // outputs +-silu(g) of few g: many |x| ties of both signs
        const auto t = tie_heavy(g.size(), rng);
        std::copy(t.begin(), t.end(), g.begin());
        for (auto& v : u) v = v < 0.0f ? -1.0f : 1.0f;
      }
      std::vector<float> ref = g;
      for (int r = 0; r < rows; ++r) {
        cpu::swiglu_row(ref.data() + static_cast<size_t>(r) * F,
                        u.data() + static_cast<size_t>(r) * F, F);
      }
      DevArray<float> du(u);
      for (GgmlType t : kTypes) {
        if (!type_fits(t, F)) continue;
        const std::string what = std::string("swiglu_act ") +
                                 std::string(ggml_type_name(static_cast<uint32_t>(t))) + " F " +
                                 std::to_string(F) + " rows " + std::to_string(rows);
        DevArray<float> g_f(g), g_u(g);
        ActDev af(rows, F), au(rows, F);
        ex::swiglu_act(g_f.get(), du.get(), rows, F, static_cast<uint32_t>(t), af.a, nullptr);
        ex::swiglu(g_u.get(), du.get(), rows, F, nullptr);
        ex::quantize_act(static_cast<uint32_t>(t), g_u.get(), rows, F, au.a, nullptr);
        if (cudaDeviceSynchronize() != cudaSuccess) {
          ADD_FAILURE() << what << ": " << cudaGetErrorString(cudaGetLastError());
          return;
        }
        const auto gf = g_f.download();
        bad += mismatches(gf, ref, what + " g vs cpu");
        bad += mismatches(gf, g_u.download(), what + " g vs unfused");
        const ActHost got = gpu_act(t, af.a, rows, F);
        const ActHost want = cpu_act(t, ref, rows, F);
        bad += act_mismatches(got, want, what + " vs cpu");
        bad += act_mismatches(got, gpu_act(t, au.a, rows, F), what + " vs unfused");
        bad += fp_mismatches(t, af.a, want.f, rows, F, what);
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

}  // namespace
}  // namespace worker
