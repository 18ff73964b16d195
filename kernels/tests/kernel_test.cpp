// Each CUDA kernel against a CPU reference on random inputs at several shapes (M0-W-1430,
// 1431, 1810): dequantization uses worker/gguf's dequantize_row (the CPU reference of the
// block formats), sums are in double, outputs are poisoned with NaN before each launch,
// and errors are relative (||got - ref|| / ||ref||) with a bound per precision.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "cuda_check.h"
#include "embed.cuh"
#include "engine/cpu/act_quant.h"
#include "engine/sampler.h"
#include "gguf/ggml_types.h"
#include "gpu_test_util.h"
#include "sampling.cuh"
#include "weights.cuh"

namespace worker {
namespace {

using gputest::DevArray;
using gputest::rel_err;

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                              GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K};

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Random rows of `type`: random bytes with the fp16 scale fields set to sane magnitudes
// (random bytes there would be NaN/Inf or huge).
std::vector<uint8_t> random_rows(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t rb = ggml_row_bytes(type, cols);
  std::vector<uint8_t> data(rb * static_cast<size_t>(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.002f, 0.05f);
  auto put_half = [&](uint8_t* p, float f) {
    const uint16_t h = fp32_to_fp16(f);
    std::memcpy(p, &h, 2);
  };
  switch (type) {
    case GgmlType::F32: {
      auto v = randn(data.size() / 4, rng);
      std::memcpy(data.data(), v.data(), data.size());
      return data;
    }
    case GgmlType::F16:
    case GgmlType::BF16: {
      auto v = randn(data.size() / 2, rng);
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = type == GgmlType::F16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
        std::memcpy(data.data() + 2 * i, &h, 2);
      }
      return data;
    }
    default: break;
  }
  for (auto& b : data) b = static_cast<uint8_t>(byte(rng));
  const size_t bb = *ggml_type_block_bytes(static_cast<uint32_t>(type));
  for (size_t off = 0; off < data.size(); off += bb) {
    uint8_t* b = data.data() + off;
    switch (type) {
      case GgmlType::Q8_0:
      case GgmlType::Q4_0:
      case GgmlType::Q5_0: put_half(b, sc(rng)); break;
      case GgmlType::Q4_K:
        put_half(b, sc(rng));
        put_half(b + 2, sc(rng));
        break;
      case GgmlType::Q6_K: put_half(b + 208, sc(rng) * 0.1f); break;
      default: break;
    }
  }
  return data;
}

std::vector<float> dequant_all(GgmlType type, const std::vector<uint8_t>& data, int64_t rows,
                               int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const size_t rb = ggml_row_bytes(type, cols);
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(type, data.data() + r * rb, out.data() + r * cols, cols);
  return out;
}

// The activations as the CPU reference rounds them for a weight type (act_quant.h).
std::vector<float> rounded(GgmlType t, const float* x, int64_t n) {
  cpu::QuantizedActivation qa;
  cpu::quantize_activation(t, x, n, qa);
  if (!qa.f.empty()) return qa.f;
  const int64_t blk = (t == GgmlType::Q4_K || t == GgmlType::Q6_K) ? 256 : 32;
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(qa.q[i]) * qa.d[i / blk];
  return out;
}
std::vector<float> rounded_rows(GgmlType t, const std::vector<float>& x, int n_tok, int64_t cols) {
  std::vector<float> out;
  for (int r = 0; r < n_tok; ++r) {
    auto v = rounded(t, x.data() + r * cols, cols);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

struct Shape {
  int64_t rows, cols;
  int n_tok;
};

std::string tname(GgmlType t) {
  return std::string(ggml_type_name(static_cast<uint32_t>(t)));
}

// REQ: M0-W-1430 M0-W-1031 WRK-D15
TEST(KernelGemm, CublasFloatTypesMatchReference) {
  REQUIRE_GPU();
  std::mt19937 rng(99);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), CUBLAS_STATUS_SUCCESS);
  const Shape shapes[] = {{64, 256, 16}, {896, 896, 37}, {200, 4864, 64}, {151, 172, 20}};
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    for (const Shape& s : shapes) {
      for (bool acc : {false, true}) {
        auto w = random_rows(type, s.rows, s.cols, rng);
        auto x = randn(static_cast<size_t>(s.n_tok * s.cols), rng);
        auto y0 = randn(static_cast<size_t>(s.n_tok * s.rows), rng);
        const auto wf = dequant_all(type, w, s.rows, s.cols);
        const auto xr = rounded_rows(type, x, s.n_tok, s.cols);
        std::vector<double> ref(y0.size());
        for (int t = 0; t < s.n_tok; ++t)
          for (int64_t r = 0; r < s.rows; ++r) {
            double a = acc ? y0[t * s.rows + r] : 0.0;
            for (int64_t j = 0; j < s.cols; ++j)
              a += static_cast<double>(wf[r * s.cols + j]) * xr[t * s.cols + j];
            ref[t * s.rows + r] = a;
          }
        DevArray<uint8_t> dw(w);
        DevArray<float> dx(x), dy(y0.size());
        DevArray<uint16_t> lowp(x.size());
        if (acc) dy.upload(y0);
        kern::WeightView v{dw.get(), static_cast<uint32_t>(type), s.rows, s.cols,
                           ggml_row_bytes(type, s.cols)};
        kern::gemm_cublas(h, v, dx.get(), lowp.get(), dy.get(), s.n_tok, acc, nullptr);
        // activations rounded as the reference does: only FP32 accumulation differs
        const double bound = 1e-5;
        const auto got = dy.download();
        EXPECT_LT(rel_err(got, ref), bound)
            << tname(type) << " rows=" << s.rows << " cols=" << s.cols << " n_tok=" << s.n_tok;
        // Repetition gives identical bits (D15).
        if (acc) dy.upload(y0);
        kern::gemm_cublas(h, v, dx.get(), lowp.get(), dy.get(), s.n_tok, acc, nullptr);
        const auto again = dy.download();
        EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4)) << tname(type);
      }
    }
  }
  cublasDestroy(h);
}

