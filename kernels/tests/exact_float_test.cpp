// Exact F32/F16/BF16 matmul (kernels/matmul_float.cu) against the CPU reference, bit for bit
// (see kernels/exact.cuh).
//  - ExactFloatHost.*: HOST EMULATION, runs everywhere (also without a GPU): the kernels'
//    thread decomposition (which thread owns which chains, the shuffle butterflies, the
//    leftover loops) replayed on the host with the same xf:: helpers the kernels call
//    (kernels/exact_float_math.cuh), compared with cpu::dot_vecdot / dot_tinyblas /
//    dot_bf16_vecdot / dot_bf16_tinyblas. Proves the algorithm.
//  - ExactFloatGpu.*: the CUDA kernels through detail::matmul_float, compared over the full
//    output with what CpuEngine::matmul computes (activations rounded by
//    cpu::quantize_activation, the order chosen by cpu::tinyblas_takes on the whole batch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "exact.cuh"
#include "exact_float_math.cuh"
#include "gguf/ggml_types.h"
// gpu_test_util.h's error metrics promote floats to double (unused here); this target has
// no per-file -Wno-double-promotion.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "common/test_helpers.h"
#include "gpu_test_util.h"
#pragma GCC diagnostic pop

namespace worker {
namespace {

using test::bits;

namespace xf = kern::exact::xf;
using gputest::DevArray;

const GgmlType kFloatTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    do {
      x = d(rng);
    } while (x == 0.0f);  // never zeros
  }
  return v;
}

// Weight rows stored as `type` (bytes), and the same rows as exact floats.
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> f;  // dequantized: what CpuEngine's row_f32 gives
};

Weights random_weights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weights w;
  const size_t n = static_cast<size_t>(rows * cols);
  const auto v = randn(n, rng);
  w.bytes.resize(ggml_row_bytes(type, cols) * static_cast<size_t>(rows));
  if (type == GgmlType::F32) {
    std::memcpy(w.bytes.data(), v.data(), n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = type == GgmlType::F16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
    }
  }
  w.f.resize(n);
  dequantize_row(type, w.bytes.data(), w.f.data(), static_cast<int64_t>(n));
  return w;
}

// n_tok activation rows rounded exactly as CpuEngine::matmul rounds them.
std::vector<float> random_acts(GgmlType type, int n_tok, int64_t cols, std::mt19937& rng) {
  const auto x = randn(static_cast<size_t>(n_tok * cols), rng);
  std::vector<float> out;
  cpu::QuantizedActivation qa;
  for (int t = 0; t < n_tok; ++t) {
    cpu::quantize_activation(type, x.data() + t * cols, cols, qa);
    out.insert(out.end(), qa.f.begin(), qa.f.end());
  }
  return out;
}

// CpuEngine::matmul's dot for one (row, token), called as it calls them.
float cpu_dot(GgmlType type, bool tiny, const float* row, const float* a, int64_t k) {
  if (type == GgmlType::BF16) {
    return tiny ? cpu::dot_bf16_tinyblas(row, a, k) : cpu::dot_bf16_vecdot(row, a, k);
  }
  return tiny ? cpu::dot_tinyblas(row, a, k) : cpu::dot_vecdot(row, a, k, type == GgmlType::F16);
}

// WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh sets it under compute-sanitizer): the timing tests
// launch once instead of repeating, without the LM-head shape and with 48-token prompts.
bool quick_env() {
  return std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
}

// ---- host emulation of vecdot_kernel: 8 threads per row, thread s owns chains 8s..8s+7
// (F32/F16) or the dpbf16 lanes of elements 8s..8s+7 (BF16) of every 64-element step ----
float emulate_vecdot(GgmlType type, const float* w, const float* x, int n) {
  const int n_it = n / 64, np = n_it * 64;
  auto we = [w](int i) { return w[i]; };
  if (type != GgmlType::BF16) {
    float acc[8][8] = {};
    for (int i = 0; i < n_it; ++i) {
      for (int s = 0; s < 8; ++s) {
        for (int k = 0; k < 8; ++k) {
          const int e = i * 64 + 8 * s + k;
          acc[s][k] = xf::fma_step(acc[s][k], w[e], x[e]);
        }
      }
    }
    for (int m = 4; m >= 1; m >>= 1) {  // __shfl_xor_sync(v, m) then combine
      float nv[8][8];
      for (int s = 0; s < 8; ++s) {
        float v[8], o[8];
        for (int k = 0; k < 8; ++k) v[k] = acc[s][k], o[k] = acc[s ^ m][k];
        xf::combine(v, o);
        for (int k = 0; k < 8; ++k) nv[s][k] = v[k];
      }
      std::memcpy(acc, nv, sizeof acc);
    }
    float res[8];
    for (int s = 0; s < 8; ++s) res[s] = xf::local_tree8(acc[s]);
    for (int s = 1; s < 8; ++s) EXPECT_EQ(bits(res[s]), bits(res[0])) << "threads disagree";
    float r = res[0];
    if (np != n) {
      r = type == GgmlType::F32
              ? xf::tail_f32(r, we, x, np, n)
              : static_cast<float>(xf::tail_double(static_cast<double>(r), we, x, np, n));
    }
    return r;
  }
  float acc[8][4] = {};
  for (int i = 0; i < n_it; ++i) {
    for (int s = 0; s < 8; ++s) {
      for (int q = 0; q < 4; ++q) {
        const int e = i * 64 + 8 * s + 2 * q;
        acc[s][q] = xf::dpbf16_step(acc[s][q], w[e], x[e], w[e + 1], x[e + 1]);
      }
    }
  }
  for (int m = 2; m >= 1; m >>= 1) {
    float nv[8][4];
    for (int s = 0; s < 8; ++s) {
      float v[4], o[4];
      for (int k = 0; k < 4; ++k) v[k] = acc[s][k], o[k] = acc[s ^ m][k];
      xf::combine(v, o);
      for (int k = 0; k < 4; ++k) nv[s][k] = v[k];
    }
    std::memcpy(acc, nv, sizeof acc);
  }
  float h[8];
  for (int s = 0; s < 8; ++s) h[s] = xf::local_tree4(acc[s]);
  // thread 0: its own hsum16 (c1) and thread 4's (c2, by __shfl_xor_sync(h, 4))
  double d = static_cast<double>(h[0]) + static_cast<double>(h[0 ^ 4]);
  d = xf::tail_double(d, we, x, np, n);
  return static_cast<float>(d);
}

