// Exact attention (kernels/attention_exact.cu) against the CPU reference bit for bit, one test
// body for both cache types (typed tests over F32Cache / F16Cache): cpu::attention_head over an
// FP32 cache, cpu::attention_head_f16 over an FP16 one (llama.cpp's default, M0-W-1201).
//  - AttentionExactHost/*: HOST EMULATION, runs everywhere (also without a GPU): the kernels'
//    thread decompositions (per-key score threads, the softmax's 256 per-thread double sums +
//    shuffle tree + certainty check / sequential fallback, the KQV lane chains and their
//    combining trees; the one-launch decode kernel's split over a cluster of C blocks per head)
//    replayed on the host with the same functions the kernels call
//    (kernels/attention_exact_math.cuh). Proves the algorithm.
//  - AttentionExactGpu/*: the CUDA kernels over everything they write (q, the caches, out, the
//    ActBuf) vs the CPU, and the fused decode launch vs the unfused kernels; outputs poisoned
//    before each run, cache rows that must not be read hold NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_exact.cuh"
#include "attention_exact_math.cuh"
#include "common/rope.h"
#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact_test_util.h"
#include "gguf/ggml_types.h"

namespace worker {
namespace {

namespace ex = kern::exact;
namespace xm = kern::exact::math;
using gputest::DevArray;
using namespace exacttest;  // NOLINT(google-build-using-namespace): the shared test helpers

// The cache types as the tests see them: the kernels' traits, how the CPU's cache holds a row
// of floats, and the CPU reference's attention of one (token, head) with the CPU's own rules
// for which order (tinyBLAS or vec_dot) each product takes.
struct F32Cache {
  using KV = xm::KvF32;
  using T = float;
  static T nan() { return std::numeric_limits<float>::quiet_NaN(); }
  static std::vector<T> store(const std::vector<float>& x) { return x; }
  static std::vector<float> values(const std::vector<T>& c) { return c; }
  static void cpu_head(const float* q, const float* k, const float* v, int kv_dim, int hd,
                       int n_att, int cap, int n_tok, float kq_scale, float* out) {
    std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
    cpu::attention_head(q, k, v, kv_dim, hd, n_att, cap,
                        cpu::tinyblas_takes(GgmlType::F32, hd, n_tok, 256), kq_scale, sc.data(),
                        col.data(), out);
  }
};
struct F16Cache {
  using KV = xm::KvF16;
  using T = uint16_t;
  static T nan() { return 0x7E00; }
  static std::vector<T> store(const std::vector<float>& x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = fp32_to_fp16(x[i]);
    return h;
  }
  static std::vector<float> values(const std::vector<T>& c) {
    std::vector<float> x(c.size());
    for (size_t i = 0; i < c.size(); ++i) x[i] = fp16_to_fp32(c[i]);
    return x;
  }
  static void cpu_head(const float* q, const float* k, const float* v, int kv_dim, int hd,
                       int n_att, int cap, int n_tok, float kq_scale, float* out) {
    std::vector<float> q16(static_cast<size_t>(hd)), sc(static_cast<size_t>(cap)),
        col(static_cast<size_t>(cap));
    cpu::attention_head_f16(q, k, v, kv_dim, hd, n_att, cap, cpu::kq16_tiny(hd, n_tok),
                            cpu::kqv16_tiny(hd, n_tok), kq_scale, q16.data(), sc.data(), col.data(),
                            out);
  }
};

struct CacheName {
  template <class C>
  static std::string GetName(int) {
    return std::is_same_v<C, F32Cache> ? "F32" : "F16";
  }
};
using CacheTypes = ::testing::Types<F32Cache, F16Cache>;

template <class C>
class AttentionExactHost : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionExactHost, CacheTypes, CacheName);
template <class C>
class AttentionExactGpu : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionExactGpu, CacheTypes, CacheName);

// A cache of n_ctx rows of kv_dim: random rows below `filled`, NaN above (never read).
template <class C>
std::vector<typename C::T> make_cache(int n_ctx, int kv_dim, int filled, std::mt19937& rng) {
  std::vector<typename C::T> c(static_cast<size_t>(n_ctx) * kv_dim, C::nan());
  const auto r = C::store(uniform(static_cast<size_t>(filled) * kv_dim, rng, -1.0f, 1.0f));
  std::copy(r.begin(), r.end(), c.begin());
  return c;
}

// The CPU's attention output [n_tok][n_head * hd] over the cache's values (CpuEngine::eval's
// loop): token t sees keys 0 .. n_past + t.
template <class C>
std::vector<float> cpu_attention(const std::vector<float>& q, const std::vector<float>& kf,
                                 const std::vector<float>& vf, int nh, int group, int hd,
                                 int kv_dim, int n_past, int n_tok) {
  const int q_dim = nh * hd, cap = (n_past + n_tok + 63) & ~63;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(n_tok) * q_dim);
  for (int t = 0; t < n_tok; ++t) {
    for (int h = 0; h < nh; ++h) {
      const size_t o = static_cast<size_t>(t) * q_dim + static_cast<size_t>(h) * hd;
      const size_t go = static_cast<size_t>(h / group) * hd;
      C::cpu_head(q.data() + o, kf.data() + go, vf.data() + go, kv_dim, hd, n_past + t + 1, cap,
                  n_tok, kq_scale, ref.data() + o);
    }
  }
  return ref;
}