// REQ: M0-W-1201 M0-W-1430 M0-W-1810 WRK-D2
TEST(KernelEmbed, AllTypesGatherDequantizedRows) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  for (GgmlType type : kAllTypes) {
    const int64_t rows = 300, cols = 512;
    auto w = random_rows(type, rows, cols, rng);
    const auto wf = dequant_all(type, w, rows, cols);
    std::vector<int32_t> ids = {0, 299, 17, 17, 150, 3, 298};
    DevArray<uint8_t> dw(w);
    DevArray<int32_t> dids(ids);
    DevArray<float> out(ids.size() * cols);
    kern::WeightView v{dw.get(), static_cast<uint32_t>(type), rows, cols,
                       ggml_row_bytes(type, cols)};
    kern::embed(v, dids.get(), static_cast<int>(ids.size()), out.get(), nullptr);
    const auto got = out.download();
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t j = 0; j < cols; ++j)
        ASSERT_EQ(got[t * cols + j], wf[ids[t] * cols + j])
            << tname(type) << " token " << ids[t] << " elem " << j;
  }
}

// REQ: M0-W-1430 M0-W-1431 M0-W-1810 M0-W-1031 WRK-D15
TEST(KernelAttention, CausalGqaOverFp16CacheMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(31);
  struct C {
    int nh, nkv, hd, n_past, n_tok;
  };
  // Prompt batches (n_tok > 1) with head_dim 32 / 64 / 128 over the FP16 cache take the
  // tensor-core kernel (FP16 queries and probabilities: 3e-3 relative RMS error allowed);
  // every other case, and the FP32 cache, the FP32 kernel (1e-5).
  const C cases[] = {{14, 2, 64, 0, 1},   {14, 2, 64, 511, 1},   {8, 4, 8, 0, 12},
                     {4, 1, 128, 33, 20}, {6, 6, 32, 2000, 1},   {2, 2, 256, 7, 5},
                     {4, 2, 48, 100, 3},  {14, 2, 64, 3, 40},    {4, 4, 64, 1, 70},
                     {14, 2, 64, 0, 512}, {14, 2, 64, 700, 130}, {8, 2, 32, 5, 100},
                     {4, 2, 128, 90, 77}};
  for (const C& c : cases) {
    const int n_ctx = c.n_past + c.n_tok, kd = c.nkv * c.hd, qd = c.nh * c.hd;
    auto q = randn(static_cast<size_t>(c.n_tok * qd), rng);
    auto kf = randn(static_cast<size_t>(n_ctx * kd), rng, 2.0f),
         vf = randn(static_cast<size_t>(n_ctx * kd), rng);
    std::vector<__half> kh(kf.size()), vh(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      kh[i] = __float2half(kf[i]);
      vh[i] = __float2half(vf[i]);
    }
    std::vector<double> ref(q.size());
    for (int t = 0; t < c.n_tok; ++t)
      for (int h = 0; h < c.nh; ++h) {
        const int g = h / (c.nh / c.nkv), n = c.n_past + t + 1;
        std::vector<double> s(n);
        double mx = -1e300;
        for (int p = 0; p < n; ++p) {
          double a = 0;
          for (int d = 0; d < c.hd; ++d)
            a += static_cast<double>(q[t * qd + h * c.hd + d]) *
                 __half2float(kh[p * kd + g * c.hd + d]);
          s[p] = a / std::sqrt(static_cast<double>(c.hd));
          mx = std::max(mx, s[p]);
        }
        double sum = 0;
        for (auto& x : s) {
          x = std::exp(x - mx);
          sum += x;
        }
        for (int d = 0; d < c.hd; ++d) {
          double o = 0;
          for (int p = 0; p < n; ++p) o += s[p] / sum * __half2float(vh[p * kd + g * c.hd + d]);
          ref[t * qd + h * c.hd + d] = o;
        }
      }
    DevArray<float> dq(q), out(q.size());
    DevArray<float> part(std::max<size_t>(1, kern::attention_partial_floats(c.n_tok, c.nh, c.hd)));
    DevArray<__half> dk(kh), dv(vh);
    DevArray<int32_t> npast(std::vector<int32_t>{c.n_past});
    kern::attention(dq.get(), dk.get(), dv.get(), false, out.get(), c.n_tok, c.nh, c.nkv, c.hd,
                    npast.get(), part.get(), nullptr);
    const auto got = out.download();
    const bool tensor_cores = c.n_tok > 1 && (c.hd == 32 || c.hd == 64 || c.hd == 128);
    EXPECT_LT(rel_err(got, ref), tensor_cores ? 3e-3 : 1e-5)
        << "nh=" << c.nh << " nkv=" << c.nkv << " hd=" << c.hd << " n_past=" << c.n_past
        << " n_tok=" << c.n_tok;
    {  // FP32 cache holding the same (half-representable) values gives the same result
      std::vector<float> k32(kh.size()), v32(vh.size());
      for (size_t i = 0; i < kh.size(); ++i) {
        k32[i] = __half2float(kh[i]);
        v32[i] = __half2float(vh[i]);
      }
      DevArray<float> dk32(k32), dv32(v32), out32(q.size());
      kern::attention(dq.get(), dk32.get(), dv32.get(), true, out32.get(), c.n_tok, c.nh, c.nkv,
                      c.hd, npast.get(), part.get(), nullptr);
      EXPECT_LT(rel_err(out32.download(), ref), 1e-5) << "fp32 cache";
    }
    out.poison();
    kern::attention(dq.get(), dk.get(), dv.get(), false, out.get(), c.n_tok, c.nh, c.nkv, c.hd,
                    npast.get(), part.get(), nullptr);
    const auto again = out.download();
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4))
        << "attention not reproducible";
  }
}

