// Exact FP16-KV attention (kernels/exact_attn16.cu) against the CPU reference's F16-KV mode
// (cpu::attention_head_f16, itself bit-identical with llama.cpp's F16 cache), bit for bit.
//  - ExactAttn16Host.*: HOST EMULATION, runs everywhere (also without a GPU): the three
//    kernels' thread decompositions (per-key score threads with the attn16:: helpers, the
//    softmax's 256 per-thread double sums + shuffle tree + certainty check / sequential
//    fallback, the KQV lane chains over fp16 probabilities and their combining trees) replayed
//    on the host with the same functions the kernels call (kernels/exact_attn16_math.cuh,
//    exact_ops_math.cuh), compared with cpu::attention_head_f16. Proves the algorithm.
//  - ExactAttn16Gpu.*: the CUDA kernels over the full output vs the cpu:: functions; outputs
//    poisoned (NaN) before each run, cache rows that must not be read hold fp16 NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "exact_attn16_math.cuh"
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
namespace a16 = kern::exact::attn16;
using gputest::DevArray;

// WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh sets it under compute-sanitizer racecheck): a
// shorter long-context case and no timing loops.
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

// fp16 cache rows from random floats, and their exact float values (the CPU's cache).
std::vector<uint16_t> to_f16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = fp32_to_fp16(x[i]);
  return h;
}
std::vector<float> from_f16(const std::vector<uint16_t>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = fp16_to_fp32(h[i]);
  return x;
}

// ---- host emulation of the kernels' decompositions ------------------------------------

// a16_block_sum_double over `nthreads` per-thread values (a multiple of 32): warp butterflies
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

// a16_{scores,softmax,kqv}_kernel for one (token, head): k / v (fp16 bits) at the head's
// group, rows kv_dim apart; n_tok the batch size, cap the vec_dot length. Returns the number
// of softmax fallbacks (0 or 1).
int emu_attention16(const float* qh, const uint16_t* k, const uint16_t* v, int kv_dim, int hd,
                    int n_att, int cap, int n_tok, float kq_scale, float* out) {
  const bool kq_tiny = n_tok >= 2 && hd % 16 == 0, kqv_tiny = n_tok >= 2 && hd % 4 == 0;
  std::vector<float> qs(static_cast<size_t>(hd));
  for (int i = 0; i < hd; ++i) qs[static_cast<size_t>(i)] = a16::round_f16(qh[i]);
  std::vector<float> sc(static_cast<size_t>(n_att));
  for (int j = 0; j < n_att; ++j) {  // one thread per key
    const uint16_t* kr = k + static_cast<size_t>(j) * kv_dim;
    const float s =
        kq_tiny ? a16::kq_tiny16(kr, qs.data(), hd) : a16::kq_vecdot16(kr, qs.data(), hd);
    sc[static_cast<size_t>(j)] = s * kq_scale;
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
  const int lanes = kqv_tiny ? 16 : 64;
  const int len = kqv_tiny ? 16 * nb : cap;
  for (int d = 0; d < hd; ++d) {
    float acc[64];
    for (int l = 0; l < lanes; ++l) {  // thread (l, d)
      float a = 0.0f;
      int j = l;
      for (; j < n_att; j += lanes) {
        a = std::fma(a16::h2f(v[static_cast<size_t>(j) * kv_dim + d]),
                     a16::prob16(e[static_cast<size_t>(j)], inv), a);
      }
      for (; j < len; j += lanes) a = std::fma(0.0f, 0.0f, a);
      acc[l] = a;
    }
    out[d] = kqv_tiny ? xm::hsum16(acc) : xm::vecdot_reduce64(acc);
  }
  return fallback;
}

// HOST EMULATION: the kernels' decomposition vs cpu::attention_head_f16 for every path (KQ
// tinyBLAS / vec_dot_f16 with and without double leftovers, KQV tinyBLAS / vec_dot_f16).
// REQ: M0-W-1201 WRK-D15
TEST(ExactAttn16Host, AttentionEmulationMatchesCpu) {
  std::mt19937 rng(161);
  size_t heads = 0, bad = 0;
  int fallbacks = 0;
  for (int hd : {8, 64, 80, 128}) {
    for (int n_att : {1, 2, 16, 17, 100, 257, 1000}) {
      for (int n_tok : {1, 2, 5}) {
        const int kv_dim = 2 * hd;
        const auto kf = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
        const auto vf = uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f);
        const auto k16 = to_f16(kf), v16 = to_f16(vf);
        const auto kc = from_f16(k16), vc = from_f16(v16);
        const auto q = uniform(static_cast<size_t>(hd), rng, -4.0f, 4.0f);
        const int cap = (n_att + 63) & ~63;
        const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<float> got(static_cast<size_t>(hd)), ref(static_cast<size_t>(hd));
        fallbacks += emu_attention16(q.data(), k16.data() + hd, v16.data() + hd, kv_dim, hd, n_att,
                                     cap, n_tok, kq_scale, got.data());
        std::vector<float> q16(static_cast<size_t>(hd)), sc(static_cast<size_t>(cap)),
            col(static_cast<size_t>(cap));
        cpu::attention_head_f16(q.data(), kc.data() + hd, vc.data() + hd, kv_dim, hd, n_att, cap,
                                cpu::kq16_tiny(hd, n_tok), cpu::kqv16_tiny(hd, n_tok), kq_scale,
                                q16.data(), sc.data(), col.data(), ref.data());
        bad += mismatches(got, ref,
                          "attention16 hd " + std::to_string(hd) + " n_att " +
                              std::to_string(n_att) + " n_tok " + std::to_string(n_tok));
        ++heads;
      }
    }
  }
  std::printf("attention16 emulation: %zu heads, %d softmax fallbacks\n", heads, fallbacks);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(heads, 84u);
}

