// Exact non-matmul kernels (kernels/exact_ops.cu) against the CPU reference's functions
// (worker/engine/cpu/cpu_ops.h, act_quant.h), bit for bit (see kernels/exact.cuh).
//  - ExactOpsHost.*: HOST EMULATION, runs everywhere (also without a GPU): the kernels' thread
//    decompositions (per-thread strided double sums + the shuffle trees of rmsnorm and the
//    softmax, their certainty checks and sequential fallbacks, the KQV lane chains and their
//    combining trees) replayed on the host with the same math:: helpers the kernels call
//    (kernels/exact_ops_math.cuh), compared with cpu::rms_norm_row / rope_row /
//    attention_head / swiglu_row / ggml_expf. Proves the algorithms. (AttentionDecode*: the
//    one-launch decode kernel's split over a cluster of C blocks per head and its regrouped
//    KQV chains.)
//  - ExactOpsGpu.*: the CUDA kernels, compared over the full output with the cpu:: functions;
//    outputs poisoned (NaN) before each run, cache rows that must not be read are NaN.
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

#include "embed.cuh"
#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "exact_ops_math.cuh"
#include "gguf/ggml_types.h"
// gpu_test_util.h's error metrics promote floats to double (unused here).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "gpu_test_util.h"
#pragma GCC diagnostic pop

