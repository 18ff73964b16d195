// The CPU engine's llama.cpp-style matmul inputs: integer block dots must equal the dot of
// the dequantized weight row (worker/gguf's dequantizers, checked against llama.cpp there)
// with the dequantized activation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/act_quant.h"

namespace worker::cpu {
namespace {

// Random block bytes with sane fp16 scales at the given offsets (random bits could be NaN).
std::vector<uint8_t> random_row(GgmlType t, int64_t n, std::mt19937& g) {
  const size_t bytes = ggml_row_bytes(t, n);
  std::vector<uint8_t> row(bytes);
  for (auto& b : row) b = static_cast<uint8_t>(g());
  size_t block = 0;
  std::vector<size_t> scale_offsets;
  switch (t) {
    case GgmlType::Q8_0: block = 34, scale_offsets = {0}; break;
    case GgmlType::Q4_0: block = 18, scale_offsets = {0}; break;
    case GgmlType::Q5_0: block = 22, scale_offsets = {0}; break;
    case GgmlType::Q4_K: block = 144, scale_offsets = {0, 2}; break;
    case GgmlType::Q6_K: block = 210, scale_offsets = {208}; break;
    default: break;
  }
  std::uniform_real_distribution<float> u(0.001f, 0.05f);
  for (size_t b = 0; b < bytes / block; ++b) {
    for (size_t off : scale_offsets) {
      const uint16_t h = fp32_to_fp16(u(g));
      std::memcpy(row.data() + b * block + off, &h, 2);
    }
  }
  return row;
}

// REQ: M0-W-1214 WRK-D2
TEST(EngineActQuant, IntegerBlockDotsEqualDequantizedDot) {
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 512;
  for (GgmlType t :
       {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(std::string(ggml_type_name(static_cast<uint32_t>(t))));
    for (int trial = 0; trial < 20; ++trial) {
      const auto row = random_row(t, n, g);
      std::vector<float> x(n);
      for (auto& v : x) v = nd(g);
      QuantizedActivation a;
      quantize_activation(t, x.data(), n, a);
      std::vector<float> w(n), scratch(n);
      dequantize_row(t, row.data(), w.data(), n);
      const bool k = t == GgmlType::Q4_K || t == GgmlType::Q6_K;
      const int64_t blk = k ? 256 : 32;
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double xa = static_cast<double>(a.q[static_cast<size_t>(i)]) *
                          static_cast<double>(a.d[static_cast<size_t>(i / blk)]);
        ref += static_cast<double>(w[static_cast<size_t>(i)]) * xa;
        mag += std::abs(static_cast<double>(w[static_cast<size_t>(i)]) * xa);
      }
      // every summation order (plain vec_dot lanes; the repacked-weight gemv and gemm orders
      // for the types llama.cpp repacks on x86) is the same sum up to float rounding
      for (int order = 0; order < 3; ++order) {
        a.repacked = order > 0;
        a.repack_gemm = order == 2;
        const double got = static_cast<double>(dot_quantized(t, row.data(), a, scratch.data()));
        ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-6) << "order " << order;
      }
    }
  }
}

// The float orders of llama.cpp's kernels (act_quant.h) are sums of the same products: each
// must equal the exact dot to float rounding, at lengths with and without leftovers. (A
// miscompiled lane loop, as GCC 12 produced once for the stride-2 BF16 form, fails here.)
// REQ: M0-W-1214 WRK-D2
TEST(EngineActQuant, LlamaCppOrderDotsEqualExactDot) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {16, 64, 96, 256, 896, 1000}) {
    SCOPED_TRACE(n);
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (auto& v : x) v = bf16_to_fp32(fp32_to_bf16(nd(g)));
    for (auto& v : y) v = bf16_to_fp32(fp32_to_bf16(nd(g)));
    double ref = 0, mag = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ref += static_cast<double>(x[i]) * static_cast<double>(y[i]);
      mag += std::abs(static_cast<double>(x[i]) * static_cast<double>(y[i]));
    }
    const double tol = 1e-6 * mag;
    EXPECT_NEAR(dot_vecdot(x.data(), y.data(), n), ref, tol);
    EXPECT_NEAR(dot_vecdot(x.data(), y.data(), n, true), ref, tol);
    EXPECT_NEAR(dot_bf16_vecdot(x.data(), y.data(), n), ref, tol);
    if (n % 16 == 0) {
      EXPECT_NEAR(dot_tinyblas(x.data(), y.data(), n), ref, tol);
    }
    if (n % 32 == 0) {
      EXPECT_NEAR(dot_bf16_tinyblas(x.data(), y.data(), n), ref, tol);
    }
  }
  // The 16-lane horizontal sum is GCC's _mm512_reduce_add_ps tree, not left to right:
  // 2^24 + 1 + ... is absorbed differently.
  float v[16] = {16777216.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,
                 1.0f,        1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  // (v0 + v8) is 2^24 + 1 -> 2^24 (ties to even); the other 14 ones sum exactly to 14
  EXPECT_EQ(hsum16(v), 16777216.0f + 14.0f);
}