// ---- host emulation of tinyblas_kernel for one output: 16 lanes, k in chunks of 64, a
// partial last chunk padded with weight +0 and activation -0 as the kernel does (their
// product -0 leaves every chain unchanged), then the shuffle butterfly xor 8, 4, 2, 1 ----
float emulate_tinyblas(GgmlType type, const float* w, const float* x, int n) {
  auto wp = [&](int e) { return e < n ? w[e] : 0.0f; };
  auto xp = [&](int e) { return e < n ? x[e] : -0.0f; };
  float acc[16] = {};
  for (int k0 = 0; k0 < n; k0 += 64) {
    if (type != GgmlType::BF16) {
      for (int kk = 0; kk < 64; kk += 16) {
        for (int l = 0; l < 16; ++l) {
          const int e = k0 + kk + l;
          acc[l] = xf::fma_step(acc[l], wp(e), xp(e));
        }
      }
    } else {
      for (int kk = 0; kk < 64; kk += 32) {
        for (int l = 0; l < 16; ++l) {
          const int e = k0 + kk + 2 * l;
          acc[l] = xf::dpbf16_step(acc[l], wp(e), xp(e), wp(e + 1), xp(e + 1));
        }
      }
    }
  }
  for (int m = 8; m >= 1; m >>= 1) {
    float nv[16];
    for (int l = 0; l < 16; ++l) nv[l] = xf::add_rn(acc[l], acc[l ^ m]);
    std::memcpy(acc, nv, sizeof acc);
  }
  for (int l = 1; l < 16; ++l) EXPECT_EQ(bits(acc[l]), bits(acc[0])) << "lanes disagree";
  return acc[0];
}

// HOST EMULATION (no GPU needed).
// REQ: M0-W-1430
TEST(ExactFloatHost, TinyblasDecisionMatchesCpu) {
  const int64_t rows[] = {1, 2, 3, 4, 6, 8, 130, 172, 896, 2051};
  const int64_t toks[] = {0, 1, 2, 3, 64};
  const int64_t colss[] = {8, 16, 32, 48, 64, 96, 172, 896, 4864};
  const GgmlType all[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,
                          GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K};
  for (GgmlType t : all)
    for (int64_t r : rows)
      for (int64_t n : toks)
        for (int64_t k : colss)
          EXPECT_EQ(xf::tinyblas_takes(static_cast<uint32_t>(t), r, n, k),
                    cpu::tinyblas_takes(t, r, n, k))
              << ggml_type_name(static_cast<uint32_t>(t)) << " " << r << " " << n << " " << k;
}

// HOST EMULATION: the hsum16 tree of the helpers against cpu::hsum16.
// REQ: M0-W-1430
TEST(ExactFloatHost, Hsum16MatchesCpu) {
  std::mt19937 rng(11);
  for (int it = 0; it < 2000; ++it) {
    const auto v = randn(16, rng, it % 2 ? 1.0f : 1e4f);
    float a[16];
    std::memcpy(a, v.data(), sizeof a);
    ASSERT_EQ(bits(xf::hsum16(a)), bits(cpu::hsum16(v.data())));
  }
}