namespace worker {
namespace {

namespace ex = kern::exact;
namespace xm = kern::exact::math;
using gputest::DevArray;

// WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh sets it under compute-sanitizer racecheck):
// fewer inputs for the device exp test and a shorter long-context case.
bool quick() {
  return std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Counts elements whose bits differ; prints the first few with both values as %a.
size_t mismatches(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (bits(got[i]) != bits(ref[i])) {
      if (bad < 5) {
        std::printf("%s: [%zu] got %a ref %a\n", what.c_str(), i, static_cast<double>(got[i]),
                    static_cast<double>(ref[i]));
      }
      ++bad;
    }
  }
  return bad;
}

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

// block_sum_double over `nthreads` per-thread values (a multiple of 32): warp butterflies
// (xor 16..1), the warps' sums, then a butterfly over them (zeros beyond the warp count).
double emu_block_sum_double(std::vector<double> v) {
  const size_t nw = v.size() / 32;
  auto butterfly = [](double* lane) {
    for (int o = 16; o > 0; o >>= 1) {
      double t[32];
      for (int l = 0; l < 32; ++l) t[l] = lane[l] + lane[l ^ o];
      std::copy(t, t + 32, lane);
    }
  };
  double sh[32];
  for (size_t w = 0; w < nw; ++w) {
    butterfly(v.data() + 32 * w);
    sh[w] = v[32 * w];
  }
  double r[32];
  for (size_t l = 0; l < 32; ++l) r[l] = l < nw ? sh[l] : 0.0;
  butterfly(r);
  return r[0];
}

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

// ex_attn_{scores,softmax,kqv}_kernel for one (token, head): k / v at the head's group,
// rows kv_dim apart. Returns the number of softmax fallbacks (0 or 1).
int emu_attention_head(const float* qh, const float* k, const float* v, int kv_dim, int hd,
                       int n_att, int cap, bool tiny, float kq_scale, float* out) {
  std::vector<float> sc(static_cast<size_t>(n_att));
  for (int j = 0; j < n_att; ++j) {
    sc[static_cast<size_t>(j)] =
        xm::dot_vecdot(k + static_cast<size_t>(j) * kv_dim, qh, hd) * kq_scale;
  }
  float mx = -INFINITY;
  for (float s : sc) mx = std::fmax(mx, s);
  const int nb = (n_att + 15) / 16;
  std::vector<float> e(static_cast<size_t>(16 * nb)), bs(static_cast<size_t>(nb));
  constexpr int kT = 256;
  std::vector<double> part(kT, 0.0);
  for (int b = 0; b < nb; ++b) {
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * b + i;
      e[static_cast<size_t>(j)] = j < n_att ? xm::expf_ggml(sc[static_cast<size_t>(j)] - mx) : 0.0f;
    }
    bs[static_cast<size_t>(b)] = xm::hsum16(e.data() + 16 * b);
    part[static_cast<size_t>(b % kT)] += static_cast<double>(bs[static_cast<size_t>(b)]);
  }
  float inv;
  int fallback = 0;
  if (!xm::softmax_inv_certain(emu_block_sum_double(part), nb, &inv)) {
    fallback = 1;
    double q = 0.0;
    for (float b : bs) q += static_cast<double>(b);
    inv = xm::softmax_inv(q);
  }
  const int lanes = tiny ? 16 : 64;
  const int len = tiny ? 16 * nb : cap;
  for (int d = 0; d < hd; ++d) {
    float acc[64];
    for (int l = 0; l < lanes; ++l) {
      float a = 0.0f;
      int j = l;
      for (; j < n_att; j += lanes) {
        a = std::fma(v[static_cast<size_t>(j) * kv_dim + d], e[static_cast<size_t>(j)] * inv, a);
      }
      for (; j < len; j += lanes) a = std::fma(0.0f, 0.0f, a);
      acc[l] = a;
    }
    out[d] = tiny ? xm::hsum16(acc) : xm::vecdot_reduce64(acc);
  }
  return fallback;
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
      const float a = xm::dot_vecdot(x.data(), y.data(), n);
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

// HOST EMULATION of the three attention kernels for one (token, head), vs cpu::attention_head.
// REQ: WRK-D15
TEST(ExactOpsHost, AttentionEmulationMatchesCpu) {
  std::mt19937 rng(16);
  size_t bad = 0, heads = 0;
  int fallbacks = 0;
  for (int hd : {8, 64, 128}) {
    for (int n_att : {1, 2, 15, 16, 17, 63, 64, 65, 100, 300, 1001, 5000}) {
      for (int tiny = 0; tiny < 2; ++tiny) {
        const int kv_dim = 2 * hd;  // two KV heads; this head reads the second
        const int cap = (n_att + 63) & ~63;
        const auto k = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
        const auto v = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
        const auto q = uniform(static_cast<size_t>(hd), rng, -3.0f, 3.0f);
        const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<float> out(static_cast<size_t>(hd)), ref(static_cast<size_t>(hd));
        std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
        fallbacks += emu_attention_head(q.data(), k.data() + hd, v.data() + hd, kv_dim, hd, n_att,
                                        cap, tiny != 0, kq_scale, out.data());
        cpu::attention_head(q.data(), k.data() + hd, v.data() + hd, kv_dim, hd, n_att, cap,
                            tiny != 0, kq_scale, sc.data(), col.data(), ref.data());
        bad += mismatches(out, ref,
                          "attention hd " + std::to_string(hd) + " n_att " + std::to_string(n_att) +
                              (tiny ? " tiny" : " vecdot"));
        ++heads;
      }
    }
  }
  std::printf("attention emulation: %zu heads, %d softmax fallbacks\n", heads, fallbacks);
  EXPECT_EQ(bad, 0u);
}

// HOST EMULATION of ex_attn_decode_kernel (exact_ops.cu, one token) with C blocks per head:
// block r's key slice of 16-blocks for the scores and exps, the max of the block maxima, the
// softmax tree of all block sums (256 threads), then KQV with block r's dims, one thread
// running chains l and l + 32 of a dim (l < 32) and adding them, then t[l] + t[l + 16] and
// hsum16. Returns the number of softmax fallbacks.
int emu_attention_decode(const float* qh, const float* k, const float* v, int kv_dim, int hd,
                         int n_att, float kq_scale, int C, float* out) {
  const int nb = (n_att + 15) / 16, cap = (n_att + 63) & ~63;
  const int per = (nb + C - 1) / C;
  std::vector<float> sc(static_cast<size_t>(16 * nb), 0.0f), bs(static_cast<size_t>(nb));
  std::vector<float> bmax(static_cast<size_t>(C), -INFINITY);
  for (int r = 0; r < C; ++r) {
    const int b_lo = std::min(nb, r * per), b_hi = std::min(nb, b_lo + per);
    for (int j = 16 * b_lo; j < std::min(n_att, 16 * b_hi); ++j) {
      sc[static_cast<size_t>(j)] =
          xm::dot_vecdot(k + static_cast<size_t>(j) * kv_dim, qh, hd) * kq_scale;
      bmax[static_cast<size_t>(r)] =
          std::fmax(bmax[static_cast<size_t>(r)], sc[static_cast<size_t>(j)]);
    }
  }
  float mx = -INFINITY;
  for (float m : bmax) mx = std::fmax(mx, m);
  for (int b = 0; b < nb; ++b) {
    float e[16];
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * b + i;
      e[i] = j < n_att ? xm::expf_ggml(sc[static_cast<size_t>(j)] - mx) : 0.0f;
      sc[static_cast<size_t>(j)] = e[i];
    }
    bs[static_cast<size_t>(b)] = xm::hsum16(e);
  }
  constexpr int kT = 256;
  std::vector<double> part(kT, 0.0);
  for (int b = 0; b < nb; ++b)
    part[static_cast<size_t>(b % kT)] += static_cast<double>(bs[static_cast<size_t>(b)]);
  float inv;
  int fallback = 0;
  if (!xm::softmax_inv_certain(emu_block_sum_double(part), nb, &inv)) {
    fallback = 1;
    double q = 0.0;
    for (float b : bs) q += static_cast<double>(b);
    inv = xm::softmax_inv(q);
  }
  const int dper = (hd + C - 1) / C;
  for (int r = 0; r < C; ++r) {
    const int d_lo = std::min(hd, r * dper), d_hi = std::min(hd, d_lo + dper);
    for (int d = d_lo; d < d_hi; ++d) {
      float r32[32], r16[16];
      for (int l = 0; l < 32; ++l) {
        float a[2] = {0.0f, 0.0f};
        for (int base = 0; base < cap; base += 64) {
          for (int c = 0; c < 2; ++c) {
            const int j = base + l + 32 * c;
            a[c] = j < n_att ? std::fma(v[static_cast<size_t>(j) * kv_dim + d],
                                        xm::mul_rn(sc[static_cast<size_t>(j)], inv), a[c])
                             : std::fma(0.0f, 0.0f, a[c]);
          }
        }
        r32[l] = a[0] + a[1];
      }
      for (int l = 0; l < 16; ++l) r16[l] = r32[l] + r32[l + 16];
      out[d] = xm::hsum16(r16);
    }
  }
  return fallback;
}

// REQ: WRK-D15
TEST(ExactOpsHost, AttentionDecodeEmulationMatchesCpu) {
  std::mt19937 rng(17);
  size_t bad = 0, heads = 0;
  for (int hd : {8, 64, 128}) {
    for (int n_att : {1, 2, 15, 16, 17, 38, 63, 64, 65, 1001, 5000}) {
      const int kv_dim = 2 * hd;
      const int cap = (n_att + 63) & ~63;
      const auto k = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
      const auto v = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
      const auto q = uniform(static_cast<size_t>(hd), rng, -3.0f, 3.0f);
      const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> ref(static_cast<size_t>(hd));
      std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
      cpu::attention_head(q.data(), k.data() + hd, v.data() + hd, kv_dim, hd, n_att, cap, false,
                          kq_scale, sc.data(), col.data(), ref.data());
      for (int C : {1, 2, 4, 8}) {
        std::vector<float> out(static_cast<size_t>(hd), std::numeric_limits<float>::quiet_NaN());
        emu_attention_decode(q.data(), k.data() + hd, v.data() + hd, kv_dim, hd, n_att, kq_scale, C,
                             out.data());
        bad += mismatches(out, ref,
                          "decode emulation hd " + std::to_string(hd) + " n_att " +
                              std::to_string(n_att) + " C " + std::to_string(C));
        ++heads;
      }
    }
  }
  std::printf("decode attention emulation: %zu heads\n", heads);
  EXPECT_EQ(bad, 0u);
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
      const float ts = cpu::rope_theta_scale(neox ? 1000000.0f : 10000.0f, n_rot);
      std::vector<float> table(static_cast<size_t>(n_ctx) * n_rot);
      ex::rope_table_host(n_ctx, n_rot, ts, table.data());
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
TEST(ExactOpsGpu, BiasRopeStoreMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(23);
  struct Case {
    bool neox;
    int n_rot;
    bool bias;
  };
  const int hd = 64, nh = 14, nkv = 2, n_ctx = 128;
  const int q_dim = nh * hd, kv_dim = nkv * hd;
  for (const Case c : {Case{true, 64, true}, Case{true, 64, false}, Case{false, 64, false},
                       Case{false, 32, true}, Case{true, 32, false}}) {
    for (int n_past : {0, 37}) {
      for (int n_tok : {1, 5}) {
        const std::string what = std::string(c.neox ? "neox" : "normal") + " n_rot " +
                                 std::to_string(c.n_rot) + (c.bias ? " bias" : "") + " n_past " +
                                 std::to_string(n_past) + " n_tok " + std::to_string(n_tok);
        const float ts = cpu::rope_theta_scale(1000000.0f, c.n_rot);
        std::vector<float> table(static_cast<size_t>(n_ctx) * c.n_rot);
        ex::rope_table_host(n_ctx, c.n_rot, ts, table.data());
        const auto q = uniform(static_cast<size_t>(n_tok) * q_dim, rng, -2.0f, 2.0f);
        const auto k = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -2.0f, 2.0f);
        const auto v = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -2.0f, 2.0f);
        const auto bq = uniform(static_cast<size_t>(q_dim), rng, -0.5f, 0.5f);
        const auto bk = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
        const auto bv = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
        // CPU: CpuEngine::eval's order (bias adds, then rope per token).
        auto rq = q, rk = k, rv = v;
        for (int t = 0; t < n_tok; ++t) {
          if (c.bias) {
            for (int i = 0; i < q_dim; ++i) rq[t * q_dim + i] += bq[i];
            for (int i = 0; i < kv_dim; ++i) rk[t * kv_dim + i] += bk[i];
            for (int i = 0; i < kv_dim; ++i) rv[t * kv_dim + i] += bv[i];
          }
          cpu::rope_row(rq.data() + t * q_dim, nh, hd, c.n_rot, c.neox, ts, n_past + t);
          cpu::rope_row(rk.data() + t * kv_dim, nkv, hd, c.n_rot, c.neox, ts, n_past + t);
        }
        DevArray<float> dq(q), dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dtab(table);
        DevArray<float> kc(static_cast<size_t>(n_ctx) * kv_dim), vc(kc.size());
        DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
        ex::AttnShape s;
        s.n_head = nh;
        s.n_head_kv = nkv;
        s.head_dim = hd;
        s.n_rot = c.n_rot;
        s.neox = c.neox;
        ex::bias_rope_store(dq.get(), dk.get(), dv.get(), c.bias ? dbq.get() : nullptr,
                            c.bias ? dbk.get() : nullptr, c.bias ? dbv.get() : nullptr, s,
                            dtab.get(), n_tok, dnp.get(), kc.get(), vc.get(), nullptr);
        CK(cudaDeviceSynchronize());
        EXPECT_EQ(mismatches(dq.download(), rq, what + " q"), 0u);
        const auto hk = kc.download(), hv = vc.download();
        const size_t off = static_cast<size_t>(n_past) * kv_dim;
        EXPECT_EQ(mismatches(std::vector<float>(hk.begin() + off, hk.begin() + off + rk.size()), rk,
                             what + " k cache"),
                  0u);
        EXPECT_EQ(mismatches(std::vector<float>(hv.begin() + off, hv.begin() + off + rv.size()), rv,
                             what + " v cache"),
                  0u);
        // Nothing else in the caches is written (still the 0xFF poison).
        size_t stray = 0;
        for (size_t i = 0; i < hk.size(); ++i) {
          if (i >= off && i < off + rk.size()) continue;
          stray += bits(hk[i]) != 0xFFFFFFFFu || bits(hv[i]) != 0xFFFFFFFFu;
        }
        EXPECT_EQ(stray, 0u) << what;
      }
    }
  }
}