// The FMA/AVX2 kernels (used where the CPU has them) and the portable ones compute the same
// floats, bit for bit, for every weight type and summation order.
// REQ: M0-W-1214 WRK-D15
TEST(EngineActQuant, PortableAndSimdKernelsAgreeBitForBit) {
  std::mt19937 g(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {256, 512, 1000}) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (auto& v : x) v = bf16_to_fp32(fp32_to_bf16(nd(g)));
    for (auto& v : y) v = bf16_to_fp32(fp32_to_bf16(nd(g)));
    float fast[5], port[5];
    for (int pass = 0; pass < 2; ++pass) {
      force_portable_kernels(pass == 1);
      float* o = pass == 0 ? fast : port;
      o[0] = dot_vecdot(x.data(), y.data(), n);
      o[1] = dot_vecdot(x.data(), y.data(), n, true);
      o[2] = dot_bf16_vecdot(x.data(), y.data(), n);
      o[3] = n % 16 == 0 ? dot_tinyblas(x.data(), y.data(), n) : 0.0f;
      o[4] = n % 32 == 0 ? dot_bf16_tinyblas(x.data(), y.data(), n) : 0.0f;
    }
    force_portable_kernels(false);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(fast[i], port[i]) << "n " << n << " kernel " << i;
  }
  const int64_t n = 512;
  for (GgmlType t :
       {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(std::string(ggml_type_name(static_cast<uint32_t>(t))));
    for (int trial = 0; trial < 20; ++trial) {
      const auto row = random_row(t, n, g);
      std::vector<float> x(n), scratch(n);
      for (auto& v : x) v = nd(g);
      QuantizedActivation a;
      quantize_activation(t, x.data(), n, a);
      for (int order = 0; order < 3; ++order) {
        a.repacked = order > 0;
        a.repack_gemm = order == 2;
        force_portable_kernels(false);
        const float fast = dot_quantized(t, row.data(), a, scratch.data());
        force_portable_kernels(true);
        const float port = dot_quantized(t, row.data(), a, scratch.data());
        force_portable_kernels(false);
        ASSERT_EQ(fast, port) << "order " << order;
      }
    }
  }
}

// ggml_v_expf is a polynomial with ~1.5 ulp error, not libm's expf; ggml_silu uses it.
// REQ: WRK-D2
TEST(EngineActQuant, GgmlExpfApproximatesExp) {
  for (float x = -100.0f; x <= 80.0f; x += 0.37f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(static_cast<double>(ggml_expf(x)), want, want * 4e-7 + 1e-45) << x;
  }
  EXPECT_EQ(ggml_expf(0.0f), 1.0f);
  EXPECT_EQ(ggml_expf(-INFINITY), 0.0f);
  EXPECT_EQ(ggml_expf(-200.0f), 0.0f);
  EXPECT_EQ(ggml_expf(200.0f), INFINITY);
  EXPECT_NEAR(static_cast<double>(ggml_silu(2.0f)), 2.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

// REQ: WRK-D2
TEST(EngineActQuant, ActivationQuantizationAsLlamaCpp) {
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(512);
  for (auto& v : x) v = nd(g);
  QuantizedActivation q8;
  quantize_activation(GgmlType::Q8_0, x.data(), 512, q8);
  for (size_t b = 0; b < 16; ++b) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[b * 32 + j]));
    EXPECT_EQ(q8.d[b], fp16_to_fp32(fp32_to_fp16(amax / 127.f)));  // fp16-rounded scale
    for (size_t j = 0; j < 32; ++j) {
      EXPECT_LE(std::abs(q8.q[b * 32 + j]), 127);
      EXPECT_NEAR(q8.q[b * 32 + j] * (amax / 127.f), x[b * 32 + j], amax / 127.f * 0.5f + 1e-6f);
    }
  }
  QuantizedActivation qk;
  quantize_activation(GgmlType::Q4_K, x.data(), 512, qk);
  ASSERT_EQ(qk.bsum.size(), 32u);
  for (size_t s = 0; s < 32; ++s) {
    int sum = 0;
    for (size_t j = 0; j < 16; ++j) sum += qk.q[s * 16 + j];
    EXPECT_EQ(qk.bsum[s], sum);
  }
  QuantizedActivation h;
  quantize_activation(GgmlType::F16, x.data(), 512, h);
  for (size_t i = 0; i < 512; ++i) EXPECT_EQ(h.f[i], fp16_to_fp32(fp32_to_fp16(x[i])));
}

}  // namespace
}  // namespace worker::cpu
