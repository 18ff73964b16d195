// The CPU reference's FP16 KV cache mode (CpuEngineOptions::kv_f16, llama.cpp's default cache
// type): cpu::attention_head_f16 against an independent, straightforward re-statement of
// llama.cpp's F16 attention (written here from ggml's source: fp16 rounding by scaling,
// explicit 16-lane / 64-lane chains, double leftovers), the engine's attention output against
// that re-statement from the engine's own q/k/v checkpoints, and the F32 mode unchanged.
// Bit-identity with llama.cpp itself is measured with worker/engine/cpu/tools/llama_dump.cpp
// (reports/cpu-parity.md, "F16 KV cache").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <vector>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "common/test_helpers.h"
#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/cpu/cpu_ops.h"
#include "gguf/ggml_types.h"

namespace worker {
namespace {

using test::bits;

#if defined(__x86_64__) && defined(__GNUC__)
// The F16C round trip llama.cpp's ggml_cpu_fp32_to_fp16 runs (_MM_FROUND_TO_NEAREST_INT).
__attribute__((target("f16c"))) float f16c_round(float x) {
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
#endif

// Round to the nearest fp16 value, ties to even, by scaling: the fp16 quantum at x's binade
// (2^(e-10), at least 2^-24 for subnormals) divides x exactly, nearbyint rounds half to even.
// (No overflow handling: the test values stay far below 65504.)
float ref_f16(float x) {
  if (x == 0.0f) return x;
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int qexp = std::max(e - 1 - 10, -24);
  const double q = std::ldexp(1.0, qexp);
  return static_cast<float>(std::nearbyint(static_cast<double>(x) / q) * q);
}

// _mm512_reduce_add_ps as GCC expands it: 16 -> 8 -> 4 -> 2 -> 1, upper half + lower half.
float ref_hsum16(const float* v) {
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = v[8 + i] + v[i];
  for (int i = 0; i < 4; ++i) b[i] = a[4 + i] + a[i];
  const float c0 = b[2] + b[0], c1 = b[3] + b[1];
  return c1 + c0;
}

// llamafile tinyBLAS<16, __m512> on F16 x F16: lane l sums products i = l (mod 16) by FMA.
float ref_tinyblas(const float* a, const float* b, int64_t k) {
  float lane[16] = {};
  for (int64_t i = 0; i < k; ++i) lane[i % 16] = std::fma(a[i], b[i], lane[i % 16]);
  return ref_hsum16(lane);
}

// ggml_vec_dot_f16 (AVX-512): 4 x 16 lanes over the first n & ~63 elements, reduced
// (x0 + x2) + (x1 + x3), hsum, then each leftover product (rounded to float) added in double.
float ref_vec_dot_f16(const float* x, const float* y, int64_t n) {
  const int64_t np = n & ~int64_t{63};
  float lane[64] = {};
  for (int64_t i = 0; i < np; ++i) lane[i % 64] = std::fma(x[i], y[i], lane[i % 64]);
  float r[16];
  for (int l = 0; l < 16; ++l) r[l] = (lane[l] + lane[32 + l]) + (lane[16 + l] + lane[48 + l]);
  double s = ref_hsum16(r);
  for (int64_t i = np; i < n; ++i) s += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(s);
}

// llama.cpp's attention of one query row over an F16 cache (no flash attention), written out
// from build_attn_mha: kq = mul_mat(K, q) with q converted to F16, soft_max_ext (scale, max,
// ggml_expf per 16-block, block sums in double, * 1/sum), kqv = mul_mat(V^T, kq) with the
// probabilities converted to F16; each mul_mat by tinyBLAS when the batch has >= 2 tokens and
// its k is a multiple of 16 (its m, the 256-cell window or head_dim, a multiple of 4), else
// by vec_dot_f16 over k (the window: 256 cells, zero beyond the attended keys).
std::vector<float> ref_attention(const std::vector<float>& q, const std::vector<float>& K,
                                 const std::vector<float>& V, int64_t hd, int64_t n_att,
                                 int64_t n_tok) {
  const int64_t window = 256 * ((n_att + 255) / 256);
  std::vector<float> q16(static_cast<size_t>(hd));
  for (int64_t d = 0; d < hd; ++d) q16[d] = ref_f16(q[d]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> p(static_cast<size_t>(window), 0.0f);
  float mx = -INFINITY;
  for (int64_t j = 0; j < n_att; ++j) {
    const float* kj = K.data() + j * hd;
    const float s = (n_tok >= 2 && hd % 16 == 0) ? ref_tinyblas(kj, q16.data(), hd)
                                                 : ref_vec_dot_f16(kj, q16.data(), hd);
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < window; j0 += 16) {
    for (int64_t j = j0; j < j0 + 16; ++j) p[j] = j < n_att ? cpu::ggml_expf(p[j] - mx) : 0.0f;
    sum += static_cast<double>(ref_hsum16(p.data() + j0));
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (auto& x : p) x = ref_f16(x * inv);
  std::vector<float> out(static_cast<size_t>(hd)), col(static_cast<size_t>(window), 0.0f);
  for (int64_t d = 0; d < hd; ++d) {
    for (int64_t j = 0; j < n_att; ++j) col[j] = V[j * hd + d];
    out[d] = (n_tok >= 2 && hd % 4 == 0) ? ref_tinyblas(col.data(), p.data(), window)
                                         : ref_vec_dot_f16(col.data(), p.data(), window);
  }
  return out;
}

// The library's fp32 -> fp16 (the cache store) rounds as the independent scaling does, over
// normal and subnormal fp16 ranges and at exact ties; and as the F16C instruction llama.cpp
// uses where the CPU has it.
TEST(EngineCpuKv16, Fp16RoundingMatchesIndependentAndHardware) {
  std::mt19937 rng(61);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-30, 14);  // below 2^15: no overflow
  int64_t checked = 0;
  for (int i = 0; i < 200000; ++i) {
    float x = std::ldexp(mant(rng), ex(rng)) * ((i & 1) ? -1.0f : 1.0f);
    if (i % 5 == 0) {  // an exact tie: an fp16 value plus half its quantum
      const float h = fp16_to_fp32(fp32_to_fp16(x));
      int e;
      std::frexp(h, &e);
      x = h + std::ldexp(1.0f, std::max(e - 11, -24) - 1) * (h < 0 ? -1.0f : 1.0f);
    }
    const float lib = fp16_to_fp32(fp32_to_fp16(x));
    ASSERT_EQ(bits(lib), bits(ref_f16(x))) << std::hexfloat << x;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("f16c")) {
      const float hw = f16c_round(x);
      ASSERT_EQ(bits(lib), bits(hw)) << std::hexfloat << x;
    }
#endif
    ++checked;
  }
  EXPECT_EQ(checked, 200000);
}

// attention_head_f16 equals the re-statement bit for bit for head sizes taking every path
// (KQ: tinyBLAS for hd % 16 == 0 in a batch, vec_dot_f16 with and without 64-chains and double
// leftovers; KQV: tinyBLAS or vec_dot_f16), short and long contexts, one and many tokens.
// REQ: M0-W-1201
TEST(EngineCpuKv16, AttentionHeadF16MatchesRestatement) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t mismatches = 0, cases = 0;
  for (int64_t hd : {8, 12, 64, 80, 128}) {
    for (int64_t n_att : {1, 2, 15, 17, 64, 100, 300}) {
      for (int64_t n_tok : {1, 5}) {
        std::vector<float> q(static_cast<size_t>(hd)), K(static_cast<size_t>(n_att * hd)),
            V(static_cast<size_t>(n_att * hd));
        for (auto& x : q) x = 2.0f * nd(rng);
        for (auto& x : K) x = ref_f16(nd(rng));  // as stored in the cache
        for (auto& x : V) x = ref_f16(nd(rng));
        const int64_t cap = (n_att + 63) & ~int64_t{63};
        std::vector<float> q16(static_cast<size_t>(hd)), sc(static_cast<size_t>(cap)),
            col(static_cast<size_t>(cap)), out(static_cast<size_t>(hd));
        cpu::attention_head_f16(q.data(), K.data(), V.data(), hd, hd, n_att, cap,
                                cpu::kq16_tiny(hd, n_tok), cpu::kqv16_tiny(hd, n_tok),
                                1.0f / std::sqrt(static_cast<float>(hd)), q16.data(), sc.data(),
                                col.data(), out.data());
        const auto want = ref_attention(q, K, V, hd, n_att, n_tok);
        for (int64_t d = 0; d < hd; ++d) {
          if (bits(out[d]) != bits(want[d])) {
            if (++mismatches <= 5) {
              ADD_FAILURE() << "hd " << hd << " n_att " << n_att << " n_tok " << n_tok << " d " << d
                            << ": " << std::hexfloat << out[d] << " vs " << want[d];
            }
          }
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(cases, 70);
}

// The F16 mode really computes something else than the F32 one (q and p rounded, other
// orders), but close to it: the F32 function on the same fp16-valued cache differs by at most
// fp16 rounding-sized amounts.
TEST(EngineCpuKv16, F16DiffersFromF32OnlyByRounding) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t hd = 64, n_att = 40, cap = 64;
  std::vector<float> q(hd), K(n_att * hd), V(n_att * hd);
  for (auto& x : q) x = nd(rng);
  for (auto& x : K) x = ref_f16(nd(rng));
  for (auto& x : V) x = ref_f16(nd(rng));
  std::vector<float> q16(hd), sc(cap), col(cap), o16(hd), o32(hd);
  const float scale = 0.125f;
  cpu::attention_head_f16(q.data(), K.data(), V.data(), hd, hd, n_att, cap, true, true, scale,
                          q16.data(), sc.data(), col.data(), o16.data());
  cpu::attention_head(q.data(), K.data(), V.data(), hd, hd, n_att, cap, true, scale, sc.data(),
                      col.data(), o32.data());
  int differ = 0;
  for (int64_t d = 0; d < hd; ++d) {
    differ += bits(o16[d]) != bits(o32[d]);
    EXPECT_NEAR(o16[d], o32[d], 5e-3f) << d;
  }
  EXPECT_GT(differ, hd / 2);
}

std::shared_ptr<const Model> load_or_fail(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "missing fixture " << path
                  << " (set WORKER_SHARED_FIXTURES / run fixtures/generate_all.sh)";
    return nullptr;
  }
  return load_model(path);
}

// The engine's F16 mode: every layer's attention output (prompt batch, then decode steps) is
// the re-statement's attention of the engine's own q, k, v checkpoints with K and V rounded to
// fp16, bit for bit, on stories260K (head_dim 8: vec_dot_f16 with double leftovers for KQ) and a
// qwen2 fixture (head_dim 64, GQA 2: tinyBLAS KQ in the prompt).
// REQ: M0-W-1201
TEST(EngineCpuKv16, EngineAttentionMatchesRestatementFromCheckpoints) {
  const std::vector<std::string> paths = {test::shared_fixtures() + "/stories260K.gguf",
                                          test::generated_fixtures() + "/qwen2-g2-q8_0.gguf"};
  for (const auto& path : paths) {
    auto model = load_or_fail(path);
    ASSERT_TRUE(model);
    const auto& cfg = model->config;
    const int64_t hd = cfg.head_dim, nh = cfg.n_head, nkv = cfg.n_head_kv;
    // [layer][pos] -> values
    std::map<std::pair<int, int32_t>, std::vector<float>> qs, ks, vs, att;
    CpuEngineOptions opt;
    opt.kv_f16 = true;
    auto e = make_cpu_engine(
        model, 64,
        [&](std::string_view name, int layer, int32_t pos, std::span<const float> v) {
          auto* m = name == "q"          ? &qs
                    : name == "k"        ? &ks
                    : name == "v"        ? &vs
                    : name == "attn_out" ? &att
                                         : nullptr;
          if (m != nullptr) (*m)[{layer, pos}].assign(v.begin(), v.end());
        },
        opt);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back(3 + (i * 37) % 400);
    e->eval(prompt);
    const int32_t n_prompt = static_cast<int32_t>(prompt.size());
    for (int32_t step = 0; step < 3; ++step) {
      const int32_t tok = 5 + step;
      e->eval(std::span<const int32_t>(&tok, 1));
    }
    int64_t mismatches = 0, checked = 0;
    for (int layer = 0; layer < static_cast<int>(cfg.n_layer); ++layer) {
      for (int32_t pos = 0; pos < n_prompt + 3; ++pos) {
        const int64_t n_tok = pos < n_prompt ? n_prompt : 1;
        const auto& q = qs.at({layer, pos});
        const auto& a = att.at({layer, pos});
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t g = h / (nh / nkv);
          std::vector<float> K, V;
          for (int32_t j = 0; j <= pos; ++j) {
            const auto& kj = ks.at({layer, j});
            const auto& vj = vs.at({layer, j});
            for (int64_t d = 0; d < hd; ++d) {
              K.push_back(ref_f16(kj[g * hd + d]));
              V.push_back(ref_f16(vj[g * hd + d]));
            }
          }
          const std::vector<float> qh(q.begin() + h * hd, q.begin() + (h + 1) * hd);
          const auto want = ref_attention(qh, K, V, hd, pos + 1, n_tok);
          for (int64_t d = 0; d < hd; ++d) {
            ++checked;
            if (bits(a[h * hd + d]) != bits(want[d]) && ++mismatches <= 5) {
              ADD_FAILURE() << path << " layer " << layer << " pos " << pos << " head " << h
                            << " d " << d << ": " << std::hexfloat << a[h * hd + d] << " vs "
                            << want[d];
            }
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << path;
    EXPECT_EQ(checked, cfg.n_layer * (n_prompt + 3) * nh * hd) << path;
  }
}

// The F32 mode is unchanged by the option: the default engine and kv_f16 = false give the same
// logits bit for bit, and the F16 mode's differ from them (slightly) on the same tokens.
// REQ: M0-W-1201
TEST(EngineCpuKv16, F32ModeUnchangedAndF16ModeDiffers) {
  auto model = load_or_fail(test::generated_fixtures() + "/llama-g7-f16.gguf");
  ASSERT_TRUE(model);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 17; ++i) prompt.push_back(3 + (i * 53) % 500);
  CpuEngineOptions f32, f16;
  f16.kv_f16 = true;
  auto a = make_cpu_engine(model, 64);
  auto b = make_cpu_engine(model, 64, nullptr, f32);
  auto c = make_cpu_engine(model, 64, nullptr, f16);
  for (auto* e : {a.get(), b.get(), c.get()}) e->eval(prompt, true);
  int64_t same_ab = 0, differ_ac = 0, n = 0;
  double max_ac = 0.0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    const auto la = a->logits_at(t), lb = b->logits_at(t), lc = c->logits_at(t);
    for (size_t i = 0; i < la.size(); ++i) {
      same_ab += bits(la[i]) == bits(lb[i]);
      differ_ac += bits(la[i]) != bits(lc[i]);
      max_ac = std::max(max_ac, static_cast<double>(std::fabs(la[i] - lc[i])));
      ++n;
    }
  }
  EXPECT_EQ(same_ab, n);
  EXPECT_GT(differ_ac, n / 2);
  EXPECT_LT(max_ac, 0.1);
}

}  // namespace
}  // namespace worker
