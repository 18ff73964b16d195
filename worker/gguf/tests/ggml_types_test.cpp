// Tensor types: fp16/bf16 conversions and dequantization of every supported block type,
// each checked against a reference written element by element from the block layout
// (independent of the row-at-a-time loops in ggml_types.cpp).
#include "gguf/ggml_types.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/errors.h"
#include "common/test_helpers.h"
#include "gguf/gguf_file.h"
#include "gguf/type_traits.h"

namespace worker {
namespace {

float bits_to_f(uint32_t u) {
  return std::bit_cast<float>(u);
}

// Reference half -> double from the IEEE definition (exact in double).
double ref_half(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 31;
  const int m = h & 1023;
  if (e == 31) return m ? std::nan("") : sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  return sign * std::ldexp(static_cast<double>(1024 + m), e - 25);
}

// REQ: WRK-D2
TEST(GgmlTypes, Fp16ToFp32MatchesIeeeDefinitionForAllValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto hh = static_cast<uint16_t>(h);
    const double want = ref_half(hh);
    const float got = fp16_to_fp32(hh);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << "half bits " << h;
      ASSERT_EQ(std::signbit(got), (h >> 15) != 0) << h;
    }
  }
}

// Reference float -> half: the nearest of all finite halves, ties to the even mantissa;
// beyond the largest half plus half an ulp (65520) the result is infinity.
uint16_t ref_to_half(float x) {
  const double ax = std::fabs(static_cast<double>(x));
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (ax >= 65520.0) return sign | 0x7C00;
  uint16_t lo = 0, hi = 0x7BFF;  // binary search over positive finite halves (monotonic)
  while (lo < hi) {
    const auto mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (ref_half(mid) <= ax) {
      lo = mid;
    } else {
      hi = static_cast<uint16_t>(mid - 1);
    }
  }
  uint16_t best = lo;
  if (lo < 0x7BFF || ax > ref_half(lo)) {
    const auto up = static_cast<uint16_t>(lo + 1);
    const double dl = ax - ref_half(lo), du = ref_half(up) - ax;
    if (du < dl || (du == dl && (up & 1) == 0)) best = up;
  }
  return sign | best;
}

// REQ: WRK-D2
TEST(GgmlTypes, Fp32ToFp16RoundsToNearestEven) {
  std::mt19937 rng(1234);
  std::vector<float> xs = {0.0f,          -0.0f,         1.0f,    65504.0f,      65519.99f,
                           65520.0f,      1e9f,          -1e9f,   5.9604645e-8f, 2.9802322e-8f,
                           2.9802326e-8f, 6.1035156e-5f, 6.1e-5f, 0.1f,          -3.14159f,
                           INFINITY,      -INFINITY};
  for (int i = 0; i < 100000; ++i) xs.push_back(bits_to_f(rng()));
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) xs.push_back(small(rng) * std::ldexp(1.0f, -(i % 30)));
  // Exact ties between two halves, around a range of exponents (subnormals included).
  for (int e = -26; e < 16; ++e) {
    xs.push_back(std::ldexp(1.0f + 1.0f / 2048.0f, e));
    xs.push_back(std::ldexp(1.0f + 3.0f / 2048.0f, e));
  }
  for (float x : xs) {
    if (std::isnan(x)) {
      EXPECT_EQ(fp32_to_fp16(x) & 0x7C00, 0x7C00);
      EXPECT_NE(fp32_to_fp16(x) & 0x3FF, 0);
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(x), ref_to_half(x))
        << "x=" << x << " bits=" << std::hex << test::bits(x);
  }
}