// HOST EMULATION of tinyblas_kernel's transposing hsum16 (xf::fold_pair): 16 lanes, each with
// the chain values of N outputs, run level by level (lane bits 3, 2, 1, 0; each lane receives its
// partner's send of the level); lane l must end with outputs (N / 16) * l .. + N / 16 - 1, each
// cpu::hsum16 of that output's 16 chains. N = 64 (8 rows x 8 tokens) and 16 (4 x 4).
template <int N>
void check_transposing_hsum16(std::mt19937& rng) {
  constexpr int kQ = N / 16;
  float w[16][N];
  std::vector<float> want(N);
  const auto vals = randn(16 * N, rng, 1e3f);
  for (int o = 0; o < N; ++o) {
    float c[16];
    for (int l = 0; l < 16; ++l) {
      // some exact zeros of either sign, so that the pairs' signed-zero sums are exercised
      const float x = vals[static_cast<size_t>(l) * N + o];
      c[l] = (l + o) % 7 == 0 ? std::copysign(0.0f, x) : x;
      w[l][o] = c[l];
    }
    want[o] = cpu::hsum16(c);
  }
  const auto level = [&](auto n_c, auto b_c) {
    constexpr int n = decltype(n_c)::value, B = decltype(b_c)::value;
    float send[16][N / 2], keep[16][N / 2];
    for (int l = 0; l < 16; ++l) {
      for (int i = 0; i < n / 2; ++i) xf::fold_pair<n, B>(w[l], l, i, send[l][i], keep[l][i]);
    }
    for (int l = 0; l < 16; ++l) {
      for (int i = 0; i < n / 2; ++i) w[l][i] = xf::add_rn(keep[l][i], send[l ^ (1 << B)][i]);
    }
  };
  level(std::integral_constant<int, N>{}, std::integral_constant<int, 3>{});
  level(std::integral_constant<int, N / 2>{}, std::integral_constant<int, 2>{});
  level(std::integral_constant<int, N / 4>{}, std::integral_constant<int, 1>{});
  level(std::integral_constant<int, N / 8>{}, std::integral_constant<int, 0>{});
  for (int l = 0; l < 16; ++l) {
    for (int i = 0; i < kQ; ++i) {
      ASSERT_EQ(bits(w[l][i]), bits(want[static_cast<size_t>(kQ * l + i)]))
          << "N " << N << " lane " << l << " output " << kQ * l + i;
    }
  }
}

// REQ: M0-W-1430
TEST(ExactFloatHost, TransposingHsum16MatchesCpu) {
  std::mt19937 rng(21);
  for (int it = 0; it < 200; ++it) {
    check_transposing_hsum16<64>(rng);  // the 8 x 8 tile
    check_transposing_hsum16<16>(rng);  // the 4 x 4 tile
  }
}

// tinyblas_kernel's interleaved weight stage (F32 / F16): every element of a 128-element chunk
// has its own place in a 35-slot row; lane l's slot of group q holds its chain's steps 64q +
// 16s + l in order s = 0 .. 3; a quarter warp's 8 lanes read 8 adjacent slots; and the
// conversion's stores (a warp: 32 / (128 / U) rows of 128 / U units of U consecutive elements,
// rows xf::kIlvRowFloats apart rounded to the kernel's 144 floats) hit 32 distinct banks.
// REQ: M0-W-1430
TEST(ExactFloatHost, InterleavedStageIsAConflictFreePermutation) {
  std::vector<int> owner(xf::kIlvRowFloats, -1);
  for (int k = 0; k < 128; ++k) {
    const int p = xf::ilv_pos(k);
    ASSERT_GE(p, 0);
    ASSERT_LT(p, xf::kIlvRowFloats);
    EXPECT_EQ(owner[static_cast<size_t>(p)], -1) << "element " << k << " shares " << p;
    owner[static_cast<size_t>(p)] = k;
  }
  for (int q = 0; q < 2; ++q) {
    for (int l = 0; l < 16; ++l) {
      EXPECT_EQ(xf::ilv_read(q, l) % 4, 0);
      for (int s = 0; s < 4; ++s) {
        EXPECT_EQ(owner[static_cast<size_t>(xf::ilv_read(q, l) + s)], 64 * q + 16 * s + l);
      }
      if (l % 8 != 0) {
        EXPECT_EQ(xf::ilv_read(q, l), xf::ilv_read(q, l - 1) + 4);
      }
    }
  }
  constexpr int kLd = 144;
  for (const int unit : {8, 4}) {  // F16, F32
    const int per_row = 128 / unit;
    for (int j = 0; j < unit; ++j) {  // one store instruction of the warp
      std::vector<int> bank_use(32, 0);
      for (int t = 0; t < 32; ++t) {
        const int r = t / per_row, we = (t % per_row) * unit;
        ++bank_use[static_cast<size_t>((r * kLd + xf::ilv_pos(we + j)) % 32)];
      }
      for (int b = 0; b < 32; ++b) {
        EXPECT_EQ(bank_use[static_cast<size_t>(b)], 1) << "unit " << unit << " j " << j;
      }
    }
  }
}

// HOST EMULATION: the tinyBLAS kernel pads a partial last k chunk with weight +0 and
// activation -0; that step must leave every chain value unchanged, signed zeros included.
// REQ: M0-W-1430
TEST(ExactFloatHost, PaddingLeavesChainsUnchanged) {
  const float vals[] = {0.0f,       -0.0f,   1.0f,     -1.5f,    0x1p-149f,
                        -0x1p-149f, 3.4e38f, INFINITY, -INFINITY};
  for (float c : vals) {
    EXPECT_EQ(bits(xf::fma_step(c, 0.0f, -0.0f)), bits(c)) << c;
    EXPECT_EQ(bits(xf::dpbf16_step(c, 0.0f, -0.0f, 0.0f, -0.0f)), bits(c)) << c;
  }
  // a chain that starts at +0 and meets the padding stays +0
  EXPECT_EQ(bits(xf::fma_step(0.0f, 0.0f, -0.0f)), bits(0.0f));
  const float nan = std::nanf("");
  EXPECT_TRUE(std::isnan(xf::fma_step(nan, 0.0f, -0.0f)));
}