ex::AttnShape shape(int nh, int nkv, int hd, int n_rot, bool neox = false) {
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = n_rot;
  s.neox = neox;
  return s;
}

// ---- host emulation of the kernels' decompositions --------------------------------------

// The softmax over 16-blocks of exps e (n_att keys, zero-padded to 16): each block's hsum16,
// the 256 threads' strided double sums and their tree, the certainty check or the sequential
// sum. Returns inv; *fallback counts the sequential sums.
float emu_softmax_inv(const std::vector<float>& e, int n_att, int* fallback) {
  const int nb = (n_att + 15) / 16;
  std::vector<float> bs(static_cast<size_t>(nb));
  std::vector<double> part(256, 0.0);
  for (int b = 0; b < nb; ++b) {
    bs[static_cast<size_t>(b)] = xm::hsum16(e.data() + 16 * static_cast<size_t>(b));
    part[static_cast<size_t>(b % 256)] += static_cast<double>(bs[static_cast<size_t>(b)]);
  }
  float inv;
  if (!xm::softmax_inv_certain(emu_block_sum_double(part), nb, &inv)) {
    ++*fallback;
    double q = 0.0;
    for (float b : bs) q += static_cast<double>(b);
    inv = xm::softmax_inv(q);
  }
  return inv;
}

// e[j] = ggml_expf(s[j] - max) for j < n_att, 0 up to the 16-padding.
std::vector<float> emu_exps(const std::vector<float>& s, int n_att, float mx) {
  std::vector<float> e(static_cast<size_t>(16 * ((n_att + 15) / 16)), 0.0f);
  for (int j = 0; j < n_att; ++j) {
    e[static_cast<size_t>(j)] = xm::expf_ggml(s[static_cast<size_t>(j)] - mx);
  }
  return e;
}

// ex_attn_{scores,softmax,kqv}_kernel for one (token, head): k / v at the head's group, rows
// kv_dim apart; n_tok the batch size (which orders apply), cap the vec_dot length.
template <class C>
void emu_attention(const float* qh, const typename C::T* k, const typename C::T* v, int kv_dim,
                   int hd, int n_att, int cap, int n_tok, float kq_scale, float* out,
                   int* fallback) {
  using KV = typename C::KV;
  const bool kq_tiny = KV::kq_tiny(hd, n_tok), kqv_tiny = xm::kqv_tiny(hd, n_tok);
  std::vector<float> qs(static_cast<size_t>(hd));
  for (int i = 0; i < hd; ++i) qs[static_cast<size_t>(i)] = KV::query(qh[i]);
  std::vector<float> sc(static_cast<size_t>(n_att));
  for (int j = 0; j < n_att; ++j) {  // one thread per key
    const typename C::T* kr = k + static_cast<size_t>(j) * kv_dim;
    float s;
    if constexpr (KV::kTinyKq) {
      s = kq_tiny ? KV::kq_tiny16(kr, qs.data(), hd) : KV::kq_vec(kr, qs.data(), hd, true);
    } else {
      s = KV::kq_vec(kr, qs.data(), hd, true);
    }
    sc[static_cast<size_t>(j)] = s * kq_scale;
  }
  float mx = -INFINITY;
  for (float s : sc) mx = std::fmax(mx, s);
  const std::vector<float> e = emu_exps(sc, n_att, mx);
  const float inv = emu_softmax_inv(e, n_att, fallback);
  const int lanes = kqv_tiny ? 16 : 64;
  const int len = kqv_tiny ? static_cast<int>(e.size()) : cap;
  for (int d = 0; d < hd; ++d) {
    float acc[64];
    for (int l = 0; l < lanes; ++l) {  // thread (l, d)
      float a = 0.0f;
      int j = l;
      for (; j < n_att; j += lanes) {
        a = std::fma(KV::load(v[static_cast<size_t>(j) * kv_dim + d]),
                     KV::prob(e[static_cast<size_t>(j)], inv), a);
      }
      for (; j < len; j += lanes) a = std::fma(0.0f, 0.0f, a);
      acc[l] = a;
    }
    out[d] = kqv_tiny ? xm::hsum16(acc) : xm::vecdot_reduce64(acc);
  }
}