struct SampleBufs {
  explicit SampleBufs(int V, int hist_cap)
      : work(V),
        keys(V),
        ids(V),
        ids_sorted(V),
        weights(V),
        seen(V),
        temp(kern::sampling_sort_temp_bytes(V)),
        params(1),
        history(hist_cap),
        out(1),
        io(2),
        part_v(kern::kArgmaxBlocks),
        part_i(kern::kArgmaxBlocks),
        part_h(kern::kArgmaxBlocks) {
    s.work = work.get();
    s.keys_sorted = keys.get();
    s.ids = ids.get();
    s.ids_sorted = ids_sorted.get();
    s.part_v = part_v.get();
    s.part_i = part_i.get();
    s.part_h = part_h.get();
    s.weights = weights.get();
    s.seen = seen.get();
    s.sort_temp = temp.get();
    s.sort_temp_bytes = temp.size();
    kern::sampling_init(s, V, nullptr);
  }
  DevArray<float> work, keys;
  DevArray<int32_t> ids, ids_sorted;
  DevArray<uint64_t> weights;
  DevArray<int32_t> seen;
  DevArray<uint8_t> temp;
  DevArray<kern::SampleParams> params;
  DevArray<int32_t> history;
  DevArray<kern::SampleOut> out;
  DevArray<int32_t> io;  // the next decode step's input: n_past, id
  DevArray<float> part_v;
  DevArray<int32_t> part_i;
  DevArray<uint64_t> part_h;
  kern::SampleScratch s;
};

