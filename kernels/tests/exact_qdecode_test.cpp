// One-token quantized products (kernels/exact_qdecode.cu, exact::matvec1_quant) against the
// CPU reference (cpu::dot_quantized with repacked = cpu::repacked_on_x86, gemv), bit for bit:
//  - HOST EMULATION tests (ExactQDecodeHost.*, run everywhere): the kernel's decomposition
//    (per-lane unit slots, passes of 32 units, chain lanes, combine) replayed on the host
//    with the same __host__ __device__ functions (kernels/exact_qdecode_math.cuh).
//  - GPU tests (ExactQDecodeGpu.*, "not run" without a CUDA device): matvec1_quant over the
//    full NaN-poisoned outputs, accumulate on and off, and decode-shape timings next to
//    exact::matmul (n_tok 1) for the same weights.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "exact.cuh"
#include "exact_qdecode_math.cuh"
#include "gguf/ggml_types.h"
#include "matvec.cuh"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "gpu_test_util.h"
#pragma GCC diagnostic pop

namespace worker {
namespace {

namespace qd = kern::exact::qd;
using gputest::DevArray;
using kern::exact::ActBuf;

struct XorShift {
  uint64_t s;
  explicit XorShift(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) / static_cast<float>(1 << 24);
  }
};

void put_half(uint8_t* p, float f) {
  const uint16_t h = fp32_to_fp16(f);
  std::memcpy(p, &h, 2);
}

// Random valid blocks (as exact_quant_test.cpp builds them): random quants, sane fp16 scales.
std::vector<uint8_t> random_weights(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  XorShift rng(seed);
  const size_t rb = ggml_row_bytes(type, cols);
  std::vector<uint8_t> data(rb * static_cast<size_t>(rows));
  for (size_t i = 0; i < data.size(); i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(data.data() + i, &v, std::min<size_t>(8, data.size() - i));
  }
  const size_t bb = *ggml_type_block_bytes(static_cast<uint32_t>(type));
  const size_t nblk = data.size() / bb;
  for (size_t k = 0; k < nblk; ++k) {
    uint8_t* b = data.data() + k * bb;
    const float sign = (rng.next() & 7) == 0 ? -1.0f : 1.0f;
    switch (type) {
      case GgmlType::Q8_0:
        put_half(b, sign * rng.uniform(0.002f, 0.02f));
        for (int j = 0; j < 32; ++j)
          if (b[2 + j] == 0x80) b[2 + j] = 0x81;
        break;
      case GgmlType::Q4_0:
      case GgmlType::Q5_0: put_half(b, sign * rng.uniform(0.002f, 0.05f)); break;
      case GgmlType::Q4_K:
        put_half(b, rng.uniform(0.0005f, 0.01f));
        put_half(b + 2, rng.uniform(0.0005f, 0.01f));
        break;
      case GgmlType::Q6_K:
        for (int j = 0; j < 16; ++j)
          if (b[192 + j] == 0x80) b[192 + j] = 0x81;
        put_half(b + 208, sign * rng.uniform(0.0002f, 0.002f));
        break;
      default: break;
    }
  }
  return data;
}

cpu::QuantizedActivation random_act(GgmlType type, int64_t rows, int cols, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> mag(0.05f, 8.0f);
  std::normal_distribution<float> nd(0.0f, mag(rng));
  std::vector<float> x(static_cast<size_t>(cols));
  for (auto& v : x) v = nd(rng);
  cpu::QuantizedActivation a;
  cpu::quantize_activation(type, x.data(), cols, a);
  a.repacked = cpu::repacked_on_x86(type, rows);
  a.repack_gemm = false;
  return a;
}

std::vector<float> cpu_ref(GgmlType type, const std::vector<uint8_t>& w, int64_t rows, int cols,
                           const cpu::QuantizedActivation& a) {
  const size_t rb = ggml_row_bytes(type, cols);
  std::vector<float> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    y[static_cast<size_t>(r)] =
        cpu::dot_quantized(type, w.data() + rb * static_cast<size_t>(r), a, nullptr);
  return y;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

size_t count_mismatch(const std::vector<float>& got, const std::vector<float>& ref,
                      const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (bits(got[i]) != bits(ref[i])) {
      if (bad < 5)
        std::printf("  %s: mismatch at row %zu: got %a ref %a\n", what.c_str(), i,
                    static_cast<double>(got[i]), static_cast<double>(ref[i]));
      ++bad;
    }
  }
  return bad;
}

std::string type_str(GgmlType t) {
  return std::string(ggml_type_name(static_cast<uint32_t>(t)));
}

bool is_k(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}

// ---------------------------------------------------------------------------------------
// HOST EMULATION of qdecode_kernel's work on one tile of nr rows: 4 warps; warp w takes
// groups of G rows (g0 + 4 i); per pass of 32 units lane l computes unit p0 + l of every
// group row into the warp's slot arrays, then lane (j, c) steps chain c of group row j; the
// chains of row j (lanes j * kCL + k) combine in the reference's tree.
constexpr int kEmuWarps = 4;

template <GgmlType T, bool REP>
void emulate_tile(const uint8_t* tile, size_t rb, int nr, int cols,
                  const cpu::QuantizedActivation& a, float* y) {
  const int units = qd::units_of(cols);
  constexpr int kC = qd::chains<T, REP>();
  constexpr int kCL = qd::chain_lanes<T, REP>();
  constexpr int G = qd::group_rows<T, REP>();
  std::vector<int> S(qd::kWarpSlotInts);
  std::vector<float> F(qd::kWarpScaleFloats);
  for (int warp = 0; warp < kEmuWarps; ++warp) {
    for (int g0 = warp; g0 < nr; g0 += kEmuWarps * G) {
      float acc[32] = {};
      for (int p0 = 0; p0 < units; p0 += qd::kUnitsPerPass) {
        std::fill(S.begin(), S.end(), 0x7EADBEEF);  // stale slots must not be read
        for (int lane = 0; lane < 32; ++lane) {
          const int u = p0 + lane;
          if (u >= units) continue;
          uint32_t yw[8];
          qd::act_words(a.q.data(), u, yw);
          const float yd = qd::act_scale<T>(a.d.data(), u);
          for (int i = 0; i < G; ++i) {
            const int ri = g0 + kEmuWarps * i;
            if (ri < nr)
              qd::unit_slots<T, REP>(tile + static_cast<size_t>(ri) * rb, u, yw, yd, a.bsum.data(),
                                     S.data() + (i * qd::kUnitsPerPass + lane) * qd::kSlotStride,
                                     F.data() + (i * qd::kUnitsPerPass + lane) * qd::kScaleStride);
          }
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int j = lane / kCL, c = lane % kCL;
          if (j < G && c < kC && g0 + kEmuWarps * j < nr)
            acc[lane] =
                qd::chain_pass<T, REP>(c, S.data() + j * qd::kUnitsPerPass * qd::kSlotStride,
                                       F.data() + j * qd::kUnitsPerPass * qd::kScaleStride,
                                       std::min(qd::kUnitsPerPass, units - p0), acc[lane]);
        }
      }
      for (int j = 0; j < G; ++j) {
        const int r = g0 + kEmuWarps * j;
        if (r >= nr) continue;
        float v[kC];
        for (int k = 0; k < kC; ++k) v[k] = acc[j * kCL + k];
        y[r] = qd::combine<T, REP>(v);
      }
    }
  }
}

// HOST EMULATION of qdecode_long_kernel on one tile of nr rows: the 128 threads compute the
// slots of every (row, unit) item (thread t: items t, t + 128, ...) into [row][unit] arrays;
// then warp r's lanes c < chains step row r's chains over the whole row, 32 units a call.
template <GgmlType T, bool REP>
void emulate_long_tile(const uint8_t* tile, size_t rb, int nr, int cols,
                       const cpu::QuantizedActivation& a, float* y) {
  const int units = qd::units_of(cols);
  constexpr int kC = qd::chains<T, REP>();
  std::vector<int> S(static_cast<size_t>(nr * units * qd::kSlotStride), 0x7EADBEEF);
  std::vector<float> F(static_cast<size_t>(nr * units * qd::kScaleStride));
  for (int thread = 0; thread < 128; ++thread) {
    for (int it = thread; it < nr * units; it += 128) {
      const int rr = it / units, u = it - rr * units;
      uint32_t yw[8];
      qd::act_words(a.q.data(), u, yw);
      qd::unit_slots<T, REP>(tile + static_cast<size_t>(rr) * rb, u, yw,
                             qd::act_scale<T>(a.d.data(), u), a.bsum.data(),
                             S.data() + it * qd::kSlotStride, F.data() + it * qd::kScaleStride);
    }
  }
  for (int warp = 0; warp < nr; ++warp) {
    float v[kC] = {};
    for (int c = 0; c < kC; ++c)
      for (int p0 = 0; p0 < units; p0 += qd::kUnitsPerPass)
        v[c] = qd::chain_pass<T, REP>(c, S.data() + (warp * units + p0) * qd::kSlotStride,
                                      F.data() + (warp * units + p0) * qd::kScaleStride,
                                      std::min(qd::kUnitsPerPass, units - p0), v[c]);
    y[warp] = qd::combine<T, REP>(v);
  }
}

template <GgmlType T, bool REP>
void host_case(int rows, int cols, uint64_t seed) {
  const auto w = random_weights(T, rows, cols, seed);
  const auto a = random_act(T, rows, cols, seed + 1);
  ASSERT_EQ(a.repacked, REP);
  const auto ref = cpu_ref(T, w, rows, cols, a);
  const size_t rb = ggml_row_bytes(T, cols);
  std::vector<float> got(static_cast<size_t>(rows), std::nanf(""));
  for (int R : {1, 2, 16, 32}) {  // tiles of R rows, the last one partial
    for (int r0 = 0; r0 < rows; r0 += R)
      emulate_tile<T, REP>(w.data() + rb * static_cast<size_t>(r0), rb, std::min(R, rows - r0),
                           cols, a, got.data() + r0);
    EXPECT_EQ(count_mismatch(got, ref, type_str(T)), 0u)
        << type_str(T) << " rows " << rows << " cols " << cols << " tile " << R;
    std::fill(got.begin(), got.end(), std::nanf(""));
  }
  for (int R : {1, 2, 4}) {  // the long-row kernel
    for (int r0 = 0; r0 < rows; r0 += R)
      emulate_long_tile<T, REP>(w.data() + rb * static_cast<size_t>(r0), rb, std::min(R, rows - r0),
                                cols, a, got.data() + r0);
    EXPECT_EQ(count_mismatch(got, ref, type_str(T)), 0u)
        << type_str(T) << " rows " << rows << " cols " << cols << " long tile " << R;
    std::fill(got.begin(), got.end(), std::nanf(""));
  }
}

// HOST EMULATION
// REQ: M0-W-1311
TEST(ExactQDecodeHost, EmulationMatchesCpuBitwise) {
  for (int cols : {256, 896, 4864}) {
    host_case<GgmlType::Q8_0, false>(37, cols, 11);
    host_case<GgmlType::Q5_0, false>(34, cols, 12);
    host_case<GgmlType::Q4_0, false>(34, cols, 13);
    host_case<GgmlType::Q4_0, true>(32, cols, 14);
  }
  for (int cols : {256, 1024, 4864}) {
    host_case<GgmlType::Q6_K, false>(37, cols, 15);
    host_case<GgmlType::Q4_K, false>(34, cols, 16);
    host_case<GgmlType::Q4_K, true>(32, cols, 17);
  }
}

TEST(ExactQDecodeHost, TakesDecodeShapes) {
  using kern::exact::matvec1_quant_takes;
  for (auto t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0})
    for (int64_t cols : {256, 896, 4864})
      EXPECT_TRUE(matvec1_quant_takes(static_cast<uint32_t>(t), 896, cols));
  for (auto t : {GgmlType::Q4_K, GgmlType::Q6_K})
    for (int64_t cols : {256, 4864})
      EXPECT_TRUE(matvec1_quant_takes(static_cast<uint32_t>(t), 896, cols));
  EXPECT_FALSE(matvec1_quant_takes(static_cast<uint32_t>(GgmlType::Q4_K), 896, 896));
  EXPECT_FALSE(matvec1_quant_takes(static_cast<uint32_t>(GgmlType::F32), 896, 896));
  EXPECT_TRUE(matvec1_quant_takes(static_cast<uint32_t>(GgmlType::Q8_0), 151936, 896));
}