// The scratch the engine allocates (attention_scratch_floats(n_ctx, max_tok)) holds the layout of
// every call it may make: n_keys <= n_ctx (a prompt batch passes n_past + n_tok) and n_tok <=
// max_tok, down to a single token a launch group at the largest contexts. Host only.
// REQ: M0-W-1201
TEST(AttentionExactScratch, AllocationHoldsEveryLayout) {
  size_t checked = 0;
  for (const int n_head : {1, 2, 14, 32, 64}) {
    for (const int n_ctx : {1, 63, 64, 65, 776, 1100, 4104, 5000, 32768, 131072, 1 << 20}) {
      for (const int max_tok : {1, 17, 64, 512}) {
        const size_t have = ex::attention_scratch_floats(n_ctx, max_tok, n_head);
        // every n_keys up to 8192 (where the layouts chunk at 512 tokens and more), then steps
        const int step = n_ctx <= 8192 ? 1 : 61;
        for (int n_keys = 1; n_keys <= n_ctx; n_keys += (n_keys < 8192 ? 1 : step)) {
          for (const int n_tok : {1, max_tok / 2, max_tok}) {
            if (n_tok < 1) continue;
            const size_t used = ex::attention_scratch_used_for_tests(n_keys, n_tok, n_head);
            ++checked;
            if (used > have) {
              FAIL() << "n_head " << n_head << " n_ctx " << n_ctx << " max_tok " << max_tok
                     << " n_keys " << n_keys << " n_tok " << n_tok << ": the layout uses " << used
                     << " floats, the allocation has " << have;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000000u);
}

// HOST EMULATION: the three kernels vs the CPU for every path (KQ tinyBLAS / vec_dot with and
// without leftovers, KQV tinyBLAS / vec_dot).
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactHost, AttentionEmulationMatchesCpu) {
  using C = TypeParam;
  std::mt19937 rng(16);
  size_t heads = 0, bad = 0;
  int fallbacks = 0;
  for (int hd : {8, 64, 80, 128}) {
    for (int n_att : {1, 2, 15, 16, 17, 63, 64, 65, 100, 257, 300, 1001, 5000}) {
      for (int n_tok : {1, 2, 5}) {
        const int kv_dim = 2 * hd;  // two KV heads; this head reads the second
        const int cap = (n_att + 63) & ~63;
        const auto k = make_cache<C>(n_att, kv_dim, n_att, rng);
        const auto v = make_cache<C>(n_att, kv_dim, n_att, rng);
        const auto q = uniform(static_cast<size_t>(hd), rng, -4.0f, 4.0f);
        const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<float> got(static_cast<size_t>(hd)), ref(static_cast<size_t>(hd));
        emu_attention<C>(q.data(), k.data() + hd, v.data() + hd, kv_dim, hd, n_att, cap, n_tok,
                         kq_scale, got.data(), &fallbacks);
        C::cpu_head(q.data(), C::values(k).data() + hd, C::values(v).data() + hd, kv_dim, hd, n_att,
                    cap, n_tok, kq_scale, ref.data());
        bad += mismatches(got, ref,
                          "attention hd " + std::to_string(hd) + " n_att " + std::to_string(n_att) +
                              " n_tok " + std::to_string(n_tok));
        ++heads;
      }
    }
  }
  std::printf("attention emulation: %zu heads, %d softmax fallbacks\n", heads, fallbacks);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(heads, 156u);
}

// ex_attn_decode_kernel for one head with C blocks: block r scores the keys of its 16-blocks
// and takes their max, the max of the C maxima, exps and hsum16 per 16-block, the 256-thread
// double tree over all block sums, then KQV with block r's dims, one task per (chain pair
// l / l + 32, dim): a0 + a1, then the pairs (i, i + 16) and hsum16.
template <class Cache>
void emu_decode(const float* qh, const typename Cache::T* k, const typename Cache::T* v, int kv_dim,
                int hd, int n_att, int C, float kq_scale, float* out) {
  using KV = typename Cache::KV;
  std::vector<float> qs(static_cast<size_t>(hd));
  for (int i = 0; i < hd; ++i) qs[static_cast<size_t>(i)] = KV::query(qh[i]);
  const int nb = (n_att + 15) / 16, cap = (n_att + 63) & ~63;
  const int per = (nb + C - 1) / C;
  std::vector<float> sc(static_cast<size_t>(n_att));
  std::vector<float> bmax(static_cast<size_t>(C), -INFINITY);
  for (int r = 0; r < C; ++r) {
    const int b_lo = std::min(nb, r * per), b_hi = std::min(nb, b_lo + per);
    for (int j = 16 * b_lo; j < std::min(n_att, 16 * b_hi); ++j) {
      const float s = KV::kq_vec(k + static_cast<size_t>(j) * kv_dim, qs.data(), hd, true);
      sc[static_cast<size_t>(j)] = s * kq_scale;
      bmax[static_cast<size_t>(r)] =
          std::fmax(bmax[static_cast<size_t>(r)], sc[static_cast<size_t>(j)]);
    }
  }
  float mx = -INFINITY;
  for (float m : bmax) mx = std::fmax(mx, m);
  const std::vector<float> e = emu_exps(sc, n_att, mx);
  int fallback = 0;
  const float inv = emu_softmax_inv(e, n_att, &fallback);
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
            a[c] = j < n_att ? std::fma(KV::load(v[static_cast<size_t>(j) * kv_dim + d]),
                                        KV::prob(e[static_cast<size_t>(j)], inv), a[c])
                             : std::fma(0.0f, 0.0f, a[c]);
          }
        }
        r32[l] = a[0] + a[1];
      }
      for (int l = 0; l < 16; ++l) r16[l] = r32[l] + r32[l + 16];
      out[d] = xm::hsum16(r16);
    }
  }
}