// REQ: WRK-D2
TEST(GgmlTypes, Bf16RoundTripAndNearestEven) {
  std::mt19937 rng(99);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = rng();
    const float x = bits_to_f(u);
    if (std::isnan(x) || std::isinf(x)) continue;
    const uint16_t b = fp32_to_bf16(x);
    const double got = static_cast<double>(bf16_to_fp32(b));
    // Neighbours one bf16 ulp away must not be closer (ties go to the even one).
    const double lo = static_cast<double>(bf16_to_fp32(static_cast<uint16_t>(b - 1)));
    const double hi = static_cast<double>(bf16_to_fp32(static_cast<uint16_t>(b + 1)));
    const double xd = static_cast<double>(x);
    if (std::isinf(got)) {  // overflow: only beyond the largest bf16 (3.3895e38)
      ASSERT_GT(std::fabs(xd), 3.3895e38) << x;
      continue;
    }
    const double err = std::fabs(got - xd);
    if (!std::isinf(lo) && !std::isnan(lo)) {
      ASSERT_LE(err, std::fabs(lo - xd)) << x;
    }
    if (!std::isinf(hi) && !std::isnan(hi)) {
      ASSERT_LE(err, std::fabs(hi - xd)) << x;
    }
    if (err == std::fabs(hi - xd) || err == std::fabs(lo - xd)) {
      ASSERT_EQ(b & 1, 0) << x;
    }
  }
  EXPECT_EQ(test::bits(bf16_to_fp32(fp32_to_bf16(1.5f))), test::bits(1.5f));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}

TEST(GgmlTypes, SizesAndNames) {
  EXPECT_EQ(*ggml_block_size(12), 256u);
  EXPECT_EQ(*ggml_type_block_bytes(12), 144u);
  EXPECT_EQ(*ggml_type_block_bytes(14), 210u);
  EXPECT_EQ(*ggml_type_block_bytes(6), 22u);
  EXPECT_EQ(*ggml_type_block_bytes(8), 34u);
  EXPECT_EQ(*ggml_type_block_bytes(2), 18u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::BF16, 10), 20u);
  EXPECT_EQ(ggml_type_name(14), "Q6_K");
  EXPECT_EQ(ggml_type_name(77), "type77");
  EXPECT_FALSE(ggml_block_size(77).has_value());
  EXPECT_TRUE(ggml_type_supported(30));
  EXPECT_FALSE(ggml_type_supported(13));  // Q5_K: known but not supported
}

// ---- element-wise references ----

uint16_t rd16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

// A random finite fp16 scale of moderate size (what real blocks hold).
uint16_t rand_scale(std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  return fp32_to_fp16(u(rng));
}

float ref_q4_0(const uint8_t* blk, int e) {
  const float d = fp16_to_fp32(rd16(blk));
  const uint8_t byte = blk[2 + e % 16];
  const int q = e < 16 ? (byte & 15) : (byte >> 4);
  return static_cast<float>(q - 8) * d;
}
float ref_q5_0(const uint8_t* blk, int e) {
  const float d = fp16_to_fp32(rd16(blk));
  const uint32_t qh =
      blk[2] | (blk[3] << 8) | (blk[4] << 16) | (static_cast<uint32_t>(blk[5]) << 24);
  const uint8_t byte = blk[6 + e % 16];
  const int lo = e < 16 ? (byte & 15) : (byte >> 4);
  const int hb = (qh >> e) & 1;  // bit e holds the 5th bit of element e
  return static_cast<float>((lo | (hb << 4)) - 16) * d;
}
float ref_q8_0(const uint8_t* blk, int e) {
  return static_cast<float>(static_cast<int8_t>(blk[2 + e])) * fp16_to_fp32(rd16(blk));
}
// 8 six-bit scales and 8 six-bit mins packed into 12 bytes (ggml-common.h block_q4_K).
void k4_scale_min(const uint8_t* s, int sub, int* sc, int* m) {
  if (sub < 4) {
    *sc = s[sub] & 63;
    *m = s[sub + 4] & 63;
  } else {
    *sc = (s[sub + 4] & 15) | ((s[sub - 4] >> 6) << 4);
    *m = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
  }
}
float ref_q4_k(const uint8_t* blk, int e) {
  const float d = fp16_to_fp32(rd16(blk));
  const float dmin = fp16_to_fp32(rd16(blk + 2));
  const uint8_t* scales = blk + 4;
  const uint8_t* qs = blk + 16;
  const int chunk = e / 64, within = e % 64, hi = within >= 32, l = within % 32;
  const uint8_t byte = qs[chunk * 32 + l];
  const int q = hi ? (byte >> 4) : (byte & 15);
  int sc, m;
  k4_scale_min(scales, 2 * chunk + hi, &sc, &m);
  return (d * static_cast<float>(sc)) * static_cast<float>(q) - dmin * static_cast<float>(m);
}
float ref_q6_k(const uint8_t* blk, int e) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = fp16_to_fp32(rd16(blk + 208));
  const int half = e / 128, r = e % 128, g = r / 32, l = r % 32;
  const uint8_t lb = ql[half * 64 + l + (g & 1) * 32];
  const int low = g < 2 ? (lb & 15) : (lb >> 4);
  const int high = (qh[half * 32 + l] >> (2 * g)) & 3;
  const int q = (low | (high << 4)) - 32;
  const int scale = sc[half * 8 + l / 16 + 2 * g];
  return (d * static_cast<float>(scale)) * static_cast<float>(q);
}