// HOST EMULATION of vecdot_kernel (decode, and batches tinyBLAS does not take).
// REQ: M0-W-1430
TEST(ExactFloatHost, VecdotDecompositionMatchesCpu) {
  std::mt19937 rng(1234);
  const int colss[] = {8, 48, 64, 100, 128, 172, 256, 768, 896, 1024, 4864, 4864 + 63};
  for (GgmlType type : kFloatTypes) {
    for (int cols : colss) {
      const int rows = 24;
      const Weights w = random_weights(type, rows, cols, rng);
      const auto a = random_acts(type, 1, cols, rng);
      int bad = 0;
      for (int r = 0; r < rows; ++r) {
        const float* row = w.f.data() + static_cast<size_t>(r) * cols;
        const float want = cpu_dot(type, false, row, a.data(), cols);
        const float got = emulate_vecdot(type, row, a.data(), cols);
        if (bits(want) != bits(got) && bad++ < 3)
          ADD_FAILURE() << ggml_type_name(static_cast<uint32_t>(type)) << " cols " << cols
                        << " row " << r << ": emulated " << got << " cpu " << want;
      }
      EXPECT_EQ(bad, 0) << ggml_type_name(static_cast<uint32_t>(type)) << " cols " << cols;
    }
  }
}

// HOST EMULATION of tinyblas_kernel (prompt batches).
// REQ: M0-W-1430
TEST(ExactFloatHost, TinyblasDecompositionMatchesCpu) {
  std::mt19937 rng(99);
  const int colss[] = {16, 32, 48, 64, 80, 96, 160, 256, 896, 4864};
  for (GgmlType type : kFloatTypes) {
    for (int cols : colss) {
      if (type == GgmlType::BF16 && cols % 32 != 0) continue;  // tinyBLAS-BF16 needs k % 32
      const int rows = 24;
      const Weights w = random_weights(type, rows, cols, rng);
      const auto a = random_acts(type, 2, cols, rng);
      int bad = 0;
      for (int r = 0; r < rows; ++r) {
        for (int t = 0; t < 2; ++t) {
          const float* row = w.f.data() + static_cast<size_t>(r) * cols;
          const float* x = a.data() + static_cast<size_t>(t) * cols;
          const float want = cpu_dot(type, true, row, x, cols);
          const float got = emulate_tinyblas(type, row, x, cols);
          if (bits(want) != bits(got) && bad++ < 3)
            ADD_FAILURE() << ggml_type_name(static_cast<uint32_t>(type)) << " cols " << cols
                          << " row " << r << ": emulated " << got << " cpu " << want;
        }
      }
      EXPECT_EQ(bad, 0) << ggml_type_name(static_cast<uint32_t>(type)) << " cols " << cols;
    }
  }
}

// ---- GPU ----
struct Case {
  int rows, cols, n_tok;
  int batch_n = 0;  // 0: n_tok
  int t0 = 0;
  bool accumulate = false;
  // byte offsets of the weight / activation pointers (16-byte misalignment: scalar-load path)
  int w_off = 0, a_off = 0;
};

std::string describe(GgmlType type, const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s rows %d cols %d n_tok %d batch_n %d t0 %d acc %d off %d/%d",
                std::string(ggml_type_name(static_cast<uint32_t>(type))).c_str(), c.rows, c.cols,
                c.n_tok, c.batch_n ? c.batch_n : c.n_tok, c.t0, c.accumulate ? 1 : 0, c.w_off,
                c.a_off);
  return buf;
}

// Floats of a tinyBLAS launch's permuted activations (ActBuf::fp): n_tok rows of
// xf::tb_perm_cols(cols).
size_t fp_floats(int n_tok, int cols) {
  return static_cast<size_t>(n_tok) * static_cast<size_t>(kern::exact::xf::tb_perm_cols(cols));
}

