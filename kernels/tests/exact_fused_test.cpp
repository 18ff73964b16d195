// Exact fused kernels (kernels/act_round.cu: rmsnorm_act, swiglu_act) bit for bit against
//  (a) the unfused exact kernels (rmsnorm / swiglu then quantize_act) on the GPU, and
//  (b) the CPU reference (cpu::rms_norm_row / swiglu_row then cpu::quantize_activation),
// over every output they write (y / g and the ActBuf fields of the act type).
//  - ExactFusedHost.*: HOST EMULATION, runs everywhere: the fused kernels' new decomposition
//    of the activation rounding (Q8_K's max as a warp butterfly plus a scan of the 8 warps'
//    winners, bsums by halving, Q8_0 per warp) replayed with the same math:: helpers
//    (kernels/exact_ops_math.cuh), compared with cpu::quantize_activation.
//  - ExactFusedGpu.*: the CUDA kernels (and attention_act, exact_fused.cuh, in exact_ops.cu)
//  (skipped as "not run" without a GPU); outputs
//    poisoned (0xFF: NaN / -1) before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "exact_fused.cuh"
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

// Counts elements whose bits differ; prints the first few with both values.
template <typename T>
size_t mismatches(const std::vector<T>& got, const std::vector<T>& ref, const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    bool same;
    if constexpr (std::is_same_v<T, float>) {
      same = bits(got[i]) == bits(ref[i]);
    } else {
      same = got[i] == ref[i];
    }
    if (!same) {
      if (bad < 5) {
        if constexpr (std::is_same_v<T, float>) {
          std::printf("%s: [%zu] got %a ref %a\n", what.c_str(), i, static_cast<double>(got[i]),
                      static_cast<double>(ref[i]));
        } else {
          std::printf("%s: [%zu] got %d ref %d\n", what.c_str(), i, static_cast<int>(got[i]),
                      static_cast<int>(ref[i]));
        }
      }
      ++bad;
    }
  }
  return bad;
}

bool type_fits(GgmlType t, int n) {
  return n % act_block(act_type_of(t)) == 0;
}

// The fields quantize_act writes for `t`, for `rows` rows of n, as host vectors.
struct ActHost {
  std::vector<float> f;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bsum;
};

ActHost cpu_act(GgmlType t, const std::vector<float>& x, int rows, int n) {
  ActHost h;
  for (int r = 0; r < rows; ++r) {
    cpu::QuantizedActivation qa;
    cpu::quantize_activation(t, x.data() + static_cast<size_t>(r) * n, n, qa);
    h.f.insert(h.f.end(), qa.f.begin(), qa.f.end());
    h.q.insert(h.q.end(), qa.q.begin(), qa.q.end());
    h.d.insert(h.d.end(), qa.d.begin(), qa.d.end());
    h.bsum.insert(h.bsum.end(), qa.bsum.begin(), qa.bsum.end());
  }
  return h;
}

template <typename T>
std::vector<T> dl(const T* p, size_t n) {
  std::vector<T> h(n);
  if (cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
    ADD_FAILURE() << "cudaMemcpy: " << cudaGetErrorString(cudaGetLastError());
  }
  return h;
}

ActHost gpu_act(GgmlType t, const ex::ActBuf& a, int rows, int n) {
  ActHost h;
  const size_t total = static_cast<size_t>(rows) * n;
  switch (act_type_of(t)) {
    case ActType::F32:
    case ActType::F16:
    case ActType::BF16: h.f = dl(a.f, total); break;
    case ActType::Q8_0:
      h.q = dl(a.q, total);
      h.d = dl(a.d, total / 32);
      break;
    case ActType::Q8_K:
      h.q = dl(a.q, total);
      h.d = dl(a.d, total / 256);
      h.bsum = dl(a.bsum, total / 16);
      break;
  }
  return h;
}

size_t act_mismatches(const ActHost& got, const ActHost& ref, const std::string& what) {
  size_t bad = 0;
  if (got.f.size() != ref.f.size() || got.q.size() != ref.q.size() ||
      got.d.size() != ref.d.size() || got.bsum.size() != ref.bsum.size()) {
    ADD_FAILURE() << what << ": field sizes differ";
    return 1;
  }
  bad += mismatches(got.f, ref.f, what + " f");
  bad += mismatches(got.q, ref.q, what + " q");
  bad += mismatches(got.d, ref.d, what + " d");
  bad += mismatches(got.bsum, ref.bsum, what + " bsum");
  return bad;
}

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

