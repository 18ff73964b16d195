// rope_attention_act_f16 (kernels/exact_attn16_fused.cu, exact_fused.cuh) bit for bit against
//  (a) the unfused exact sequence on the GPU (bias_rope_store_f16, attention_f16, quantize_act),
//  (b) the CPU reference's F16-KV mode (bias adds, cpu::rope_row, fp32_to_fp16 cache store,
//      cpu::attention_head_f16, cpu::quantize_activation),
// over everything it writes: q (rotated in place), both fp16 caches (rows other than n_past must
// keep their contents: rows below hold random fp16 keys / values, rows above fp16 NaN), out and
// the ActBuf fields of the act type. Every cluster size of the decode kernel; batches (n_tok > 1)
// and Q8_K acts take the unfused fallback. GPU only (skipped as "not run" without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"
#include "exact.cuh"
#include "exact_fused.cuh"
#include "gguf/ggml_types.h"
// gpu_test_util.h's error metrics promote floats to double (unused here).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "gpu_test_util.h"
#pragma GCC diagnostic pop

namespace worker {
namespace {

namespace ex = kern::exact;
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
  if (got.size() != ref.size()) {
    ADD_FAILURE() << what << ": sizes differ";
    return 1;
  }
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

enum class Kind { F, Q8_0, Q8_K };
Kind kind_of(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: return Kind::Q8_0;
    case GgmlType::Q4_K:
    case GgmlType::Q6_K: return Kind::Q8_K;
    default: return Kind::F;
  }
}
bool type_fits(GgmlType t, int n) {
  const Kind k = kind_of(t);
  return k == Kind::F || (k == Kind::Q8_0 && n % 32 == 0) || (k == Kind::Q8_K && n % 256 == 0);
}

// The fields quantize_act writes for `t` (one row of n), as host vectors.
struct ActHost {
  std::vector<float> f;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bsum;
};

ActHost cpu_act(GgmlType t, const std::vector<float>& x, int n) {
  ActHost h;
  cpu::QuantizedActivation qa;
  cpu::quantize_activation(t, x.data(), n, qa);
  h.f = qa.f;
  h.q = qa.q;
  h.d = qa.d;
  h.bsum = qa.bsum;
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

ActHost gpu_act(GgmlType t, const ex::ActBuf& a, int n) {
  ActHost h;
  const size_t total = static_cast<size_t>(n);
  switch (kind_of(t)) {
    case Kind::F: h.f = dl(a.f, total); break;
    case Kind::Q8_0:
      h.q = dl(a.q, total);
      h.d = dl(a.d, total / 32);
      break;
    case Kind::Q8_K:
      h.q = dl(a.q, total);
      h.d = dl(a.d, total / 256);
      h.bsum = dl(a.bsum, total / 16);
      break;
  }
  return h;
}

size_t act_mismatches(const ActHost& got, const ActHost& ref, const std::string& what) {
  if (got.f.size() != ref.f.size() || got.q.size() != ref.q.size() ||
      got.d.size() != ref.d.size() || got.bsum.size() != ref.bsum.size()) {
    ADD_FAILURE() << what << ": field sizes differ";
    return 1;
  }
  size_t bad = 0;
  bad += mismatches(got.f, ref.f, what + " f");
  bad += mismatches(got.q, ref.q, what + " q");
  bad += mismatches(got.d, ref.d, what + " d");
  bad += mismatches(got.bsum, ref.bsum, what + " bsum");
  return bad;
}

struct ActDev {
  DevArray<uint8_t> mem;
  ex::ActBuf a;
  ActDev(int rows, int n) : mem(ex::act_buffer_bytes(rows, n)) {
    a = ex::act_buffer_at(mem.get(), rows, n);
  }
};

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

struct RopeCase {
  int hd, group, n_rot;
  bool neox, bias;
};

constexpr uint16_t kF16NaN = 0x7E00;

// One token (decode; n_tok == 1 takes the fused kernel) or a batch (the fallback), checked
// against the CPU (the batch's CPU check covers its last token's position range too: every
// token's row). Returns the number of mismatching elements.
size_t run_case(const RopeCase& c, int n_past, int n_tok, GgmlType t, std::mt19937& rng) {
  const int nkv = 2, nh = nkv * c.group, hd = c.hd;
  const int q_dim = nh * hd, kv_dim = nkv * hd, n_ctx = n_past + n_tok + 70;
  const float ts = cpu::rope_theta_scale(1000000.0f, c.n_rot);
  std::vector<float> table(static_cast<size_t>(n_ctx) * c.n_rot);
  ex::rope_table_host(n_ctx, c.n_rot, ts, table.data());
  // Caches: random fp16 rows below n_past, fp16 NaN above (never read, must stay untouched).
  std::vector<uint16_t> kc(static_cast<size_t>(n_ctx) * kv_dim, kF16NaN);
  std::vector<uint16_t> vc = kc;
  {
    const auto kr = to_f16(uniform(static_cast<size_t>(n_past) * kv_dim, rng, -1.0f, 1.0f));
    const auto vr = to_f16(uniform(static_cast<size_t>(n_past) * kv_dim, rng, -1.0f, 1.0f));
    std::copy(kr.begin(), kr.end(), kc.begin());
    std::copy(vr.begin(), vr.end(), vc.begin());
  }
  const auto q = uniform(static_cast<size_t>(n_tok) * q_dim, rng, -2.0f, 2.0f);
  const auto k = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -1.0f, 1.0f);
  const auto v = uniform(static_cast<size_t>(n_tok) * kv_dim, rng, -1.0f, 1.0f);
  const auto bq = uniform(static_cast<size_t>(q_dim), rng, -0.5f, 0.5f);
  const auto bk = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
  const auto bv = uniform(static_cast<size_t>(kv_dim), rng, -0.5f, 0.5f);
  // CPU: CpuEngine::eval's order in the F16-KV mode.
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
    const auto rk16 = to_f16(rk), rv16 = to_f16(rv);
    std::copy(rk16.begin(), rk16.end(), kref.begin() + static_cast<size_t>(n_past) * kv_dim);
    std::copy(rv16.begin(), rv16.end(), vref.begin() + static_cast<size_t>(n_past) * kv_dim);
  }
  const auto kf = from_f16(kref), vf = from_f16(vref);
  const int cap = (n_past + n_tok + 63) & ~63;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(n_tok) * q_dim);
  std::vector<float> q16(static_cast<size_t>(hd)), sc(static_cast<size_t>(cap)),
      col(static_cast<size_t>(cap));
  for (int tk = 0; tk < n_tok; ++tk) {
    for (int h = 0; h < nh; ++h) {
      const int g = h / c.group;
      const size_t o = static_cast<size_t>(tk) * q_dim + static_cast<size_t>(h) * hd;
      cpu::attention_head_f16(rq.data() + o, kf.data() + g * hd, vf.data() + g * hd, kv_dim, hd,
                              n_past + tk + 1, cap, cpu::kq16_tiny(hd, n_tok),
                              cpu::kqv16_tiny(hd, n_tok), kq_scale, q16.data(), sc.data(),
                              col.data(), ref.data() + o);
    }
  }
  ActHost ref_act;
  for (int tk = 0; tk < n_tok; ++tk) {
    const std::vector<float> row(ref.begin() + static_cast<ptrdiff_t>(tk) * q_dim,
                                 ref.begin() + static_cast<ptrdiff_t>(tk + 1) * q_dim);
    const ActHost a = cpu_act(t, row, q_dim);
    ref_act.f.insert(ref_act.f.end(), a.f.begin(), a.f.end());
    ref_act.q.insert(ref_act.q.end(), a.q.begin(), a.q.end());
    ref_act.d.insert(ref_act.d.end(), a.d.begin(), a.d.end());
    ref_act.bsum.insert(ref_act.bsum.end(), a.bsum.begin(), a.bsum.end());
  }
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = c.n_rot;
  s.neox = c.neox;
  DevArray<float> dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dtab(table);
  DevArray<float> scratch(ex::attention_f16_scratch_floats(n_ctx, n_tok, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
  const std::string what = std::string("rope_attention_act_f16 ") +
                           std::string(ggml_type_name(static_cast<uint32_t>(t))) + " hd " +
                           std::to_string(hd) + " group " + std::to_string(c.group) + " n_rot " +
                           std::to_string(c.n_rot) + (c.neox ? " neox" : " normal") +
                           (c.bias ? " bias" : "") + " n_past " + std::to_string(n_past) +
                           " n_tok " + std::to_string(n_tok);
  DevArray<float> dq(q), dout(ref.size());
  DevArray<uint16_t> dkc(kc), dvc(vc);
  ActDev af(n_tok, q_dim);
  auto get_act = [&]() {
    ActHost h;
    const size_t total = ref.size();
    switch (kind_of(t)) {
      case Kind::F: h.f = dl(af.a.f, total); break;
      case Kind::Q8_0:
        h.q = dl(af.a.q, total);
        h.d = dl(af.a.d, total / 32);
        break;
      case Kind::Q8_K:
        h.q = dl(af.a.q, total);
        h.d = dl(af.a.d, total / 256);
        h.bsum = dl(af.a.bsum, total / 16);
        break;
    }
    return h;
  };
  size_t bad = 0;
  // Pass -1: the unfused sequence; then the fused call with each cluster size (0: its own).
  for (int C : {-1, 0, 1, 2, 4, 8}) {
    if (n_tok > 1 && C > 0) break;  // the batch fallback has no cluster
    dq.upload(q);
    dkc.upload(kc);
    dvc.upload(vc);
    dout.poison();
    af.mem.poison();
    scratch.poison();
    if (C < 0) {
      ex::bias_rope_store_f16(dq.get(), dk.get(), dv.get(), c.bias ? dbq.get() : nullptr,
                              c.bias ? dbk.get() : nullptr, c.bias ? dbv.get() : nullptr, s,
                              dtab.get(), n_tok, dnp.get(), dkc.get(), dvc.get(), nullptr);
      ex::attention_f16(dq.get(), dkc.get(), dvc.get(), dout.get(), n_tok, s, n_ctx, dnp.get(),
                        scratch.get(), nullptr);
      ex::quantize_act(static_cast<uint32_t>(t), dout.get(), n_tok, q_dim, af.a, nullptr);
    } else {
      ex::attn16::set_fused_cluster_for_tests(C);
      ex::rope_attention_act_f16(dq.get(), dk.get(), dv.get(), c.bias ? dbq.get() : nullptr,
                                 c.bias ? dbk.get() : nullptr, c.bias ? dbv.get() : nullptr, s,
                                 dtab.get(), n_tok, dnp.get(), dkc.get(), dvc.get(), dout.get(),
                                 n_ctx, scratch.get(), static_cast<uint32_t>(t), af.a, nullptr);
      ex::attn16::set_fused_cluster_for_tests(0);
    }
    const std::string w = what + (C < 0 ? " unfused" : " C " + std::to_string(C));
    if (cudaDeviceSynchronize() != cudaSuccess) {
      ADD_FAILURE() << w << ": " << cudaGetErrorString(cudaGetLastError());
      return bad + 1;
    }
    // vs the CPU (the unfused pass too: it is what the fused call must equal).
    bad += mismatches(dq.download(), rq, w + " q");
    bad += mismatches(dkc.download(), kref, w + " k cache");  // incl. the untouched rows
    bad += mismatches(dvc.download(), vref, w + " v cache");
    bad += mismatches(dout.download(), ref, w + " out");
    bad += act_mismatches(get_act(), ref_act, w + " act");
  }
  return bad;
}

// REQ: WRK-D15 M0-W-1201
TEST(ExactAttn16FusedGpu, RopeAttentionActF16MatchesUnfusedAndCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(916);
  // WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh's compute-sanitizer racecheck run): n_past 1, 37.
  const bool quick = std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
  size_t bad = 0, cases = 0;
  for (const RopeCase c : {RopeCase{64, 7, 64, true, true}, RopeCase{64, 1, 64, false, false},
                           RopeCase{64, 2, 32, true, true}, RopeCase{128, 2, 64, false, true},
                           RopeCase{128, 7, 128, true, false}, RopeCase{8, 2, 8, true, true},
                           RopeCase{8, 1, 8, false, false}}) {
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                       GgmlType::Q6_K}) {
      if (!type_fits(t, 2 * c.group * c.hd)) continue;
      for (int n_past : {0, 1, 37, 1000}) {
        if (quick && (n_past == 0 || n_past == 1000)) continue;
        bad += run_case(c, n_past, 1, t, rng);
        ++cases;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "over " << cases << " cases";
}

// n_tok > 1: the unfused fallback (tinyBLAS orders where they apply), same checks.
// REQ: WRK-D15 M0-W-1201
TEST(ExactAttn16FusedGpu, BatchFallbackMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(917);
  size_t bad = 0;
  for (const RopeCase c : {RopeCase{64, 7, 64, true, true}, RopeCase{8, 2, 8, false, false}}) {
    for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0}) {
      if (!type_fits(t, 2 * c.group * c.hd)) continue;
      bad += run_case(c, 37, 3, t, rng);
      bad += run_case(c, 0, 5, t, rng);
    }
  }
  EXPECT_EQ(bad, 0u);
}