// HOST EMULATION of the one-token kernel, every cluster size, vs the CPU (vec_dot orders).
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactHost, DecodeEmulationMatchesCpu) {
  using Cache = TypeParam;
  std::mt19937 rng(17);
  size_t bad = 0, heads = 0;
  for (int hd : {8, 64, 80, 128}) {
    for (int n_att : {1, 2, 15, 16, 17, 38, 63, 64, 65, 300, 1001, 5000}) {
      const int kv_dim = 2 * hd, cap = (n_att + 63) & ~63;
      const auto k = make_cache<Cache>(n_att, kv_dim, n_att, rng);
      const auto v = make_cache<Cache>(n_att, kv_dim, n_att, rng);
      const auto q = uniform(static_cast<size_t>(hd), rng, -4.0f, 4.0f);
      const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> ref(static_cast<size_t>(hd));
      Cache::cpu_head(q.data(), Cache::values(k).data() + hd, Cache::values(v).data() + hd, kv_dim,
                      hd, n_att, cap, 1, kq_scale, ref.data());
      for (int C : {1, 2, 4, 8}) {
        std::vector<float> got(static_cast<size_t>(hd), std::numeric_limits<float>::quiet_NaN());
        emu_decode<Cache>(q.data(), k.data() + hd, v.data() + hd, kv_dim, hd, n_att, C, kq_scale,
                          got.data());
        bad += mismatches(got, ref,
                          "decode emulation C " + std::to_string(C) + " hd " + std::to_string(hd) +
                              " n_att " + std::to_string(n_att));
        ++heads;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(heads, 192u);
}

// ---- GPU ----------------------------------------------------------------------------------

// The device's fp16 rounding (the cache store and the q / probability conversions) equals the
// CPU's fp32_to_fp16 on normal, subnormal, tie and overflowing values.
// REQ: M0-W-1201
TEST(AttentionExactGpuF16, DeviceFp16RoundingMatchesCpu) {
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
  ex::device_f16_bits_for_tests(dx.get(), dy.get(), x.size());
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(mismatches(dy.download(), F16Cache::store(x), "device fp16 bits"), 0u);
}

// bias + RoPE + store: q rotated in place, the cache rows at n_past..n_past+n_tok-1 as the CPU
// stores them, every other cache element untouched (still the 0xFF poison).
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactGpu, BiasRopeStoreMatchesCpu) {
  using C = TypeParam;
  using T = typename C::T;
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
        const float ts = rope_theta_scale(1000000.0f, c.n_rot);
        std::vector<float> table(static_cast<size_t>(n_ctx) * c.n_rot);
        rope_table(n_ctx, c.n_rot, ts, table.data());
        const auto q = uniform(static_cast<size_t>(n_tok) * q_dim, rng, -2.0f, 2.0f);
        const auto k = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -2.0f, 2.0f);
        const auto v = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -2.0f, 2.0f);
        const auto bq = uniform(static_cast<size_t>(q_dim), rng, -0.5f, 0.5f);
        const auto bk = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
        const auto bv = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
        // CPU: CpuEngine::eval's order (bias adds, rope per token, then the store).
        auto rq = q, rk = k, rv = v;
        for (int t = 0; t < n_tok; ++t) {
          if (c.bias) {
            for (int i = 0; i < q_dim; ++i) rq[t * q_dim + i] += bq[i];
            for (int i = 0; i < kv_dim; ++i) rk[t * kv_dim + i] += bk[i];
            for (int i = 0; i < kv_dim; ++i) rv[t * kv_dim + i] += bv[i];
          }
          cpu::rope_row(rq.data() + static_cast<size_t>(t) * q_dim, nh, hd, c.n_rot, c.neox, ts,
                        n_past + t);
          cpu::rope_row(rk.data() + static_cast<size_t>(t) * kv_dim, nkv, hd, c.n_rot, c.neox, ts,
                        n_past + t);
        }
        DevArray<float> dq(q), dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dtab(table);
        DevArray<T> kc(static_cast<size_t>(n_ctx) * kv_dim), vc(kc.size());
        std::vector<T> kref = kc.download(), vref = vc.download();  // the poison
        const auto rk_c = C::store(rk), rv_c = C::store(rv);
        const auto off = static_cast<ptrdiff_t>(n_past) * kv_dim;
        std::copy(rk_c.begin(), rk_c.end(), kref.begin() + off);
        std::copy(rv_c.begin(), rv_c.end(), vref.begin() + off);
        DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
        const ex::QkvIn x{dq.get(),
                          dk.get(),
                          dv.get(),
                          c.bias ? dbq.get() : nullptr,
                          c.bias ? dbk.get() : nullptr,
                          c.bias ? dbv.get() : nullptr};
        ex::bias_rope_store(x, shape(nh, nkv, hd, c.n_rot, c.neox), dtab.get(), n_tok, dnp.get(),
                            kc.get(), vc.get(), nullptr);
        CK(cudaDeviceSynchronize());
        EXPECT_EQ(mismatches(dq.download(), rq, what + " q"), 0u);
        EXPECT_EQ(mismatches(kc.download(), kref, what + " k cache"), 0u);
        EXPECT_EQ(mismatches(vc.download(), vref, what + " v cache"), 0u);
      }
    }
  }
}