// a16_decode_kernel for one head with C blocks: block r scores the keys of its 16-blocks and
// takes their max, the max of the C maxima, exps and hsum16 per 16-block, the 256-thread
// double tree over all block sums (certainty check, sequential fallback), then KQV with one
// task per (chain pair l / l + 32, dim): a0 + a1, then the pairs (i, i + 16) and hsum16.
void emu_decode16(const float* qh, const uint16_t* k, const uint16_t* v, int kv_dim, int hd,
                  int n_att, int C, float kq_scale, float* out) {
  std::vector<float> qs(static_cast<size_t>(hd));
  for (int i = 0; i < hd; ++i) qs[static_cast<size_t>(i)] = a16::round_f16(qh[i]);
  const int nb = (n_att + 15) / 16, cap = (n_att + 63) & ~63;
  std::vector<float> sc(static_cast<size_t>(16 * nb), 0.0f), bs(static_cast<size_t>(nb));
  const int per = (nb + C - 1) / C;
  std::vector<float> pmax(static_cast<size_t>(C), -INFINITY);
  for (int r = 0; r < C; ++r) {
    const int b_lo = std::min(nb, r * per), b_hi = std::min(nb, b_lo + per);
    for (int j = 16 * b_lo; j < std::min(n_att, 16 * b_hi); ++j) {
      sc[static_cast<size_t>(j)] =
          a16::kq_vecdot16(k + static_cast<size_t>(j) * kv_dim, qs.data(), hd) * kq_scale;
      pmax[static_cast<size_t>(r)] =
          std::fmax(pmax[static_cast<size_t>(r)], sc[static_cast<size_t>(j)]);
    }
  }
  float mx = -INFINITY;
  for (float m : pmax) mx = std::fmax(mx, m);
  for (int b = 0; b < nb; ++b) {
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * b + i;
      sc[static_cast<size_t>(j)] =
          j < n_att ? xm::expf_ggml(sc[static_cast<size_t>(j)] - mx) : 0.0f;
    }
    bs[static_cast<size_t>(b)] = xm::hsum16(sc.data() + 16 * b);
  }
  std::vector<double> part(256, 0.0);
  for (int b = 0; b < nb; ++b)
    part[static_cast<size_t>(b % 256)] += static_cast<double>(bs[static_cast<size_t>(b)]);
  float inv;
  if (!xm::softmax_inv_certain(emu_block_sum_double(part), nb, &inv)) {
    double qd = 0.0;
    for (float b : bs) qd += static_cast<double>(b);
    inv = xm::softmax_inv(qd);
  }
  for (int d = 0; d < hd; ++d) {
    float r32[32];
    for (int l = 0; l < 32; ++l) {
      float a0 = 0.0f, a1 = 0.0f;
      for (int base = 0; base < cap; base += 64) {
        const int j0 = base + l, j1 = j0 + 32;
        a0 = j0 < n_att ? std::fma(a16::h2f(v[static_cast<size_t>(j0) * kv_dim + d]),
                                   a16::prob16(sc[static_cast<size_t>(j0)], inv), a0)
                        : std::fma(0.0f, 0.0f, a0);
        a1 = j1 < n_att ? std::fma(a16::h2f(v[static_cast<size_t>(j1) * kv_dim + d]),
                                   a16::prob16(sc[static_cast<size_t>(j1)], inv), a1)
                        : std::fma(0.0f, 0.0f, a1);
      }
      r32[l] = a0 + a1;
    }
    float rr[16];
    for (int i = 0; i < 16; ++i) rr[i] = r32[i] + r32[i + 16];
    out[d] = xm::hsum16(rr);
  }
}