// The 0.5B model's attention at decode (14 heads of 64, 2 KV heads, neox, biases, n_past 1000):
// us per call of the unfused sequence and of the fused call, each captured N times in a CUDA
// graph, printed; results equal bit for bit.
// REQ: WRK-D15
TEST(ExactAttn16FusedGpu, DecodeTimingAt05BShape) {
  REQUIRE_GPU();
  const int reps = std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr ? 1 : 50;
  std::mt19937 rng(918);
  const int nh = 14, nkv = 2, hd = 64, n_past = 1000, n_ctx = 2048;
  const int q_dim = nh * hd, kv_dim = nkv * hd;
  const auto cache = to_f16(uniform(static_cast<size_t>(n_ctx) * kv_dim, rng, -1.0f, 1.0f));
  const auto q = uniform(static_cast<size_t>(q_dim), rng, -2.0f, 2.0f);
  const auto kv = uniform(static_cast<size_t>(kv_dim), rng, -1.0f, 1.0f);
  const auto bias = uniform(static_cast<size_t>(q_dim), rng, -0.5f, 0.5f);
  const float ts = cpu::rope_theta_scale(1000000.0f, hd);
  std::vector<float> table(static_cast<size_t>(n_ctx) * hd);
  ex::rope_table_host(n_ctx, hd, ts, table.data());
  DevArray<uint16_t> dkc1(cache), dvc1(cache), dkc2(cache), dvc2(cache);
  DevArray<float> dq1(q), dq2(q), dk(kv), dv(kv), db(bias), dtab(table);
  DevArray<float> dout1(q.size()), dout2(q.size());
  DevArray<float> scratch(ex::attention_f16_scratch_floats(n_ctx, 1, nh));
  DevArray<int32_t> dnp(std::vector<int32_t>{n_past});
  ex::AttnShape s;
  s.n_head = nh;
  s.n_head_kv = nkv;
  s.head_dim = hd;
  s.n_rot = hd;
  s.neox = true;
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  auto time_us = [&](auto&& body) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1.0;
    for (int i = 0; i < reps; ++i) body();
    if (cudaStreamEndCapture(st, &g) != cudaSuccess) return -1.0;
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) return -1.0;
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
    return ok ? 1000.0 * static_cast<double>(ms) / reps : -1.0;
  };
  size_t bad = 0;
  for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0}) {
    const auto at = static_cast<uint32_t>(t);
    const std::string tn(ggml_type_name(at));
    ActDev a1(1, q_dim), a2(1, q_dim);
    dq1.upload(q);
    dq2.upload(q);
    // The rotation of q repeats in place in both variants (the same floats each time).
    const double att = time_us([&] {
      ex::attention_f16(dq1.get(), dkc1.get(), dvc1.get(), dout1.get(), 1, s, n_ctx, dnp.get(),
                        scratch.get(), st);
    });
    const double un = time_us([&] {
      ex::bias_rope_store_f16(dq1.get(), dk.get(), dv.get(), db.get(), db.get(), db.get(), s,
                              dtab.get(), 1, dnp.get(), dkc1.get(), dvc1.get(), st);
      ex::attention_f16(dq1.get(), dkc1.get(), dvc1.get(), dout1.get(), 1, s, n_ctx, dnp.get(),
                        scratch.get(), st);
      ex::quantize_act(at, dout1.get(), 1, q_dim, a1.a, st);
    });
    const double fu = time_us([&] {
      ex::rope_attention_act_f16(dq2.get(), dk.get(), dv.get(), db.get(), db.get(), db.get(), s,
                                 dtab.get(), 1, dnp.get(), dkc2.get(), dvc2.get(), dout2.get(),
                                 n_ctx, scratch.get(), at, a2.a, st);
    });
    bad += mismatches(dout2.download(), dout1.download(), tn + " timing out");
    bad += mismatches(dq2.download(), dq1.download(), tn + " timing q");
    bad += mismatches(dkc2.download(), dkc1.download(), tn + " timing k cache");
    bad += mismatches(dvc2.download(), dvc1.download(), tn + " timing v cache");
    bad += act_mismatches(gpu_act(t, a2.a, q_dim), gpu_act(t, a1.a, q_dim), tn + " timing act");
    std::printf(
        "0.5B attention shape, n_past %d, act %s, us per call in a graph: attention_f16 alone "
        "%.2f; bias_rope_store_f16+attention_f16+quantize_act %.2f -> rope_attention_act_f16 "
        "%.2f\n",
        n_past, tn.c_str(), att, un, fu);
    EXPECT_GT(fu, 0.0);
    EXPECT_GT(un, 0.0);
  }
  cudaStreamDestroy(st);
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace worker