struct AttnCase {
  int hd, group, n_tok, n_past, n_ctx;
};

// Runs exact::attention for one case and compares every output with cpu::attention_head.
size_t run_attention_case(const AttnCase& c, std::mt19937& rng) {
  const int nkv = 2, nh = nkv * c.group, hd = c.hd;
  const int q_dim = nh * hd, kv_dim = nkv * hd;
  const int n_kv_total = c.n_past + c.n_tok;
  // Cache rows past n_past + n_tok must never be read: NaN there.
  std::vector<float> kc(static_cast<size_t>(c.n_ctx) * kv_dim,
                        std::numeric_limits<float>::quiet_NaN());
  std::vector<float> vc = kc;
  const auto kr = uniform(static_cast<size_t>(n_kv_total) * kv_dim, rng, -1.0f, 1.0f);
  const auto vr = uniform(static_cast<size_t>(n_kv_total) * kv_dim, rng, -1.0f, 1.0f);
  std::copy(kr.begin(), kr.end(), kc.begin());
  std::copy(vr.begin(), vr.end(), vc.begin());
  const auto q = uniform(static_cast<size_t>(c.n_tok) * q_dim, rng, -4.0f, 4.0f);
  // CPU: CpuEngine::eval's loop.
  const int cap = (n_kv_total + 63) & ~63;
  const bool tiny = cpu::tinyblas_takes(GgmlType::F32, hd, c.n_tok, 256);
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(c.n_tok) * q_dim);
  std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
  for (int t = 0; t < c.n_tok; ++t) {
    for (int h = 0; h < nh; ++h) {
      const int g = h / c.group;
      cpu::attention_head(q.data() + t * q_dim + h * hd, kc.data() + g * hd, vc.data() + g * hd,
                          kv_dim, hd, c.n_past + t + 1, cap, tiny, kq_scale, sc.data(), col.data(),
                          ref.data() + t * q_dim + h * hd);
    }
  }
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = hd;
  DevArray<float> dq(q), dk(kc), dv(vc), dout(ref.size());
  DevArray<float> scratch(ex::attention_scratch_floats(c.n_ctx, c.n_tok, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{c.n_past});
  ex::attention(dq.get(), dk.get(), dv.get(), dout.get(), c.n_tok, s, c.n_ctx, dnp.get(),
                scratch.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    ADD_FAILURE() << "attention: " << cudaGetErrorString(cudaGetLastError());
    return ref.size();
  }
  return mismatches(dout.download(), ref,
                    "attention hd " + std::to_string(hd) + " group " + std::to_string(c.group) +
                        " n_tok " + std::to_string(c.n_tok) + " n_past " +
                        std::to_string(c.n_past) + " n_ctx " + std::to_string(c.n_ctx));
}