struct QCase {
  GgmlType type;
  int block;
  int bytes;
  float (*ref)(const uint8_t*, int);
  std::vector<int> scale_offsets;  // fp16 fields to fill with sane scales
};

class GgmlDequant : public ::testing::TestWithParam<QCase> {};

// REQ: WRK-D2 M0-W-1201
TEST_P(GgmlDequant, MatchesElementwiseReferenceBitForBit) {
  const QCase& c = GetParam();
  std::mt19937 rng(42 + static_cast<int>(c.type));
  const int nblocks = 6;
  std::vector<uint8_t> data(static_cast<size_t>(nblocks * c.bytes));
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (int i = 0; i < nblocks; ++i) {
    for (int off : c.scale_offsets) {
      const uint16_t s = rand_scale(rng);
      std::memcpy(&data[static_cast<size_t>(i * c.bytes + off)], &s, 2);
    }
  }
  const int n = nblocks * c.block;
  std::vector<float> got(static_cast<size_t>(n));
  dequantize_row(c.type, data.data(), got.data(), n);
  int nonzero = 0;
  for (int i = 0; i < n; ++i) {
    const float want = c.ref(&data[static_cast<size_t>(i / c.block * c.bytes)], i % c.block);
    ASSERT_EQ(test::bits(got[i]), test::bits(want))
        << ggml_type_name(static_cast<uint32_t>(c.type)) << " element " << i;
    nonzero += got[i] != 0.0f;
  }
  EXPECT_GT(nonzero, n / 2);  // the test data is not degenerate

  // dot_row: the plain left-to-right float sum of the dequantized products.
  std::vector<float> x(static_cast<size_t>(n));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  float want = 0.0f;
  double exact = 0.0;
  for (int i = 0; i < n; ++i) {
    want += got[i] * x[i];
    exact += static_cast<double>(got[i]) * static_cast<double>(x[i]);
  }
  const float dot = dot_row(c.type, data.data(), x.data(), n);
  EXPECT_EQ(test::bits(dot), test::bits(want));
  EXPECT_NEAR(static_cast<double>(dot), exact, 1e-4 * (1.0 + std::fabs(exact)));
}

INSTANTIATE_TEST_SUITE_P(AllQuantTypes, GgmlDequant,
                         ::testing::Values(QCase{GgmlType::Q4_0, 32, 18, ref_q4_0, {0}},
                                           QCase{GgmlType::Q5_0, 32, 22, ref_q5_0, {0}},
                                           QCase{GgmlType::Q8_0, 32, 34, ref_q8_0, {0}},
                                           QCase{GgmlType::Q4_K, 256, 144, ref_q4_k, {0, 2}},
                                           QCase{GgmlType::Q6_K, 256, 210, ref_q6_k, {208}}),
                         [](const ::testing::TestParamInfo<QCase>& p) {
                           return std::string(ggml_type_name(static_cast<uint32_t>(p.param.type)));
                         });

// REQ: WRK-D2
TEST(GgmlTypes, FloatRowsDequantize) {
  std::vector<float> src = {1.0f, -2.5f, 3.25f, 1e-3f};
  std::vector<uint16_t> h, b;
  for (float f : src) {
    h.push_back(fp32_to_fp16(f));
    b.push_back(fp32_to_bf16(f));
  }
  std::vector<float> out(4);
  dequantize_row(GgmlType::F32, src.data(), out.data(), 4);
  EXPECT_EQ(out, src);
  dequantize_row(GgmlType::F16, h.data(), out.data(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], src[i], std::fabs(src[i]) * 1e-3f);
  dequantize_row(GgmlType::BF16, b.data(), out.data(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], src[i], std::fabs(src[i]) * 8e-3f);
  const float x[4] = {1, 1, 1, 1};
  EXPECT_FLOAT_EQ(dot_row(GgmlType::F32, src.data(), x, 4), 1.0f - 2.5f + 3.25f + 1e-3f);
}