struct AttnCase {
  int hd, group, n_tok, n_past, n_ctx;
};

// One case's inputs (caches: random rows below n_past + n_tok, NaN above, never read), the
// CPU's output and their device copies.
template <class Cache>
struct AttnData {
  const AttnCase c;
  const int nh, kv_dim, q_dim;
  const std::vector<typename Cache::T> kc, vc;
  const std::vector<float> q, ref;
  DevArray<float> dq, dout, scratch;
  DevArray<typename Cache::T> dk, dv;
  DevArray<int32_t> dnp;
  AttnData(const AttnCase& c_, std::mt19937& rng)
      : c(c_),
        nh(2 * c.group),
        kv_dim(2 * c.hd),
        q_dim(nh * c.hd),
        kc(make_cache<Cache>(c.n_ctx, kv_dim, c.n_past + c.n_tok, rng)),
        vc(make_cache<Cache>(c.n_ctx, kv_dim, c.n_past + c.n_tok, rng)),
        q(uniform(static_cast<size_t>(c.n_tok) * q_dim, rng, -4.0f, 4.0f)),
        ref(cpu_attention<Cache>(q, Cache::values(kc), Cache::values(vc), nh, c.group, c.hd, kv_dim,
                                 c.n_past, c.n_tok)),
        dq(q),
        dout(ref.size()),
        scratch(ex::attention_scratch_floats(c.n_ctx, c.n_tok, nh)),
        dk(kc),
        dv(vc),
        dnp(std::vector<int32_t>{c.n_past}) {}
  ex::AttnShape s() const { return shape(nh, 2, c.hd, c.hd); }
  std::string name() const {
    return "hd " + std::to_string(c.hd) + " group " + std::to_string(c.group) + " n_tok " +
           std::to_string(c.n_tok) + " n_past " + std::to_string(c.n_past) + " n_ctx " +
           std::to_string(c.n_ctx);
  }
};

// exact::attend for one case, one token with the decode kernel's own cluster choice (C 0) and
// every cluster size; every output vs the CPU's. A batch runs twice: with the keys bound at
// n_ctx (the scratch laid out for the whole cache, in several launches when long) and at
// n_past + n_tok (as the engine passes it for a prompt batch). Returns the mismatch count.
template <class Cache>
size_t run_attention_case(const AttnCase& c, std::mt19937& rng) {
  AttnData<Cache> a(c, rng);
  size_t bad = 0;
  // lk -1: the decode kernel's local mode where n_past allows it; 0: always the cluster exchange
  for (int lk : {-1, 0}) {
    for (int C : {0, 1, 2, 4, 8}) {
      if (c.n_tok > 1 && (C > 0 || lk == 0)) break;  // clusters: the one-token kernel only
      if (lk == 0 && C != 0 && quick()) continue;    // compute-sanitizer time
      for (const int n_keys : {c.n_ctx, c.n_past + c.n_tok}) {
        if (n_keys != c.n_ctx && c.n_tok == 1) break;  // the decode step passes n_ctx
        a.dout.poison();
        a.scratch.poison();
        ex::set_decode_cluster_for_tests(C);
        ex::set_decode_local_keys_for_tests(lk);
        ex::attend(a.dq.get(), a.dk.get(), a.dv.get(), a.dout.get(), c.n_tok, a.s(), n_keys,
                   a.dnp.get(), a.scratch.get(), nullptr);
        ex::set_decode_cluster_for_tests(0);
        ex::set_decode_local_keys_for_tests(-1);
        const std::string what = "attend " + a.name() + " n_keys " + std::to_string(n_keys) +
                                 " C " + std::to_string(C) + " lk " + std::to_string(lk);
        if (cudaDeviceSynchronize() != cudaSuccess) {
          ADD_FAILURE() << what << ": " << cudaGetErrorString(cudaGetLastError());
          return bad + a.ref.size();
        }
        bad += mismatches(a.dout.download(), a.ref, what);
      }
    }
  }
  return bad;
}