// HOST EMULATION of the one-token kernel, every cluster size, vs cpu::attention_head_f16.
// REQ: M0-W-1201 WRK-D15
TEST(ExactAttn16Host, DecodeEmulationMatchesCpu) {
  std::mt19937 rng(168);
  size_t bad = 0, heads = 0;
  for (int hd : {8, 64, 128}) {
    for (int n_att : {1, 17, 64, 65, 300, 1001}) {
      const int kv_dim = 2 * hd, cap = (n_att + 63) & ~63;
      const auto k16 = to_f16(uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f));
      const auto v16 = to_f16(uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f));
      const auto kc = from_f16(k16), vc = from_f16(v16);
      const auto q = uniform(static_cast<size_t>(hd), rng, -4.0f, 4.0f);
      const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> ref(static_cast<size_t>(hd)), q16(static_cast<size_t>(hd)),
          sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
      cpu::attention_head_f16(q.data(), kc.data() + hd, vc.data() + hd, kv_dim, hd, n_att, cap,
                              false, false, kq_scale, q16.data(), sc.data(), col.data(),
                              ref.data());
      for (int C : {1, 2, 4, 8}) {
        std::vector<float> got(static_cast<size_t>(hd));
        emu_decode16(q.data(), k16.data() + hd, v16.data() + hd, kv_dim, hd, n_att, C, kq_scale,
                     got.data());
        bad += mismatches(got, ref,
                          "decode16 emulation C " + std::to_string(C) + " hd " +
                              std::to_string(hd) + " n_att " + std::to_string(n_att));
        ++heads;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(heads, 72u);
}

// ---- GPU tests ----------------------------------------------------------------------------

// The device's fp16 rounding (__float2half_rn, the cache store and the q / probability
// conversions) equals the CPU's fp32_to_fp16 on normal, subnormal, tie and overflowing values.
// REQ: M0-W-1201
TEST(ExactAttn16Gpu, DeviceFp16RoundingMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(166);
  std::vector<float> x = uniform(200000, rng, -70000.0f, 70000.0f);
  const auto sub = uniform(200000, rng, -1e-4f, 1e-4f);  // fp16 subnormals around 6e-5
  x.insert(x.end(), sub.begin(), sub.end());
  for (int i = 0; i < 100000; ++i) {  // exact ties: an fp16 value plus half its quantum
    const float h = fp16_to_fp32(fp32_to_fp16(x[static_cast<size_t>(i)] * 1e-3f));
    int e;
    std::frexp(h, &e);
    x.push_back(h + std::ldexp(1.0f, std::max(e - 11, -24) - 1));
  }
  DevArray<float> dx(x);
  DevArray<uint16_t> dy(x.size());
  a16::device_f16_bits_for_tests(dx.get(), dy.get(), x.size());
  CK(cudaDeviceSynchronize());
  const auto y = dy.download();
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != fp32_to_fp16(x[i]) && ++bad <= 5) {
      std::printf("fp16 of %a: device %04x cpu %04x\n", static_cast<double>(x[i]), y[i],
                  fp32_to_fp16(x[i]));
    }
  }
  EXPECT_EQ(bad, 0u);
}