// ---------------------------------------------------------------------------------------
// GPU

struct DevAct {
  DevArray<uint8_t> buf;
  ActBuf a;
  DevAct(const cpu::QuantizedActivation& h, int cols)
      : buf(kern::exact::act_buffer_bytes(1, cols)) {
    a = kern::exact::act_buffer_at(buf.get(), 1, cols);
    cudaMemcpy(a.q, h.q.data(), h.q.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(a.d, h.d.data(), h.d.size() * sizeof(float), cudaMemcpyHostToDevice);
    if (!h.bsum.empty())
      cudaMemcpy(a.bsum, h.bsum.data(), h.bsum.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  }
};

kern::WeightView view(GgmlType t, const DevArray<uint8_t>& d, int64_t rows, int cols) {
  kern::WeightView w;
  w.data = d.get();
  w.type = static_cast<uint32_t>(t);
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = ggml_row_bytes(t, cols);
  return w;
}

// Runs matvec1_quant (accumulate off, then on over a known y) and compares with the CPU.
void gpu_case(GgmlType t, int64_t rows, int cols, uint64_t seed) {
  SCOPED_TRACE(type_str(t) + " rows " + std::to_string(rows) + " cols " + std::to_string(cols));
  ASSERT_TRUE(kern::exact::matvec1_quant_takes(static_cast<uint32_t>(t), rows, cols));
  const auto w = random_weights(t, rows, cols, seed);
  const auto a = random_act(t, rows, cols, seed + 7);
  const auto ref = cpu_ref(t, w, rows, cols, a);
  DevArray<uint8_t> dw(w);
  DevAct da(a, cols);
  DevArray<float> dy(static_cast<size_t>(rows));  // NaN-poisoned
  kern::exact::matvec1_quant(view(t, dw, rows, cols), da.a, dy.get(), false, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(count_mismatch(dy.download(), ref, "plain"), 0u);
  // accumulate: y = y0 + dot, one rounding
  std::vector<float> y0(static_cast<size_t>(rows)), ref_acc(static_cast<size_t>(rows));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t i = 0; i < y0.size(); ++i) {
    y0[i] = nd(rng);
    ref_acc[i] = y0[i] + ref[i];
  }
  dy.upload(y0);
  kern::exact::matvec1_quant(view(t, dw, rows, cols), da.a, dy.get(), true, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(count_mismatch(dy.download(), ref_acc, "accumulate"), 0u);
  // Weights at a 2-byte (not 16-byte) aligned address, as a view into a packed buffer.
  DevArray<uint8_t> dw2(w.size() + 16);
  CK(cudaMemcpy(dw2.get() + 6, w.data(), w.size(), cudaMemcpyHostToDevice));
  kern::WeightView wv2 = view(t, dw, rows, cols);
  wv2.data = dw2.get() + 6;
  dy.poison();
  kern::exact::matvec1_quant(wv2, da.a, dy.get(), false, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(count_mismatch(dy.download(), ref, "unaligned"), 0u);
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, Q0TypesBitwise) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (auto t : {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0})
    for (int64_t rows : {896, 128, 4864, 130})
      for (int cols : {896, 4864, 256}) gpu_case(t, rows, cols, ++seed);
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, KQuantsBitwise) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (auto t : {GgmlType::Q6_K, GgmlType::Q4_K})
    for (int64_t rows : {896, 128, 4864, 130})
      for (int cols : {4864, 256, 1024}) gpu_case(t, rows, cols, ++seed);
}

// REQ: M0-W-1311
TEST(ExactQDecodeGpu, LmHeadQ8_0Bitwise) {
  REQUIRE_GPU();
  gpu_case(GgmlType::Q8_0, 151936, 896, 300);
}

// Decode-shape timings (CUDA events over 50 calls) of matvec1_quant next to exact::matmul
// with n_tok 1; both outputs also checked bit for bit against each other.
// REQ: M0-W-1311
TEST(ExactQDecodeGpu, DecodeShapeTimings) {
  REQUIRE_GPU();
  struct Shape {
    GgmlType t;
    int64_t rows;
    int cols;
    const char* what;
  };
  const Shape shapes[] = {
      {GgmlType::Q5_0, 4864, 896, "ffn gate/up"},   {GgmlType::Q5_0, 896, 896, "attn q/o"},
      {GgmlType::Q5_0, 128, 896, "attn k/v"},       {GgmlType::Q6_K, 896, 4864, "ffn down Q6_K"},
      {GgmlType::Q4_K, 896, 4864, "ffn down Q4_K"}, {GgmlType::Q4_0, 4864, 896, "Q4_0 4864x896"},
      {GgmlType::Q8_0, 4864, 896, "Q8_0 4864x896"}, {GgmlType::Q8_0, 151936, 896, "LM head Q8_0"},
  };
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const auto& sh : shapes) {
    const auto w = random_weights(sh.t, sh.rows, sh.cols, 400);
    const auto a = random_act(sh.t, sh.rows, sh.cols, 401);
    DevArray<uint8_t> dw(w);
    DevAct da(a, sh.cols);
    DevArray<float> y1(static_cast<size_t>(sh.rows)), y2(static_cast<size_t>(sh.rows));
    const auto wv = view(sh.t, dw, sh.rows, sh.cols);
    const int kIters = 50;
    float ms_new = 0, ms_old = 0;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms up
      CK(cudaEventRecord(e0, s));
      for (int i = 0; i < kIters; ++i) kern::exact::matvec1_quant(wv, da.a, y1.get(), false, s);
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms_new, e0, e1));
      CK(cudaEventRecord(e0, s));
      for (int i = 0; i < kIters; ++i)
        kern::exact::matmul(wv, da.a, 1, kern::exact::BatchOrder{}, y2.get(), false, s);
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms_old, e0, e1));
    }
    const double mb = static_cast<double>(w.size()) / 1e6;
    const double us_new = 1000.0 * static_cast<double>(ms_new) / kIters,
                 us_old = 1000.0 * static_cast<double>(ms_old) / kIters;
    std::printf(
        "  %-16s %-5s %6lldx%-5d %8.2f MB: matvec1_quant %8.2f us (%6.0f GB/s)  matmul %8.2f us\n",
        sh.what, type_str(sh.t).c_str(), static_cast<long long>(sh.rows), sh.cols, mb, us_new,
        mb * 1e-3 / (us_new * 1e-6), us_old);
    EXPECT_EQ(count_mismatch(y1.download(), y2.download(), std::string("vs matmul ") + sh.what),
              0u);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace worker