// REQ: WRK-D15
TEST(ExactOpsGpu, AttentionMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(24);
  size_t bad = 0, cases = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 2, 7}) {
      for (int n_tok : {1, 2, 5, 17, 64}) {
        for (int n_past : {0, 100}) {
          bad += run_attention_case(AttnCase{hd, group, n_tok, n_past, 256}, rng);
          ++cases;
        }
      }
      bad += run_attention_case(AttnCase{hd, group, 1, 1000, 1100}, rng);  // decode
      ++cases;
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// Long context: n_ctx 32768 splits a 64-token batch into chunks of scratch; a decode step at
// n_past 20000.
// REQ: WRK-D15
TEST(ExactOpsGpu, AttentionLongContextMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(25);
  EXPECT_EQ(run_attention_case(AttnCase{64, 7, 64, 100, 32768}, rng), 0u);
  EXPECT_EQ(run_attention_case(AttnCase{64, 7, 1, quick() ? 2000 : 20000, 32768}, rng), 0u);
}

// One decode step (n_tok 1) at n_past: the CPU reference once, then the one-launch decode
// kernel with every cluster size (math::attention_decode_for_tests) and exact::attention
// (its own choice). Returns the mismatch count.
size_t run_decode_case(int hd, int group, int n_past, int n_ctx, std::mt19937& rng) {
  const int nkv = 2, nh = nkv * group;
  const int q_dim = nh * hd, kv_dim = nkv * hd, n_att = n_past + 1;
  std::vector<float> kc(static_cast<size_t>(n_ctx) * kv_dim,
                        std::numeric_limits<float>::quiet_NaN());
  std::vector<float> vc = kc;
  const auto kr = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
  const auto vr = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
  std::copy(kr.begin(), kr.end(), kc.begin());
  std::copy(vr.begin(), vr.end(), vc.begin());
  const auto q = uniform(static_cast<size_t>(q_dim), rng, -4.0f, 4.0f);
  const int cap = (n_att + 63) & ~63;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(q_dim));
  std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
  for (int h = 0; h < nh; ++h) {
    const int g = h / group;
    cpu::attention_head(q.data() + h * hd, kc.data() + g * hd, vc.data() + g * hd, kv_dim, hd,
                        n_att, cap, false, kq_scale, sc.data(), col.data(), ref.data() + h * hd);
  }
  DevArray<float> dq(q), dk(kc), dv(vc), dout(ref.size());
  DevArray<float> scratch(ex::attention_scratch_floats(n_ctx, 1, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
  size_t bad = 0;
  const std::string what = "decode hd " + std::to_string(hd) + " group " + std::to_string(group) +
                           " n_past " + std::to_string(n_past);
  for (int C : {0, 1, 2, 4, 8}) {  // 0: exact::attention
    dout.poison();
    scratch.poison();
    if (C == 0) {
      ex::AttnShape s;
      s.n_head = nh;
      s.n_head_kv = nkv;
      s.head_dim = hd;
      s.n_rot = hd;
      ex::attention(dq.get(), dk.get(), dv.get(), dout.get(), 1, s, n_ctx, dnp.get(), scratch.get(),
                    nullptr);
    } else {
      xm::attention_decode_for_tests(dq.get(), dk.get(), dv.get(), dout.get(), nh, nkv, hd, n_ctx,
                                     dnp.get(), scratch.get(), C);
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
      ADD_FAILURE() << what << " C " << C << ": " << cudaGetErrorString(cudaGetLastError());
      return bad + ref.size();
    }
    bad += mismatches(dout.download(), ref, what + " C " + std::to_string(C));
  }
  return bad;
}

// REQ: WRK-D15
TEST(ExactOpsGpu, AttentionDecodeMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(27);
  size_t bad = 0, cases = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 2, 7}) {
      for (int n_past : {0, 1, 37, 1000}) {
        bad += run_decode_case(hd, group, n_past, n_past + 100, rng);
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// Decode at n_past 20000 (2000 under WORKER_KERNEL_TEST_QUICK), in a 32768 context.
// REQ: WRK-D15
TEST(ExactOpsGpu, AttentionDecodeLongContextMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(28);
  size_t bad = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 2, 7})
      bad += run_decode_case(hd, group, quick() ? 2000 : 20000, 32768, rng);
  }
  EXPECT_EQ(bad, 0u);
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