// Runs one case on the GPU and compares every output bit for bit; returns mismatches.
int run_case(GgmlType type, const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int batch_n = c.batch_n ? c.batch_n : c.n_tok;
  const Weights w = random_weights(type, c.rows, c.cols, rng);
  const auto a = random_acts(type, c.n_tok, c.cols, rng);
  const size_t n_out = static_cast<size_t>(c.rows) * static_cast<size_t>(c.n_tok);
  std::vector<float> y0;
  if (c.accumulate) y0 = randn(n_out, rng);

  // device copies (uint8 buffers so that the offsets are in bytes)
  DevArray<uint8_t> dw(w.bytes.size() + 64);
  DevArray<uint8_t> da(a.size() * 4 + 64);
  DevArray<float> dy(n_out);
  DevArray<float> dfp(fp_floats(c.n_tok, c.cols));
  EXPECT_EQ(cudaMemcpy(dw.get() + c.w_off, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(da.get() + c.a_off, a.data(), a.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  if (c.accumulate) dy.upload(y0);  // else NaN-poisoned: unwritten outputs show up

  kern::WeightView wv;
  wv.data = dw.get() + c.w_off;
  wv.type = static_cast<uint32_t>(type);
  wv.rows = c.rows;
  wv.cols = c.cols;
  wv.row_bytes = ggml_row_bytes(type, c.cols);
  kern::exact::ActBuf ab;
  ab.f = reinterpret_cast<float*>(da.get() + c.a_off);
  ab.fp = dfp.get();
  kern::exact::BatchOrder order;
  order.batch_n = batch_n;
  order.t0 = c.t0;
  kern::exact::detail::matmul_float(wv, ab, c.n_tok, order, dy.get(), c.accumulate, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const auto got = dy.download();

  const bool tiny = cpu::tinyblas_takes(type, c.rows, batch_n, c.cols);
  int bad = 0;
  for (int t = 0; t < c.n_tok; ++t) {
    for (int r = 0; r < c.rows; ++r) {
      const size_t i = static_cast<size_t>(t) * c.rows + r;
      float want = cpu_dot(type, tiny, w.f.data() + static_cast<size_t>(r) * c.cols,
                           a.data() + static_cast<size_t>(t) * c.cols, c.cols);
      if (c.accumulate) want = y0[i] + want;
      if (bits(want) != bits(got[i])) {
        if (bad < 5) {
          std::printf("  mismatch %s: t %d r %d got %a want %a\n", describe(type, c).c_str(), t, r,
                      static_cast<double>(got[i]), static_cast<double>(want));
        }
        ++bad;
      }
    }
  }
  return bad;
}

void run_cases(const std::vector<Case>& cases, uint32_t seed) {
  for (GgmlType type : kFloatTypes) {
    for (const Case& c : cases) {
      const int bad = run_case(type, c, seed++);
      EXPECT_EQ(bad, 0) << describe(type, c) << ": " << bad << " of "
                        << static_cast<size_t>(c.rows) * c.n_tok << " outputs differ";
    }
  }
}

// Decode: one token, vec_dot order (and the leftover loops for cols % 64 != 0).
// REQ: M0-W-1430 M0-W-1431 M0-W-1810
TEST(ExactFloatGpu, DecodeVecdotBitExact) {
  REQUIRE_GPU();
  std::vector<Case> cases = {
      {2048, 64, 1},  {896, 896, 1},  {130, 256, 1},       {172, 768, 1}, {896, 1024, 1},
      {136, 4864, 1}, {2048, 172, 1}, {4864, 896, 1},      {130, 172, 1}, {7, 48, 1},
      {896, 4864, 1}, {512, 64, 1},   {131, 4864 + 40, 1},
  };
  Case acc{896, 896, 1};
  acc.accumulate = true;
  cases.push_back(acc);
  Case acc2{130, 172, 1};
  acc2.accumulate = true;
  cases.push_back(acc2);
  run_cases(cases, 100);
}

// Prompt batches tinyBLAS takes (rows % 4 == 0, cols % 16 (F32/F16) or % 32 (BF16)).
// REQ: M0-W-1430 M0-W-1431 M0-W-1810
TEST(ExactFloatGpu, BatchTinyblasBitExact) {
  REQUIRE_GPU();
  std::vector<Case> cases = {
      {896, 896, 2},
      {2048, 64, 3},
      {172, 256, 4},
      {132, 4864, 5},
      {896, 96, 8},
      {896, 1024, 17},
      {256, 896, 64},
      {4, 32, 2},
      {36, 160, 9},
      // grids of >= 132 32 x 32 tiles (the 8 x 8 kernel on an H100 / H200; the rows above
      // take the 16 x 16 one), with a partial last k chunk and partial row / token tiles
      {4864, 160, 64},
      {4228, 96, 33},
      // 64 x 2 32 x 32 tiles: the 8 x 8 kernel on a grid no larger than the SMs (launched
      // with the shared memory of one block an SM)
      {2048, 160, 40},
  };
  Case acc{172, 768, 5};
  acc.accumulate = true;
  cases.push_back(acc);
  Case acc_big{4224, 96, 40};
  acc_big.accumulate = true;
  cases.push_back(acc_big);
  run_cases(cases, 200);
}

// Q, K and V of a prompt in one tinyBLAS launch (detail::matmul_float_multi): every output of
// the three weights bit for bit the CPU's; and the cases it must refuse (launching nothing).
// REQ: M0-W-1430 M0-W-1431 M0-W-1810
TEST(ExactFloatGpu, MultiWeightTinyblasBitExact) {
  REQUIRE_GPU();
  uint32_t seed = 300;
  for (GgmlType type : kFloatTypes) {
    for (const int n_tok : {2, 17, 40, 520}) {  // 520: 153 32 x 32 tiles (the 8 x 8 kernel)
      std::mt19937 rng(seed++);
      const int cols = 96, rows[3] = {64, 36, 132};
      const auto a = random_acts(type, n_tok, cols, rng);
      DevArray<float> da(a.size());
      da.upload(a);
      DevArray<float> dfp(fp_floats(n_tok, cols));
      Weights w[3];
      std::unique_ptr<DevArray<uint8_t>> dw[3];
      std::unique_ptr<DevArray<float>> dy[3];
      kern::WeightView wv[3];
      const kern::WeightView* ws[3];
      float* ys[3];
      for (int i = 0; i < 3; ++i) {
        w[i] = random_weights(type, rows[i], cols, rng);
        dw[i] = std::make_unique<DevArray<uint8_t>>(w[i].bytes);
        dy[i] = std::make_unique<DevArray<float>>(static_cast<size_t>(rows[i]) * n_tok);
        wv[i].data = dw[i]->get();
        wv[i].type = static_cast<uint32_t>(type);
        wv[i].rows = rows[i];
        wv[i].cols = cols;
        wv[i].row_bytes = ggml_row_bytes(type, cols);
        ws[i] = &wv[i];
        ys[i] = dy[i]->get();
      }
      kern::exact::ActBuf ab;
      ab.f = da.get();
      ab.fp = dfp.get();
      ASSERT_TRUE(kern::exact::detail::matmul_float_multi(
          ws, ys, 3, ab, n_tok, kern::exact::BatchOrder{n_tok, 0}, nullptr));
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (int i = 0; i < 3; ++i) {
        const auto got = dy[i]->download();
        int bad = 0;
        for (int t = 0; t < n_tok; ++t) {
          for (int r = 0; r < rows[i]; ++r) {
            const float want = cpu_dot(type, true, w[i].f.data() + static_cast<size_t>(r) * cols,
                                       a.data() + static_cast<size_t>(t) * cols, cols);
            bad += bits(want) != bits(got[static_cast<size_t>(t) * rows[i] + r]) ? 1 : 0;
          }
        }
        EXPECT_EQ(bad, 0) << ggml_type_name(static_cast<uint32_t>(type)) << " weight " << i
                          << " n_tok " << n_tok;
      }
    }
  }
}

// What matmul_float_multi must refuse (returning false before any launch, so that the caller
// runs matmul per weight): checked on the host, no GPU needed.
// REQ: M0-W-1430 M0-W-1431
TEST(ExactFloatHost, MultiWeightRefusesWhatOneLaunchCannotTake) {
  alignas(16) static float dummy[4];
  kern::WeightView wv[3];
  const int rows[3] = {64, 36, 132};
  for (int i = 0; i < 3; ++i) {
    wv[i].data = dummy;
    wv[i].type = static_cast<uint32_t>(GgmlType::F16);
    wv[i].rows = rows[i];
    wv[i].cols = 96;
    wv[i].row_bytes = 96 * 2;
  }
  float* ys[3] = {dummy, dummy, dummy};
  kern::exact::ActBuf ab;
  ab.f = dummy;
  const auto refused = [&](const kern::WeightView(&w)[3], int n, int n_tok,
                           kern::exact::BatchOrder o) {
    const kern::WeightView* ws[3] = {&w[0], &w[1], &w[2]};
    return !kern::exact::detail::matmul_float_multi(ws, ys, n, ab, n_tok, o, nullptr);
  };
  EXPECT_TRUE(refused(wv, 3, 1, {1, 0}));   // one token: vec_dot order
  EXPECT_TRUE(refused(wv, 3, 8, {12, 0}));  // a slice of a larger batch
  EXPECT_TRUE(refused(wv, 3, 8, {8, 2}));
  EXPECT_TRUE(refused(wv, 0, 8, {8, 0}));
  EXPECT_TRUE(refused(wv, 4, 8, {8, 0}));
  const auto with = [&](int i, auto change) {
    kern::WeightView w[3] = {wv[0], wv[1], wv[2]};
    change(w[i]);
    return refused(w, 3, 8, {8, 0});
  };
  EXPECT_TRUE(with(1, [](kern::WeightView& w) { w.rows = 35; }));  // rows % 4: vec_dot order
  EXPECT_TRUE(with(2, [](kern::WeightView& w) { w.type = static_cast<uint32_t>(GgmlType::BF16); }));
  EXPECT_TRUE(with(1, [](kern::WeightView& w) { w.cols = 128, w.row_bytes = 256; }));
  EXPECT_TRUE(with(2, [](kern::WeightView& w) { w.row_bytes = 96; }));  // shorter than a row
  {
    kern::WeightView w[3] = {wv[0], wv[1], wv[2]};
    for (kern::WeightView& x : w) x.cols = 100, x.row_bytes = 200;  // cols % 16: vec_dot order
    EXPECT_TRUE(refused(w, 3, 8, {8, 0}));
  }
  EXPECT_TRUE(with(0, [](kern::WeightView& w) { w.rows = 0; }));
  for (kern::WeightView& w : wv) {
    w.type = static_cast<uint32_t>(GgmlType::Q8_0);
    w.row_bytes = 3 * 34;
  }
  EXPECT_TRUE(refused(wv, 3, 8, {8, 0}));  // not a float type
}

// Batches tinyBLAS does not take: rows % 4 != 0, or cols % 16 != 0 (F32/F16) / % 32 != 0
// (BF16): vec_dot order for every token.
// REQ: M0-W-1430 M0-W-1431 M0-W-1810
TEST(ExactFloatGpu, BatchVecdotBitExact) {
  REQUIRE_GPU();
  std::vector<Case> cases = {
      {130, 896, 2},  {130, 256, 3}, {2051, 64, 5},   {7, 4864, 4},  {256, 172, 8},
      {130, 172, 17}, {896, 200, 3}, {131, 1024, 64}, {172, 100, 2},
  };
  Case acc{130, 896, 5};
  acc.accumulate = true;
  cases.push_back(acc);
  run_cases(cases, 300);
}

// A call that computes a slice of a bigger batch: the order is the whole batch's.
// REQ: M0-W-1430 M0-W-1810
TEST(ExactFloatGpu, BatchSliceUsesWholeBatchOrder) {
  REQUIRE_GPU();
  std::vector<Case> cases;
  Case a{896, 256, 32};  // tinyBLAS (batch of 64)
  a.batch_n = 64, a.t0 = 32;
  cases.push_back(a);
  Case b{896, 896, 1};  // one token of a 5-token batch: tinyBLAS, not vec_dot
  b.batch_n = 5, b.t0 = 4;
  cases.push_back(b);
  Case c{130, 896, 4};  // rows % 4 != 0: vec_dot whatever the batch
  c.batch_n = 64, c.t0 = 60;
  cases.push_back(c);
  Case d{172, 768, 3};
  d.batch_n = 8, d.t0 = 5, d.accumulate = true;
  cases.push_back(d);
  run_cases(cases, 400);
}

// Weights or activations not 16-byte aligned: the scalar-load variants of both kernels.
// REQ: M0-W-1430 M0-W-1431 M0-W-1810
TEST(ExactFloatGpu, UnalignedPointersBitExact) {
  REQUIRE_GPU();
  std::vector<Case> cases;
  for (const Case& base : {Case{896, 896, 1}, Case{172, 256, 5}, Case{130, 172, 3}}) {
    Case c = base;
    c.w_off = 4;
    cases.push_back(c);
    c.w_off = 0, c.a_off = 4;
    cases.push_back(c);
  }
  run_cases(cases, 500);
}

// Same inputs twice: the same bits (no atomics, fixed trees).
// REQ: M0-W-1430 M0-W-1810
TEST(ExactFloatGpu, Deterministic) {
  REQUIRE_GPU();
  for (GgmlType type : kFloatTypes) {
    EXPECT_EQ(run_case(type, Case{896, 896, 1}, 7), 0);
    EXPECT_EQ(run_case(type, Case{896, 896, 1}, 7), 0);
  }
}

// tinyBLAS's permuted activation rows (xf::tb_perm_pos, ActBuf::fp): a permutation of each
// row's tb_perm_cols(cols) positions in which the 16-byte slot 64q + 4l holds lane l's steps
// 64q + 16s + l, s = 0 .. 3, in order (what the kernel's LDS.128 reads).
// REQ: M0-W-1430
TEST(ExactFloatHost, TinyblasActivationPermutation) {
  for (const int cols : {16, 64, 96, 896, 4864}) {
    const int np = kern::exact::xf::tb_perm_cols(cols);
    EXPECT_EQ(np % 64, 0);
    EXPECT_GE(np, cols);
    EXPECT_LT(np - cols, 64);
    std::vector<int> seen(static_cast<size_t>(np), 0);
    for (int c = 0; c < np; ++c) ++seen[static_cast<size_t>(kern::exact::xf::tb_perm_pos(c))];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), np) << "cols " << cols;
    for (int q = 0; q < np / 64; ++q) {
      for (int l = 0; l < 16; ++l) {
        for (int st = 0; st < 4; ++st) {
          EXPECT_EQ(kern::exact::xf::tb_perm_pos(64 * q + 16 * st + l), 64 * q + 4 * l + st);
        }
      }
    }
  }
}

// Bad inputs are refused with an error naming the problem (before any launch: no GPU needed).
// REQ: M0-W-1431
TEST(ExactFloatHost, RejectsBadShapes) {
  kern::WeightView wv;
  wv.type = static_cast<uint32_t>(GgmlType::Q4_K);
  wv.rows = 4;
  wv.cols = 256;
  wv.row_bytes = 144;
  kern::exact::ActBuf ab;
  EXPECT_THROW(kern::exact::detail::matmul_float(wv, ab, 1, {}, nullptr, false, nullptr),
               std::exception);
  wv.type = static_cast<uint32_t>(GgmlType::F16);
  wv.row_bytes = 100;  // < 256 * 2
  EXPECT_THROW(kern::exact::detail::matmul_float(wv, ab, 1, {}, nullptr, false, nullptr),
               std::exception);
  wv.row_bytes = 512;
  kern::exact::BatchOrder o;
  o.batch_n = 2;  // fewer than n_tok
  EXPECT_THROW(kern::exact::detail::matmul_float(wv, ab, 3, o, nullptr, false, nullptr),
               std::exception);
  // a tinyBLAS product (F16, 8 tokens) without the permuted activations' scratch (ActBuf::fp)
  o.batch_n = 8;
  EXPECT_THROW(kern::exact::detail::matmul_float(wv, ab, 8, o, nullptr, false, nullptr),
               std::exception);
}

// The 0.5B model's decode shapes (F16 weights), every output of one launch bit for bit
// (timings: bench/kernel_bench). Weights are filled by a cheap generator: the LM head has
// 136M elements.
// REQ: M0-W-1430 M0-W-1810
TEST(ExactFloatGpu, DecodeMatchesCpuAtModelShapes) {
  REQUIRE_GPU();
  struct Shape {
    const char* name;
    int rows, cols;
  };
  const Shape shapes[] = {{"q 896x896", 896, 896},
                          {"k 128x896", 128, 896},
                          {"gate 4864x896", 4864, 896},
                          {"down 896x4864", 896, 4864},
                          {"lm_head 151936x896", 151936, 896}};
  const GgmlType type = GgmlType::F16;
  uint32_t state = 12345u;
  auto next = [&state] {  // xorshift32, values in (-1, 1) without 0
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return (static_cast<float>(state >> 8) + 0.5f) / 8388608.0f - 1.0f;
  };
  for (const Shape& sh : shapes) {
    if (quick_env() && sh.rows > 10000) continue;
    const size_t n = static_cast<size_t>(sh.rows) * static_cast<size_t>(sh.cols);
    std::vector<uint8_t> bytes(n * 2);
    std::vector<float> wf(n);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = fp32_to_fp16(next());
      std::memcpy(bytes.data() + 2 * i, &h, 2);
      wf[i] = fp16_to_fp32(h);
    }
    std::vector<float> xraw(static_cast<size_t>(sh.cols));
    for (auto& v : xraw) v = next() * 4.0f;
    cpu::QuantizedActivation qa;
    cpu::quantize_activation(type, xraw.data(), sh.cols, qa);
    DevArray<uint8_t> dw(bytes);
    DevArray<float> dx(qa.f);
    DevArray<float> dy(static_cast<size_t>(sh.rows));
    kern::WeightView wv;
    wv.data = dw.get();
    wv.type = static_cast<uint32_t>(type);
    wv.rows = sh.rows;
    wv.cols = sh.cols;
    wv.row_bytes = static_cast<size_t>(sh.cols) * 2;
    kern::exact::ActBuf ab;
    ab.f = dx.get();
    kern::exact::detail::matmul_float(wv, ab, 1, {}, dy.get(), false, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dy.download();
    int bad = 0;
    for (int r = 0; r < sh.rows; ++r) {
      const float want =
          cpu::dot_vecdot(wf.data() + static_cast<size_t>(r) * sh.cols, qa.f.data(), sh.cols, true);
      if (bits(want) != bits(got[static_cast<size_t>(r)]) && bad++ < 5)
        std::printf("  mismatch %s r %d got %a want %a\n", sh.name, r,
                    static_cast<double>(got[static_cast<size_t>(r)]), static_cast<double>(want));
    }
    EXPECT_EQ(bad, 0) << sh.name;
  }
}

// Prefill (tinyBLAS order, 512 tokens, F16 and BF16) at the 0.5B FFN shapes: a sample of the
// outputs (every 37th row, every token) bit for bit (the whole output would take the CPU
// reference too long; timings: bench/kernel_bench).
// REQ: M0-W-1430 M0-W-1810
TEST(ExactFloatGpu, PrefillMatchesCpuAtModelShapes) {
  REQUIRE_GPU();
  struct Shape {
    const char* name;
    int rows, cols;
  };
  const Shape shapes[] = {{"gate 4864x896", 4864, 896}, {"down 896x4864", 896, 4864}};
  const int n_tok = quick_env() ? 48 : 512;  // > 16: the 8x8-chain tinyBLAS kernel
  std::mt19937 rng(77);
  for (GgmlType type : {GgmlType::F16, GgmlType::BF16}) {
    for (const Shape& sh : shapes) {
      const Weights w = random_weights(type, sh.rows, sh.cols, rng);
      const auto a = random_acts(type, n_tok, sh.cols, rng);
      DevArray<uint8_t> dw(w.bytes);
      DevArray<float> da(a);
      DevArray<float> dy(static_cast<size_t>(sh.rows) * n_tok);
      DevArray<float> dfp(fp_floats(n_tok, sh.cols));
      kern::WeightView wv;
      wv.data = dw.get();
      wv.type = static_cast<uint32_t>(type);
      wv.rows = sh.rows;
      wv.cols = sh.cols;
      wv.row_bytes = ggml_row_bytes(type, sh.cols);
      kern::exact::ActBuf ab;
      ab.f = da.get();
      ab.fp = dfp.get();
      kern::exact::BatchOrder order;
      order.batch_n = n_tok;
      ASSERT_TRUE(cpu::tinyblas_takes(type, sh.rows, n_tok, sh.cols));
      kern::exact::detail::matmul_float(wv, ab, n_tok, order, dy.get(), false, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = dy.download();
      int bad = 0;
      for (int r = 0; r < sh.rows; r += 37) {
        for (int t = 0; t < n_tok; ++t) {
          const size_t i = static_cast<size_t>(t) * sh.rows + r;
          const float want = cpu_dot(type, true, w.f.data() + static_cast<size_t>(r) * sh.cols,
                                     a.data() + static_cast<size_t>(t) * sh.cols, sh.cols);
          if (bits(want) != bits(got[i]) && bad++ < 5)
            std::printf("  mismatch %s r %d t %d got %a want %a\n", sh.name, r, t,
                        static_cast<double>(got[i]), static_cast<double>(want));
        }
      }
      EXPECT_EQ(bad, 0) << sh.name;
    }
  }
}

}  // namespace
}  // namespace worker