kern::SampleOut gpu_sample(SampleBufs& b, const DevArray<float>& logits, int V,
                           const SamplingParams& sp, const std::vector<int32_t>& hist,
                           std::mt19937_64& rng) {
  kern::SampleParams p;
  p.temperature = sp.temperature;
  p.top_p = sp.top_p;
  p.min_p = sp.min_p;
  p.repetition_penalty = sp.repetition_penalty;
  p.top_k = sp.top_k;
  p.n_history = static_cast<int32_t>(hist.size());
  const bool greedy = !(sp.temperature > 0.0f);
  p.draw = greedy ? 0 : sampler_draw(rng);
  b.params.upload({p});
  if (!hist.empty()) b.history.upload(hist);
  b.out.poison();
  b.io.poison();
  const bool penalize = sp.repetition_penalty != 1.0f && !hist.empty();
  // The sink as sample_and_continue gives it: the next decode step's input too.
  const int32_t n_past = 1 + static_cast<int32_t>(hist.size());
  kern::sample(logits.get(), V, b.params.get(), greedy, penalize, b.history.get(), b.s,
               {b.out.get(), b.io.get(), n_past}, nullptr);
  const kern::SampleOut out = b.out.download()[0];
  const std::vector<int32_t> io = b.io.download();
  EXPECT_EQ(io[0], n_past);
  EXPECT_EQ(io[1], out.id);
  return out;
}

// Logits that stress every place where two samplers could part: exact ties at the top and
// inside the kept set, -0 beside +0, values one ulp apart, a long flat tail, huge spreads.
std::vector<float> adversarial_logits(int V, std::mt19937& rng, int trial) {
  auto l = randn(static_cast<size_t>(V), rng, 3.0f);
  std::uniform_int_distribution<int> pick(0, V - 1);
  switch (trial % 6) {
    case 0:  // an exact tie at the top
      l[static_cast<size_t>(V / 2)] = l[static_cast<size_t>(V / 3)] = 40.0f;
      break;
    case 1:  // many exact ties and signed zeros
      for (int i = 0; i < V / 4; ++i) l[static_cast<size_t>(pick(rng))] = (i % 2) ? 0.0f : -0.0f;
      for (int i = 0; i < V / 8; ++i) l[static_cast<size_t>(pick(rng))] = 1.5f;
      break;
    case 2:  // neighbours one ulp apart
      for (int i = 0; i + 1 < V; i += 2)
        l[static_cast<size_t>(i + 1)] = std::nextafter(l[static_cast<size_t>(i)], 100.0f);
      break;
    case 3:  // quantized logits: few distinct values
      for (auto& x : l) x = std::round(x * 4.0f) / 4.0f;
      break;
    case 4:  // a wide spread: most weights underflow to 0
      for (auto& x : l) x *= 20.0f;
      break;
    default: break;
  }
  return l;
}