// Batches and single tokens (the decode kernel with every cluster size) at several positions.
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactGpu, AttentionMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(24);
  size_t bad = 0, cases = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 2, 7}) {
      for (int n_tok : {1, 2, 5, 17, 64}) {
        for (int n_past : {0, 1, 37, 100, 1000}) {
          // compute-sanitizer time (WORKER_KERNEL_TEST_QUICK): fewer batch sizes and positions
          if (quick() && (n_tok == 17 || n_past == 37 || n_past == 100)) continue;
          const int n_ctx = n_past >= 1000 ? 1100 : 256;
          bad += run_attention_case<TypeParam>(AttnCase{hd, group, n_tok, n_past, n_ctx}, rng);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
  EXPECT_EQ(cases, quick() ? 108u : 225u);
}

// Long batches (256 tokens and more: the KQV kernel's 16-row tiles, keys staged in several
// chunks, the tiles launched last token first), with and without a cached past.
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactGpu, LongBatchesMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(27);
  size_t bad = 0;
  bad += run_attention_case<TypeParam>(AttnCase{64, 7, 300, 0, 320}, rng);
  bad += run_attention_case<TypeParam>(AttnCase{64, 7, 257, 230, 512}, rng);
  if (!quick()) {
    bad += run_attention_case<TypeParam>(AttnCase{128, 2, 256, 37, 320}, rng);
    bad += run_attention_case<TypeParam>(AttnCase{80, 1, 260, 5, 320}, rng);
  }
  EXPECT_EQ(bad, 0u);
}

// A head size with leftovers in vec_dot's tail (80 = 64 + 16), and long contexts: n_ctx 32768
// splits a 64-token batch into chunks of scratch; decode steps at n_past 20000 (2000 under
// WORKER_KERNEL_TEST_QUICK).
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactGpu, OddHeadAndLongContextMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(25);
  size_t bad = 0;
  for (int n_tok : {1, 3}) {
    bad += run_attention_case<TypeParam>(AttnCase{80, 2, n_tok, 37, 256}, rng);
  }
  bad += run_attention_case<TypeParam>(AttnCase{64, 7, 64, 100, 32768}, rng);
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 2, 7}) {
      const int n_past = quick() ? 2000 : 20000;
      bad += run_attention_case<TypeParam>(AttnCase{hd, group, 1, n_past, 32768}, rng);
    }
  }
  EXPECT_EQ(bad, 0u);
}

// attend_act: the attention output and its rounding for the next matmul, vs attend +
// quantize_act on the GPU and vs the CPU + quantize_activation; decode with the kernel's own
// cluster choice and every cluster size where the act has a fused form, a batch of 3 tokens
// (the unfused fallback).
template <class Cache>
size_t run_attend_act_case(int hd, int group, int n_tok, int n_past, GgmlType t,
                           std::mt19937& rng) {
  AttnData<Cache> a(AttnCase{hd, group, n_tok, n_past, n_past + n_tok + 40}, rng);
  const ActHost ref_act = cpu_act(t, a.ref, n_tok, a.q_dim);
  const auto at = static_cast<uint32_t>(t);
  const std::string what = "attend_act " + std::string(ggml_type_name(at)) + " " + a.name();
  ActDev au(n_tok, a.q_dim);
  ex::attend(a.dq.get(), a.dk.get(), a.dv.get(), a.dout.get(), n_tok, a.s(), a.c.n_ctx, a.dnp.get(),
             a.scratch.get(), nullptr);
  ex::quantize_act(at, a.dout.get(), n_tok, a.q_dim, au.a, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    ADD_FAILURE() << what << " unfused: " << cudaGetErrorString(cudaGetLastError());
    return 1;
  }
  const ActHost unf = gpu_act(t, au.a, n_tok, a.q_dim);
  size_t bad = act_mismatches(unf, ref_act, what + " unfused vs cpu");
  const bool fused = n_tok == 1 && act_type_of(t) != ActType::Q8_K;
  // C 0, 1, 2, 8 with the decode kernel's local mode where n_past allows it (lk -1), then
  // without (lk 0; one token only)
  for (int lk : {-1, 0}) {
    if (lk == 0 && n_tok > 1) break;
    for (int C : {0, 1, 2, 8}) {
      if (C != 0 && !fused) continue;
      if (lk == 0 && C != 0 && quick()) continue;  // compute-sanitizer time
      ActDev af(n_tok, a.q_dim);
      a.dout.poison();
      ex::set_decode_cluster_for_tests(C);
      ex::set_decode_local_keys_for_tests(lk);
      ex::attend_act(a.dq.get(), a.dk.get(), a.dv.get(), a.dout.get(), n_tok, a.s(), a.c.n_ctx,
                     a.dnp.get(), a.scratch.get(), at, af.a, nullptr);
      ex::set_decode_cluster_for_tests(0);
      ex::set_decode_local_keys_for_tests(-1);
      const std::string w = what + " C " + std::to_string(C) + " lk " + std::to_string(lk);
      if (cudaDeviceSynchronize() != cudaSuccess) {
        ADD_FAILURE() << w << ": " << cudaGetErrorString(cudaGetLastError());
        return bad + 1;
      }
      bad += mismatches(a.dout.download(), a.ref, w + " out vs cpu");
      const ActHost got = gpu_act(t, af.a, n_tok, a.q_dim);
      bad += act_mismatches(got, ref_act, w + " vs cpu");
      bad += act_mismatches(got, unf, w + " vs unfused");
    }
  }
  return bad;
}

// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactGpu, AttendActMatchesUnfusedAndCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(45);
  size_t bad = 0, cases = 0;
  for (int hd : {8, 64, 128}) {
    for (int group : {1, 7}) {
      for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                         GgmlType::Q4_0, GgmlType::Q6_K}) {
        if (!type_fits(t, 2 * group * hd)) continue;
        for (int n_past : {0, 37, 600, 1000}) {
          bad += run_attend_act_case<TypeParam>(hd, group, 1, n_past, t, rng);
          ++cases;
        }
        bad += run_attend_act_case<TypeParam>(hd, group, 3, 20, t, rng);  // the fallback
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// exact::attention (the engine's entry point) over everything it writes: q (rotated in place),
// both caches (rows other than n_past.. must keep their contents: random rows below, NaN
// above), out and the ActBuf fields of the act type; the unfused pieces (pass -1), then the
// entry point with its own cluster choice (0) and every cluster size. One token takes the
// fused decode kernel where the act has a fused form; batches and Q8_K acts the pieces.
struct RopeCase {
  int hd, group, n_rot;
  bool neox, bias;
};

template <class Cache>
size_t run_rope_case(const RopeCase& c, int n_past, int n_tok, GgmlType t, std::mt19937& rng) {
  using T = typename Cache::T;
  const int nkv = 2, nh = nkv * c.group, hd = c.hd;
  const int q_dim = nh * hd, kv_dim = nkv * hd, n_ctx = n_past + n_tok + 70;
  const float ts = rope_theta_scale(1000000.0f, c.n_rot);
  std::vector<float> table(static_cast<size_t>(n_ctx) * c.n_rot);
  rope_table(n_ctx, c.n_rot, ts, table.data());
  const auto kc = make_cache<Cache>(n_ctx, kv_dim, n_past, rng);
  const auto vc = make_cache<Cache>(n_ctx, kv_dim, n_past, rng);
  const auto q = uniform(static_cast<size_t>(n_tok) * q_dim, rng, -2.0f, 2.0f);
  const auto k = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -1.0f, 1.0f);
  const auto v = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -1.0f, 1.0f);
  const auto bq = uniform(static_cast<size_t>(q_dim), rng, -0.5f, 0.5f);
  const auto bk = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
  const auto bv = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
  // CPU: CpuEngine::eval's order (bias adds, rope, the store, attention).
  auto rq = q, rk = k, rv = v;
  for (int tk = 0; tk < n_tok; ++tk) {
    const size_t qo = static_cast<size_t>(tk) * q_dim, ko = static_cast<size_t>(tk) * kv_dim;
    if (c.bias) {
      for (int i = 0; i < q_dim; ++i) rq[qo + i] += bq[static_cast<size_t>(i)];
      for (int i = 0; i < kv_dim; ++i) rk[ko + i] += bk[static_cast<size_t>(i)];
      for (int i = 0; i < kv_dim; ++i) rv[ko + i] += bv[static_cast<size_t>(i)];
    }
    cpu::rope_row(rq.data() + qo, nh, hd, c.n_rot, c.neox, ts, n_past + tk);
    cpu::rope_row(rk.data() + ko, nkv, hd, c.n_rot, c.neox, ts, n_past + tk);
  }
  auto kref = kc, vref = vc;
  {
    const auto rk_c = Cache::store(rk), rv_c = Cache::store(rv);
    const auto off = static_cast<ptrdiff_t>(n_past) * kv_dim;
    std::copy(rk_c.begin(), rk_c.end(), kref.begin() + off);
    std::copy(rv_c.begin(), rv_c.end(), vref.begin() + off);
  }
  const auto ref = cpu_attention<Cache>(rq, Cache::values(kref), Cache::values(vref), nh, c.group,
                                        hd, kv_dim, n_past, n_tok);
  const ActHost ref_act = cpu_act(t, ref, n_tok, q_dim);
  const ex::AttnShape s = shape(nh, nkv, hd, c.n_rot, c.neox);
  DevArray<float> dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dtab(table);
  DevArray<float> scratch(ex::attention_scratch_floats(n_ctx, n_tok, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
  const auto at = static_cast<uint32_t>(t);
  const std::string what = std::string("attention ") + std::string(ggml_type_name(at)) + " hd " +
                           std::to_string(hd) + " group " + std::to_string(c.group) + " n_rot " +
                           std::to_string(c.n_rot) + (c.neox ? " neox" : " normal") +
                           (c.bias ? " bias" : "") + " n_past " + std::to_string(n_past) +
                           " n_tok " + std::to_string(n_tok);
  DevArray<float> dq(q), dout(ref.size());
  DevArray<T> dkc(kc), dvc(vc);
  ActDev af(n_tok, q_dim);
  const ex::QkvIn x{dq.get(),
                    dk.get(),
                    dv.get(),
                    c.bias ? dbq.get() : nullptr,
                    c.bias ? dbk.get() : nullptr,
                    c.bias ? dbv.get() : nullptr};
  const ex::KvCache kv{dkc.get(), dvc.get(),
                       std::is_same_v<T, float> ? ex::KvType::F32 : ex::KvType::F16};
  size_t bad = 0;
  // C -1: the unfused pieces (once); then every cluster choice with the decode kernel's local
  // mode where n_past allows it (lk -1) and without (lk 0; one token only).
  for (int lk : {-1, 0}) {
    if (lk == 0 && n_tok > 1) break;
    for (int C : {-1, 0, 1, 2, 4, 8}) {
      if (C < 0 && lk == 0) continue;              // the pieces run once
      if (n_tok > 1 && C > 0) break;               // the batch takes the pieces: no cluster
      if (lk == 0 && C != 0 && quick()) continue;  // compute-sanitizer time
      dq.upload(q);
      dkc.upload(kc);
      dvc.upload(vc);
      dout.poison();
      af.mem.poison();
      scratch.poison();
      if (C < 0) {
        ex::bias_rope_store(x, s, dtab.get(), n_tok, dnp.get(), dkc.get(), dvc.get(), nullptr);
        ex::attend(dq.get(), dkc.get(), dvc.get(), dout.get(), n_tok, s, n_ctx, dnp.get(),
                   scratch.get(), nullptr);
        ex::quantize_act(at, dout.get(), n_tok, q_dim, af.a, nullptr);
      } else {
        ex::set_decode_cluster_for_tests(C);
        ex::set_decode_local_keys_for_tests(lk);
        ex::attention(x, s, dtab.get(), n_tok, dnp.get(), kv, dout.get(), n_ctx, scratch.get(), at,
                      af.a, nullptr);
        ex::set_decode_cluster_for_tests(0);
        ex::set_decode_local_keys_for_tests(-1);
      }
      const std::string w =
          what + (C < 0 ? " unfused" : " C " + std::to_string(C) + " lk " + std::to_string(lk));
      if (cudaDeviceSynchronize() != cudaSuccess) {
        ADD_FAILURE() << w << ": " << cudaGetErrorString(cudaGetLastError());
        return bad + 1;
      }
      // vs the CPU (the unfused pass too: it is what the fused call must equal).
      bad += mismatches(dq.download(), rq, w + " q");
      bad += mismatches(dkc.download(), kref, w + " k cache");  // incl. the untouched rows
      bad += mismatches(dvc.download(), vref, w + " v cache");
      bad += mismatches(dout.download(), ref, w + " out");
      bad += act_mismatches(gpu_act(t, af.a, n_tok, q_dim), ref_act, w + " act");
    }
  }
  return bad;
}

// The first case is the 0.5B model's attention (14 heads of 64, 2 KV heads, neox, biases);
// n_past 4000: a nearly full 4096-token context (timings: bench/kernel_bench).
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactGpu, RopeAttentionActMatchesUnfusedAndCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(46);
  size_t bad = 0, cases = 0;
  for (const RopeCase c : {RopeCase{64, 7, 64, true, true}, RopeCase{64, 1, 64, false, false},
                           RopeCase{64, 2, 32, true, true}, RopeCase{128, 2, 64, true, false},
                           RopeCase{128, 2, 64, false, true}, RopeCase{128, 7, 128, false, true},
                           RopeCase{128, 7, 128, true, false}, RopeCase{8, 2, 8, true, true},
                           RopeCase{8, 1, 8, false, false}}) {
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                       GgmlType::Q6_K}) {
      if (!type_fits(t, 2 * c.group * c.hd)) continue;
      // 300 / 700: local mode with 2 / 3 chunks of staged key rows (FP16 cache, head_dim 64)
      for (int n_past : {0, 1, 37, 63, 64, 300, 700, 1000, 4000}) {
        if (quick() && n_past != 1 && n_past != 300) continue;  // compute-sanitizer time
        bad += run_rope_case<TypeParam>(c, n_past, 1, t, rng);
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// n_tok > 1: the pieces (tinyBLAS orders where they apply), same checks.
// REQ: M0-W-1201 WRK-D15
TYPED_TEST(AttentionExactGpu, RopeAttentionBatchMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(917);
  size_t bad = 0;
  for (const RopeCase c : {RopeCase{64, 7, 64, true, true}, RopeCase{8, 2, 8, false, false}}) {
    for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0}) {
      if (!type_fits(t, 2 * c.group * c.hd)) continue;
      bad += run_rope_case<TypeParam>(c, 37, 3, t, rng);
      bad += run_rope_case<TypeParam>(c, 0, 5, t, rng);
    }
  }
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace worker