// REQ: M0-W-1201 WRK-D15
TEST(ExactAttn16Gpu, BiasRopeStoreF16MatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(163);
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
        // CPU: CpuEngine::eval's order (bias adds, rope per token, then the fp16 store).
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
        const auto rk16 = to_f16(rk), rv16 = to_f16(rv);
        DevArray<float> dq(q), dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dtab(table);
        DevArray<uint16_t> kc(static_cast<size_t>(n_ctx) * kv_dim), vc(kc.size());
        DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
        ex::AttnShape s;
        s.n_head = nh;
        s.n_head_kv = nkv;
        s.head_dim = hd;
        s.n_rot = c.n_rot;
        s.neox = c.neox;
        ex::bias_rope_store_f16(dq.get(), dk.get(), dv.get(), c.bias ? dbq.get() : nullptr,
                                c.bias ? dbk.get() : nullptr, c.bias ? dbv.get() : nullptr, s,
                                dtab.get(), n_tok, dnp.get(), kc.get(), vc.get(), nullptr);
        CK(cudaDeviceSynchronize());
        EXPECT_EQ(mismatches(dq.download(), rq, what + " q"), 0u);
        const auto hk = kc.download(), hv = vc.download();
        const size_t off = static_cast<size_t>(n_past) * kv_dim;
        size_t bad = 0, stray = 0;
        for (size_t i = 0; i < hk.size(); ++i) {
          if (i >= off && i < off + rk16.size()) {
            const bool bk_bad = hk[i] != rk16[i - off], bv_bad = hv[i] != rv16[i - off];
            if ((bk_bad || bv_bad) && bad < 5) {
              std::printf("%s: cache [%zu] k %04x ref %04x, v %04x ref %04x\n", what.c_str(), i,
                          hk[i], rk16[i - off], hv[i], rv16[i - off]);
            }
            bad += bk_bad + bv_bad;
          } else {
            stray += hk[i] != 0xFFFFu || hv[i] != 0xFFFFu;  // still the poison
          }
        }
        EXPECT_EQ(bad, 0u) << what;
        EXPECT_EQ(stray, 0u) << what;
      }
    }
  }
}

struct AttnCase {
  int hd, group, n_tok, n_past, n_ctx;
};

// Runs exact::attention_f16 for one case and compares every output with
// cpu::attention_head_f16 (CpuEngine::eval's loop in the F16-KV mode).
size_t run_attention16_case(const AttnCase& c, std::mt19937& rng) {
  const int nkv = 2, nh = nkv * c.group, hd = c.hd;
  const int q_dim = nh * hd, kv_dim = nkv * hd;
  const int n_kv_total = c.n_past + c.n_tok;
  // Cache rows past n_past + n_tok must never be read: fp16 NaN there.
  std::vector<uint16_t> k16(static_cast<size_t>(c.n_ctx) * kv_dim, uint16_t{0x7E00});
  std::vector<uint16_t> v16 = k16;
  const auto kr = to_f16(uniform(static_cast<size_t>(n_kv_total) * kv_dim, rng, -1.0f, 1.0f));
  const auto vr = to_f16(uniform(static_cast<size_t>(n_kv_total) * kv_dim, rng, -1.0f, 1.0f));
  std::copy(kr.begin(), kr.end(), k16.begin());
  std::copy(vr.begin(), vr.end(), v16.begin());
  const auto kc = from_f16(k16), vc = from_f16(v16);
  const auto q = uniform(static_cast<size_t>(c.n_tok) * q_dim, rng, -4.0f, 4.0f);
  const int cap = (n_kv_total + 63) & ~63;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(c.n_tok) * q_dim);
  std::vector<float> q16(static_cast<size_t>(hd)), sc(static_cast<size_t>(cap)),
      col(static_cast<size_t>(cap));
  for (int t = 0; t < c.n_tok; ++t) {
    for (int h = 0; h < nh; ++h) {
      const int g = h / c.group;
      cpu::attention_head_f16(q.data() + t * q_dim + h * hd, kc.data() + g * hd, vc.data() + g * hd,
                              kv_dim, hd, c.n_past + t + 1, cap, cpu::kq16_tiny(hd, c.n_tok),
                              cpu::kqv16_tiny(hd, c.n_tok), kq_scale, q16.data(), sc.data(),
                              col.data(), ref.data() + t * q_dim + h * hd);
    }
  }
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = hd;
  DevArray<float> dq(q), dout(ref.size());
  DevArray<uint16_t> dk(k16), dv(v16);
  DevArray<float> scratch(ex::attention_f16_scratch_floats(c.n_ctx, c.n_tok, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{c.n_past});
  ex::attention_f16(dq.get(), dk.get(), dv.get(), dout.get(), c.n_tok, s, c.n_ctx, dnp.get(),
                    scratch.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    ADD_FAILURE() << "attention_f16: " << cudaGetErrorString(cudaGetLastError());
    return ref.size();
  }
  return mismatches(dout.download(), ref,
                    "attention16 hd " + std::to_string(hd) + " group " + std::to_string(c.group) +
                        " n_tok " + std::to_string(c.n_tok) + " n_past " +
                        std::to_string(c.n_past) + " n_ctx " + std::to_string(c.n_ctx));
}