struct ActDev {
  DevArray<uint8_t> mem;
  ex::ActBuf a;
  ActDev(int rows, int n) : mem(ex::act_buffer_bytes(rows, n)) {
    a = ex::act_buffer_at(mem.get(), rows, n);
  }
};

const int kRows[] = {1, 2, 3, 5, 8, 17};

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
        bad += act_mismatches(got, cpu_act(t, y_ref, rows, n), what + " vs cpu");
        bad += act_mismatches(got, gpu_act(t, au.a, rows, n), what + " vs unfused");
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
    for (int rows : kRows) {
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
        bad += act_mismatches(got, cpu_act(t, ref, rows, F), what + " vs cpu");
        bad += act_mismatches(got, gpu_act(t, au.a, rows, F), what + " vs unfused");
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// attention_act: the attention output and its rounding for the next matmul, vs attention +
// quantize_act on the GPU and vs cpu::attention_head + quantize_activation; decode through
// exact::attention_act (its cluster choice) and the test hook (every cluster size), a batch
// of 3 tokens (the unfused fallback).
size_t run_attention_act_case(int hd, int group, int n_tok, int n_past, GgmlType t,
                              std::mt19937& rng) {
  const int nkv = 2, nh = nkv * group, q_dim = nh * hd, kv_dim = nkv * hd;
  const int n_ctx = n_past + n_tok + 40, n_kv = n_past + n_tok;
  std::vector<float> kc(static_cast<size_t>(n_ctx) * kv_dim,
                        std::numeric_limits<float>::quiet_NaN());
  std::vector<float> vc = kc;
  const auto kr = uniform(static_cast<size_t>(n_kv) * kv_dim, rng, -1.0f, 1.0f);
  const auto vr = uniform(static_cast<size_t>(n_kv) * kv_dim, rng, -1.0f, 1.0f);
  std::copy(kr.begin(), kr.end(), kc.begin());
  std::copy(vr.begin(), vr.end(), vc.begin());
  const auto q = uniform(static_cast<size_t>(n_tok) * q_dim, rng, -4.0f, 4.0f);
  const int cap = (n_kv + 63) & ~63;
  const bool tiny = cpu::tinyblas_takes(GgmlType::F32, hd, n_tok, 256);
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(n_tok) * q_dim);
  std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
  for (int tk = 0; tk < n_tok; ++tk) {
    for (int h = 0; h < nh; ++h) {
      const int g = h / group;
      cpu::attention_head(q.data() + tk * q_dim + h * hd, kc.data() + g * hd, vc.data() + g * hd,
                          kv_dim, hd, n_past + tk + 1, cap, tiny, kq_scale, sc.data(), col.data(),
                          ref.data() + tk * q_dim + h * hd);
    }
  }
  const ActHost ref_act = cpu_act(t, ref, n_tok, q_dim);
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = hd;
  DevArray<float> dq(q), dk(kc), dv(vc), dout(ref.size()), dout_u(ref.size());
  DevArray<float> scratch(ex::attention_scratch_floats(n_ctx, n_tok, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
  const std::string what = std::string("attention_act ") +
                           std::string(ggml_type_name(static_cast<uint32_t>(t))) + " hd " +
                           std::to_string(hd) + " group " + std::to_string(group) + " n_tok " +
                           std::to_string(n_tok) + " n_past " + std::to_string(n_past);
  // Unfused on the GPU.
  ActDev au(n_tok, q_dim);
  ex::attention(dq.get(), dk.get(), dv.get(), dout_u.get(), n_tok, s, n_ctx, dnp.get(),
                scratch.get(), nullptr);
  ex::quantize_act(static_cast<uint32_t>(t), dout_u.get(), n_tok, q_dim, au.a, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    ADD_FAILURE() << what << " unfused: " << cudaGetErrorString(cudaGetLastError());
    return 1;
  }
  const ActHost unf = gpu_act(t, au.a, n_tok, q_dim);
  size_t bad = act_mismatches(unf, ref_act, what + " unfused vs cpu");
  const bool hook = n_tok == 1 && act_type_of(t) != ActType::Q8_K;
  for (int C : {0, 1, 2, 8}) {  // 0: exact::attention_act
    if (C != 0 && !hook) break;
    ActDev af(n_tok, q_dim);
    dout.poison();
    if (C == 0) {
      ex::attention_act(dq.get(), dk.get(), dv.get(), dout.get(), n_tok, s, n_ctx, dnp.get(),
                        scratch.get(), static_cast<uint32_t>(t), af.a, nullptr);
    } else {
      xm::attention_act_decode_for_tests(dq.get(), dk.get(), dv.get(), dout.get(), nh, nkv, hd,
                                         n_ctx, dnp.get(), scratch.get(), C,
                                         static_cast<uint32_t>(t), af.a.f, af.a.q, af.a.d);
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
      ADD_FAILURE() << what << " C " << C << ": " << cudaGetErrorString(cudaGetLastError());
      return bad + 1;
    }
    const std::string w = what + " C " + std::to_string(C);
    bad += mismatches(dout.download(), ref, w + " out vs cpu");
    const ActHost got = gpu_act(t, af.a, n_tok, q_dim);
    bad += act_mismatches(got, ref_act, w + " vs cpu");
    bad += act_mismatches(got, unf, w + " vs unfused");
  }
  return bad;
}

// REQ: WRK-D15
TEST(ExactFusedGpu, AttentionActMatchesUnfusedAndCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(45);
  size_t bad = 0, cases = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 7}) {
      for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                         GgmlType::Q4_0, GgmlType::Q6_K}) {
        const int q_dim = 2 * group * hd;
        if (!type_fits(t, q_dim)) continue;
        for (int n_past : {0, 37, 1000}) {
          bad += run_attention_act_case(hd, group, 1, n_past, t, rng);
          ++cases;
        }
        bad += run_attention_act_case(hd, group, 3, 20, t, rng);  // batch: unfused fallback
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// rope_attention_act at decode: bias + RoPE of q and of the token's K, the cache rows at
// n_past, attention and the act, vs the unfused exact kernels and vs the CPU
// (bias adds, cpu::rope_row, cpu::attention_head, cpu::quantize_activation), with every
// cluster size; cache rows other than n_past must stay untouched.
struct RopeCase {
  int hd, group, n_rot;
  bool neox, bias;
};

size_t run_rope_attention_case(const RopeCase& c, int n_past, GgmlType t, std::mt19937& rng) {
  const int nkv = 2, nh = nkv * c.group, hd = c.hd;
  const int q_dim = nh * hd, kv_dim = nkv * hd, n_ctx = n_past + 70, n_att = n_past + 1;
  const float ts = cpu::rope_theta_scale(1000000.0f, c.n_rot);
  std::vector<float> table(static_cast<size_t>(n_ctx) * c.n_rot);
  ex::rope_table_host(n_ctx, c.n_rot, ts, table.data());
  std::vector<float> kc(static_cast<size_t>(n_ctx) * kv_dim,
                        std::numeric_limits<float>::quiet_NaN());
  std::vector<float> vc = kc;
  const auto kr = uniform(static_cast<size_t>(n_past) * kv_dim, rng, -1.0f, 1.0f);
  const auto vr = uniform(static_cast<size_t>(n_past) * kv_dim, rng, -1.0f, 1.0f);
  std::copy(kr.begin(), kr.end(), kc.begin());
  std::copy(vr.begin(), vr.end(), vc.begin());
  const auto q = uniform(static_cast<size_t>(q_dim), rng, -2.0f, 2.0f);
  const auto k = uniform(static_cast<size_t>(kv_dim), rng, -1.0f, 1.0f);
  const auto v = uniform(static_cast<size_t>(kv_dim), rng, -1.0f, 1.0f);
  const auto bq = uniform(static_cast<size_t>(q_dim), rng, -0.5f, 0.5f);
  const auto bk = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
  const auto bv = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
  // CPU: CpuEngine::eval's order.
  auto rq = q, rk = k, rv = v;
  if (c.bias) {
    for (int i = 0; i < q_dim; ++i) rq[static_cast<size_t>(i)] += bq[static_cast<size_t>(i)];
    for (int i = 0; i < kv_dim; ++i) rk[static_cast<size_t>(i)] += bk[static_cast<size_t>(i)];
    for (int i = 0; i < kv_dim; ++i) rv[static_cast<size_t>(i)] += bv[static_cast<size_t>(i)];
  }
  cpu::rope_row(rq.data(), nh, hd, c.n_rot, c.neox, ts, n_past);
  cpu::rope_row(rk.data(), nkv, hd, c.n_rot, c.neox, ts, n_past);
  auto kref = kc, vref = vc;
  std::copy(rk.begin(), rk.end(), kref.begin() + static_cast<size_t>(n_past) * kv_dim);
  std::copy(rv.begin(), rv.end(), vref.begin() + static_cast<size_t>(n_past) * kv_dim);
  const int cap = (n_att + 63) & ~63;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(q_dim));
  std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
  for (int h = 0; h < nh; ++h) {
    const int g = h / c.group;
    cpu::attention_head(rq.data() + h * hd, kref.data() + g * hd, vref.data() + g * hd, kv_dim, hd,
                        n_att, cap, false, kq_scale, sc.data(), col.data(), ref.data() + h * hd);
  }
  const ActHost ref_act = cpu_act(t, ref, 1, q_dim);
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = c.n_rot;
  s.neox = c.neox;
  DevArray<float> dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dtab(table);
  DevArray<float> scratch(ex::attention_scratch_floats(n_ctx, 1, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
  const std::string what = std::string("rope_attention_act ") +
                           std::string(ggml_type_name(static_cast<uint32_t>(t))) + " hd " +
                           std::to_string(hd) + " group " + std::to_string(c.group) + " n_rot " +
                           std::to_string(c.n_rot) + (c.neox ? " neox" : "") +
                           (c.bias ? " bias" : "") + " n_past " + std::to_string(n_past);
  size_t bad = 0;
  // Unfused on the GPU (pass 0), then fused with each cluster size.
  DevArray<float> dq(q), dkc(kc), dvc(vc), dout(ref.size());
  ActDev af(1, q_dim);
  for (int C : {-1, 0, 1, 2, 8}) {
    dq.upload(q);
    dkc.upload(kc);
    dvc.upload(vc);
    dout.poison();
    af.mem.poison();
    if (C < 0) {
      ex::bias_rope_store(dq.get(), dk.get(), dv.get(), c.bias ? dbq.get() : nullptr,
                          c.bias ? dbk.get() : nullptr, c.bias ? dbv.get() : nullptr, s, dtab.get(),
                          1, dnp.get(), dkc.get(), dvc.get(), nullptr);
      ex::attention(dq.get(), dkc.get(), dvc.get(), dout.get(), 1, s, n_ctx, dnp.get(),
                    scratch.get(), nullptr);
      ex::quantize_act(static_cast<uint32_t>(t), dout.get(), 1, q_dim, af.a, nullptr);
    } else {
      xm::set_decode_cluster_for_tests(C);
      ex::rope_attention_act(dq.get(), dk.get(), dv.get(), c.bias ? dbq.get() : nullptr,
                             c.bias ? dbk.get() : nullptr, c.bias ? dbv.get() : nullptr, s,
                             dtab.get(), 1, dnp.get(), dkc.get(), dvc.get(), dout.get(), n_ctx,
                             scratch.get(), static_cast<uint32_t>(t), af.a, nullptr);
      xm::set_decode_cluster_for_tests(0);
    }
    const std::string w = what + (C < 0 ? " unfused" : " C " + std::to_string(C));
    if (cudaDeviceSynchronize() != cudaSuccess) {
      ADD_FAILURE() << w << ": " << cudaGetErrorString(cudaGetLastError());
      return bad + 1;
    }
    bad += mismatches(dq.download(), rq, w + " q");
    bad += mismatches(dkc.download(), kref, w + " k cache");  // incl. untouched NaN rows
    bad += mismatches(dvc.download(), vref, w + " v cache");
    bad += mismatches(dout.download(), ref, w + " out");
    bad += act_mismatches(gpu_act(t, af.a, 1, q_dim), ref_act, w + " act");
  }
  return bad;
}

// REQ: WRK-D15
TEST(ExactFusedGpu, RopeAttentionActMatchesUnfusedAndCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(46);
  size_t bad = 0, cases = 0;
  for (const RopeCase c : {RopeCase{64, 7, 64, true, true}, RopeCase{64, 1, 64, false, false},
                           RopeCase{128, 2, 64, true, false}, RopeCase{128, 7, 128, false, true},
                           RopeCase{8, 2, 8, true, true}}) {
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
      if (!type_fits(t, 2 * c.group * c.hd) || (t == GgmlType::Q8_0 && c.hd % 32 != 0)) continue;
      for (int n_past : {0, 1, 37, 63, 64, 1000}) {
        bad += run_rope_attention_case(c, n_past, t, rng);
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// The 0.5B model's decode shapes (hidden 896, FFN 4864, 14 heads of 64, 2 KV heads,
// n_past 1000): time per call of the fused kernels and of the unfused sequences they
// replace, each captured N times in a CUDA graph (PDL edges as in the engine's decode step),
// printed; the fused results must equal the unfused ones bit for bit.
struct GraphTimer {
  cudaStream_t st = nullptr;
  GraphTimer() { cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking); }
  ~GraphTimer() { cudaStreamDestroy(st); }
  // Microseconds per repetition of body(stream), or -1 on a CUDA error.
  template <typename F>
  double us(F&& body, int reps) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
    for (int i = 0; i < reps; ++i) body(st);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess) return -1;
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) return -1;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaGraphLaunch(ge, st);  // warm-up
    cudaEventRecord(e0, st);
    cudaGraphLaunch(ge, st);
    cudaEventRecord(e1, st);
    const bool ok = cudaStreamSynchronize(st) == cudaSuccess;
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ok ? 1000.0 * static_cast<double>(ms) / reps : -1;
  }
};

// REQ: WRK-D15
TEST(ExactFusedGpu, DecodeShapesTimingAndEquality) {
  REQUIRE_GPU();
  const bool quick = std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
  const int reps = quick ? 1 : 50;
  std::mt19937 rng(47);
  const int n = 896, F = 4864, nh = 14, nkv = 2, hd = 64, n_past = 1000, n_ctx = 2048;
  const int q_dim = nh * hd, kv_dim = nkv * hd;
  const auto x = uniform(static_cast<size_t>(n), rng, -3.0f, 3.0f);
  const auto w = uniform(static_cast<size_t>(n), rng, -2.0f, 2.0f);
  const auto g = uniform(static_cast<size_t>(F), rng, -30.0f, 30.0f);
  const auto u = uniform(static_cast<size_t>(F), rng, -2.0f, 2.0f);
  const auto cache = uniform(static_cast<size_t>(n_ctx) * kv_dim, rng, -1.0f, 1.0f);
  const auto q = uniform(static_cast<size_t>(q_dim), rng, -2.0f, 2.0f);
  const auto kv = uniform(static_cast<size_t>(kv_dim), rng, -1.0f, 1.0f);
  const auto bias = uniform(static_cast<size_t>(q_dim), rng, -0.5f, 0.5f);
  const float ts = cpu::rope_theta_scale(1000000.0f, hd);
  std::vector<float> table(static_cast<size_t>(n_ctx) * hd);
  ex::rope_table_host(n_ctx, hd, ts, table.data());
  DevArray<float> dx(x), dw(w), dy1(x.size()), dy2(x.size()), dg(g), du(u), dg1(g), dg2(g);
  DevArray<float> dkc(cache), dvc(cache), dkc2(cache), dvc2(cache), dq(q), dq1(q), dq2(q);
  DevArray<float> dk(kv), dv(kv), db(bias), dtab(table), dout1(q.size()), dout2(q.size());
  DevArray<float> scratch(ex::attention_scratch_floats(n_ctx, 1, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = hd;
  s.neox = true;
  GraphTimer tm;
  size_t bad = 0;
  for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0}) {
    const auto at = static_cast<uint32_t>(t);
    const std::string tn(ggml_type_name(at));
    ActDev a1(1, F), a2(1, F);
    const double rn_u = tm.us(
        [&](cudaStream_t st) {
          ex::rmsnorm(dx.get(), dw.get(), dy1.get(), 1, n, 1e-6f, st);
          ex::quantize_act(at, dy1.get(), 1, n, a1.a, st);
        },
        reps);
    const double rn_f = tm.us(
        [&](cudaStream_t st) {
          ex::rmsnorm_act(dx.get(), dw.get(), dy2.get(), 1, n, 1e-6f, at, a2.a, st);
        },
        reps);
    bad += mismatches(dy2.download(), dy1.download(), tn + " timing rmsnorm y");
    bad += act_mismatches(gpu_act(t, a2.a, 1, n), gpu_act(t, a1.a, 1, n), tn + " timing rmsnorm");
    // swiglu works in place: each repetition starts from the previous output (same in both).
    dg1.upload(g);
    dg2.upload(g);
    const double sw_u = tm.us(
        [&](cudaStream_t st) {
          ex::swiglu(dg1.get(), du.get(), 1, F, st);
          ex::quantize_act(at, dg1.get(), 1, F, a1.a, st);
        },
        reps);
    const double sw_f = tm.us(
        [&](cudaStream_t st) { ex::swiglu_act(dg2.get(), du.get(), 1, F, at, a2.a, st); }, reps);
    bad += mismatches(dg2.download(), dg1.download(), tn + " timing swiglu g");
    bad += act_mismatches(gpu_act(t, a2.a, 1, F), gpu_act(t, a1.a, 1, F), tn + " timing swiglu");
    // Attention at n_past 1000 (the rotation of q repeats in place in both variants).
    dq1.upload(q);
    dq2.upload(q);
    const double at_u = tm.us(
        [&](cudaStream_t st) {
          ex::bias_rope_store(dq1.get(), dk.get(), dv.get(), db.get(), db.get(), db.get(), s,
                              dtab.get(), 1, dnp.get(), dkc.get(), dvc.get(), st);
          ex::attention(dq1.get(), dkc.get(), dvc.get(), dout1.get(), 1, s, n_ctx, dnp.get(),
                        scratch.get(), st);
          ex::quantize_act(at, dout1.get(), 1, q_dim, a1.a, st);
        },
        reps);
    const double at_f = tm.us(
        [&](cudaStream_t st) {
          ex::rope_attention_act(dq2.get(), dk.get(), dv.get(), db.get(), db.get(), db.get(), s,
                                 dtab.get(), 1, dnp.get(), dkc2.get(), dvc2.get(), dout2.get(),
                                 n_ctx, scratch.get(), at, a2.a, st);
        },
        reps);
    bad += mismatches(dout2.download(), dout1.download(), tn + " timing attention out");
    bad += mismatches(dq2.download(), dq1.download(), tn + " timing attention q");
    bad += mismatches(dkc2.download(), dkc.download(), tn + " timing k cache");
    bad += act_mismatches(gpu_act(t, a2.a, 1, q_dim), gpu_act(t, a1.a, 1, q_dim),
                          tn + " timing attention");
    std::printf(
        "decode shapes, act %s, us per call in a graph: rmsnorm+act %.2f -> rmsnorm_act %.2f; "
        "swiglu+act %.2f -> swiglu_act %.2f; bias_rope_store+attention+act (n_past %d) %.2f -> "
        "rope_attention_act %.2f\n",
        tn.c_str(), rn_u, rn_f, sw_u, sw_f, n_past, at_u, at_f);
    EXPECT_GT(rn_f, 0.0);
    EXPECT_GT(sw_f, 0.0);
    EXPECT_GT(at_f, 0.0);
  }
  // The decode kernel's cluster sizes (attention alone).
  for (int C : {1, 2, 4, 8}) {
    xm::set_decode_cluster_for_tests(C);
    const double t_us = tm.us(
        [&](cudaStream_t st) {
          ex::attention(dq1.get(), dkc.get(), dvc.get(), dout2.get(), 1, s, n_ctx, dnp.get(),
                        scratch.get(), st);
        },
        reps);
    xm::set_decode_cluster_for_tests(0);
    std::printf("decode attention, n_past %d, %d blocks per head: %.2f us per call\n", n_past, C,
                t_us);
    EXPECT_GT(t_us, 0.0);
  }
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace worker