// REQ: WRK-D2
TEST(GgmlTypes, UnsupportedTypeIsAnErrorNotZeros) {
  std::vector<uint8_t> blk(176, 1);
  std::vector<float> out(256, 7.0f);
  try {
    dequantize_row(GgmlType::Q5_K, blk.data(), out.data(), 256);
    FAIL() << "no error";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("Q5_K is not supported"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(GgmlType::Q8_0, blk.data(), out.data(), 33), GgufError);
}

// The type table (type_traits.h) against llama.cpp's, written out here: block size and bytes
// from ggml.c's type_traits[] (blck_size, type_size), the activation rounding from
// ggml-cpu.c's type_traits_cpu[].vec_dot_type, the repack rule from
// ggml_repack_get_optimal_repack_type (x86: Q4_0 and Q4_K with rows % 8 == 0).
// REQ: WRK-D2
TEST(TypeTraits, MatchLlamaCppTable) {
  struct Row {
    GgmlType t;
    int block, bytes;
    ActType act;
    DotFamily family;
  };
  const Row rows[] = {
      {GgmlType::F32, 1, 4, ActType::F32, DotFamily::Float},
      {GgmlType::F16, 1, 2, ActType::F16, DotFamily::Float},
      {GgmlType::BF16, 1, 2, ActType::BF16, DotFamily::Float},
      {GgmlType::Q8_0, 32, 34, ActType::Q8_0, DotFamily::Block32},
      {GgmlType::Q4_0, 32, 18, ActType::Q8_0, DotFamily::Block32},
      {GgmlType::Q5_0, 32, 22, ActType::Q8_0, DotFamily::Block32},
      {GgmlType::Q4_K, 256, 144, ActType::Q8_K, DotFamily::KQuant},
      {GgmlType::Q6_K, 256, 210, ActType::Q8_K, DotFamily::KQuant},
  };
  for (const Row& r : rows) {
    const auto id = static_cast<uint32_t>(r.t);
    SCOPED_TRACE(std::string(ggml_type_name(id)));
    int block = 0, bytes = 0;
    dispatch(r.t, [&](auto tr) {
      if constexpr (decltype(tr)::kSupported) {
        EXPECT_EQ(decltype(tr)::kType, r.t);
        block = decltype(tr)::kBlock;
        bytes = decltype(tr)::kBlockBytes;
      }
    });
    EXPECT_EQ(block, r.block);
    EXPECT_EQ(bytes, r.bytes);
    EXPECT_EQ(act_type_of(r.t), r.act);
    EXPECT_EQ(dot_family_of(r.t), r.family);
    EXPECT_TRUE(ggml_type_supported(id));
    EXPECT_EQ(*ggml_block_size(id), static_cast<size_t>(r.block));
    EXPECT_EQ(*ggml_type_block_bytes(id), static_cast<size_t>(r.bytes));
    const bool repacks = r.t == GgmlType::Q4_0 || r.t == GgmlType::Q4_K;
    EXPECT_EQ(repacked(r.t, 896), repacks);
    EXPECT_FALSE(repacked(r.t, 900));
  }
  // A known type this worker does not compute with: no traits, and entry points refuse it.
  EXPECT_EQ(dot_family_of(GgmlType::Q5_K), DotFamily::None);
  EXPECT_FALSE(repacked(GgmlType::Q5_K, 8));
  try {
    dispatch_or_throw(GgmlType::Q5_K, "kernel", [](auto) { return 0; });
    ADD_FAILURE() << "no exception";
  } catch (const WorkerError& e) {
    EXPECT_EQ(std::string(e.what()), "kernel: unsupported weight type Q5_K");
  }
}

}  // namespace
}  // namespace worker