// REQ: M0-W-1201 WRK-D15
TEST(ExactAttn16Gpu, AttentionF16MatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(164);
  size_t bad = 0, cases = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 2, 7}) {
      for (int n_tok : {1, 2, 5, 17, 64}) {
        for (int n_past : {0, 37, 1000}) {
          const int n_ctx = n_past >= 1000 ? 1100 : 256;
          bad += run_attention16_case(AttnCase{hd, group, n_tok, n_past, n_ctx}, rng);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
  EXPECT_EQ(cases, 135u);
}

// A head size with leftovers in vec_dot_f16's double loop (80 = 64 + 16) and tinyBLAS KQ, and
// a long context (several score splits, chunked scratch).
// REQ: M0-W-1201 WRK-D15
TEST(ExactAttn16Gpu, AttentionF16OddHeadAndLongContextMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(165);
  size_t bad = 0;
  for (int n_tok : {1, 3}) bad += run_attention16_case(AttnCase{80, 2, n_tok, 37, 256}, rng);
  bad += run_attention16_case(AttnCase{64, 7, 64, 100, 32768}, rng);
  bad += run_attention16_case(AttnCase{64, 7, 1, quick() ? 2000 : 20000, 32768}, rng);
  EXPECT_EQ(bad, 0u);
}

// The one-token kernel with every cluster size (attn16::attention_f16_decode_for_tests) and
// attention_f16's own choice, vs cpu::attention_head_f16 (vec_dot_f16 for KQ and KQV).
// REQ: M0-W-1201 WRK-D15
TEST(ExactAttn16Gpu, AttentionF16DecodeEveryClusterMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(167);
  size_t bad = 0, runs = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 2, 7}) {
      for (int n_past : {0, 37, 1000}) {
        const int nkv = 2, nh = nkv * group, q_dim = nh * hd, kv_dim = nkv * hd;
        const int n_ctx = 1100, n_att = n_past + 1;
        std::vector<uint16_t> k16(static_cast<size_t>(n_ctx) * kv_dim, uint16_t{0x7E00});
        std::vector<uint16_t> v16 = k16;
        const auto kr = to_f16(uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f));
        const auto vr = to_f16(uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f));
        std::copy(kr.begin(), kr.end(), k16.begin());
        std::copy(vr.begin(), vr.end(), v16.begin());
        const auto kc = from_f16(k16), vc = from_f16(v16);
        const auto q = uniform(static_cast<size_t>(q_dim), rng, -4.0f, 4.0f);
        const int cap = (n_att + 63) & ~63;
        const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<float> ref(static_cast<size_t>(q_dim)), q16(static_cast<size_t>(hd)),
            sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
        for (int h = 0; h < nh; ++h) {
          const int g = h / group;
          cpu::attention_head_f16(q.data() + h * hd, kc.data() + g * hd, vc.data() + g * hd, kv_dim,
                                  hd, n_att, cap, false, false, kq_scale, q16.data(), sc.data(),
                                  col.data(), ref.data() + h * hd);
        }
        DevArray<float> dq(q);
        DevArray<uint16_t> dk(k16), dv(v16);
        DevArray<float> scratch(ex::attention_f16_scratch_floats(n_ctx, 1, nh));
        DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
        for (int C : {0, 1, 2, 4, 8}) {  // 0: exact::attention_f16
          DevArray<float> dout(ref.size());
          ex::AttnShape s;
          s.n_head = nh;
          s.n_head_kv = nkv;
          s.head_dim = hd;
          s.n_rot = hd;
          if (C == 0) {
            ex::attention_f16(dq.get(), dk.get(), dv.get(), dout.get(), 1, s, n_ctx, dnp.get(),
                              scratch.get(), nullptr);
          } else {
            a16::attention_f16_decode_for_tests(dq.get(), dk.get(), dv.get(), dout.get(), nh, nkv,
                                                hd, n_ctx, dnp.get(), scratch.get(), C);
          }
          CK(cudaDeviceSynchronize());
          bad += mismatches(dout.download(), ref,
                            "decode16 C " + std::to_string(C) + " hd " + std::to_string(hd) +
                                " group " + std::to_string(group) + " n_past " +
                                std::to_string(n_past));
          ++runs;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(runs, 135u);
}

// Decode at the 0.5B model's attention shape (14 heads / 2 KV, head_dim 64): attention_f16's
// time per call next to exact::attention (F32 cache of the same values), printed for the
// record; the F16 output is checked against the CPU bit for bit.
// REQ: M0-W-1201
TEST(ExactAttn16Gpu, AttentionF16DecodeTimingAt05BShape) {
  REQUIRE_GPU();
  std::mt19937 rng(169);
  const int nh = 14, nkv = 2, hd = 64, q_dim = nh * hd, kv_dim = nkv * hd, n_ctx = 4096;
  for (int n_past : {100, 1000, 4000}) {
    const int n_att = n_past + 1, cap = (n_att + 63) & ~63;
    std::vector<uint16_t> k16(static_cast<size_t>(n_ctx) * kv_dim, uint16_t{0x7E00});
    std::vector<uint16_t> v16 = k16;
    const auto kr = to_f16(uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f));
    const auto vr = to_f16(uniform(static_cast<size_t>(n_att) * kv_dim, rng, -1.0f, 1.0f));
    std::copy(kr.begin(), kr.end(), k16.begin());
    std::copy(vr.begin(), vr.end(), v16.begin());
    const auto kc = from_f16(k16), vc = from_f16(v16);
    const auto q = uniform(static_cast<size_t>(q_dim), rng, -4.0f, 4.0f);
    const float kq_scale = 0.125f;
    std::vector<float> ref(static_cast<size_t>(q_dim)), q16(static_cast<size_t>(hd)),
        sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
    for (int h = 0; h < nh; ++h) {
      cpu::attention_head_f16(q.data() + h * hd, kc.data() + (h / 7) * hd, vc.data() + (h / 7) * hd,
                              kv_dim, hd, n_att, cap, false, false, kq_scale, q16.data(), sc.data(),
                              col.data(), ref.data() + h * hd);
    }
    ex::AttnShape s;
    s.n_head = nh;
    s.n_head_kv = nkv;
    s.head_dim = hd;
    s.n_rot = hd;
    DevArray<float> dq(q), dout(ref.size()), dout32(ref.size()), dk32(kc), dv32(vc);
    DevArray<uint16_t> dk(k16), dv(v16);
    DevArray<float> scratch(std::max(ex::attention_f16_scratch_floats(n_ctx, 1, nh),
                                     ex::attention_scratch_floats(n_ctx, 1, nh)));
    DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int kIters = quick() ? 1 : 200;
    float ms16 = 0.0f, ms32 = 0.0f;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms up
      CK(cudaEventRecord(e0));
      for (int i = 0; i < kIters; ++i) {
        ex::attention_f16(dq.get(), dk.get(), dv.get(), dout.get(), 1, s, n_ctx, dnp.get(),
                          scratch.get(), nullptr);
      }
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms16, e0, e1));
      CK(cudaEventRecord(e0));
      for (int i = 0; i < kIters; ++i) {
        ex::attention(dq.get(), dk32.get(), dv32.get(), dout32.get(), 1, s, n_ctx, dnp.get(),
                      scratch.get(), nullptr);
      }
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms32, e0, e1));
    }
    std::printf("decode attention 14/2 x 64, n_past %d: F16 cache %.2f us, F32 cache %.2f us\n",
                n_past, 1000.0 * static_cast<double>(ms16) / kIters,
                1000.0 * static_cast<double>(ms32) / kIters);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    // the F16 run last wrote dout in pass 1; rerun once so dout is this input's result
    dout.poison();
    ex::attention_f16(dq.get(), dk.get(), dv.get(), dout.get(), 1, s, n_ctx, dnp.get(),
                      scratch.get(), nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(mismatches(dout.download(), ref, "decode16 timing n_past " + std::to_string(n_past)),
              0u);
  }
}

}  // namespace
}  // namespace worker