// The GPU sampler picks exactly the CPU sampler's id for the same logits and the same
// random stream, over every stage of the pipeline, and reports the CPU's logits hash.
// REQ: M0-W-1421 M0-W-1430 M0-W-1031 M0-W-1810 WRK-D15 WRK-D18
TEST(KernelSampling, MatchesCpuSamplerIdForId) {
  REQUIRE_GPU();
  std::mt19937 rng(51);
  const SamplingParams configs[] = {
      {0.0f, 1.0f, 0, 0.0f, 1.0f, 0},   {0.0f, 1.0f, 0, 0.0f, 1.3f, 0},
      {0.7f, 1.0f, 0, 0.0f, 1.0f, 0},   {0.7f, 0.9f, 40, 0.05f, 1.1f, 0},
      {1.5f, 0.5f, 0, 0.0f, 0.8f, 0},   {1.0f, 1.0f, 5, 0.0f, 1.0f, 0},
      {0.3f, 0.95f, 0, 0.1f, 1.2f, 0},  {2.0f, 1.0f, 1, 0.0f, 1.0f, 0},
      {0.05f, 0.99f, 0, 0.0f, 1.0f, 0}, {1.0f, 0.999f, 1000, 0.001f, 1.05f, 0}};
  // WORKER_KERNEL_TEST_QUICK (set under compute-sanitizer racecheck): smaller vocabularies.
  const bool quick = std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
  const std::vector<int> vocabs =
      quick ? std::vector<int>{512, 5000} : std::vector<int>{512, 32000, 151936};
  int draws = 0;
  for (int V : vocabs) {
    SampleBufs b(V, 256);
    DevArray<float> dl(static_cast<size_t>(V));
    for (const auto& sp : configs) {
      std::mt19937_64 cpu_rng(777), gpu_rng(777);
      for (int trial = 0; trial < (quick ? 6 : 24); ++trial) {
        const auto logits = adversarial_logits(V, rng, trial);
        std::vector<int32_t> hist;
        std::uniform_int_distribution<int> id(0, V - 1);
        for (int i = 0; i < 50; ++i) hist.push_back(id(rng));
        hist.push_back(hist[0]);  // duplicates are penalised once
        dl.upload(logits);
        const int32_t want = sample_logits(logits, sp, hist, cpu_rng);
        const kern::SampleOut got = gpu_sample(b, dl, V, sp, hist, gpu_rng);
        ASSERT_EQ(got.id, want) << "V=" << V << " T=" << sp.temperature << " top_p=" << sp.top_p
                                << " top_k=" << sp.top_k << " min_p=" << sp.min_p
                                << " pen=" << sp.repetition_penalty << " trial=" << trial;
        ASSERT_EQ(got.logits_hash, logits_hash(logits)) << "V=" << V << " trial=" << trial;
        ++draws;
      }
      EXPECT_EQ(cpu_rng, gpu_rng) << "both samplers consume the same random stream";
    }
  }
  std::printf("sampler: %d GPU draws identical to the CPU sampler's (ids and logits hashes)\n",
              draws);
}

// REQ: M0-W-1421 M0-W-1032
TEST(KernelSampling, GreedyLowestIdWinsTies) {
  REQUIRE_GPU();
  const int V = 4099;
  std::vector<float> logits(V, -1.0f);
  logits[4000] = 5.0f;
  logits[77] = 5.0f;  // ties in different argmax blocks: the lowest id wins
  logits[3000] = 5.0f;
  SampleBufs b(V, 8);
  DevArray<float> dl(logits);
  std::mt19937_64 rng(1);
  EXPECT_EQ(gpu_sample(b, dl, V, SamplingParams{0.0f, 1.0f, 0, 0.0f, 1.0f, 0}, {}, rng).id, 77);
}

}  // namespace
}  // namespace worker
