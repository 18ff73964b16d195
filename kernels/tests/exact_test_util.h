#pragma once
// Helpers of the exact kernels' tests (exact_ops_test.cpp, exact_fused_test.cpp,
// attention_exact_test.cpp): bitwise comparison, the host emulation of the kernels' block-wide
// double sum and the ActBuf fields quantize_act writes (CPU reference and device copies).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cpu/act_quant.h"
#include "exact.cuh"
#include "gguf/ggml_types.h"
// gpu_test_util.h's error metrics promote floats to double (unused here).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "common/test_helpers.h"
#include "gpu_test_util.h"
#pragma GCC diagnostic pop

namespace worker::exacttest {

using test::bits;

// WORKER_KERNEL_TEST_QUICK (ci/gpu-run.sh sets it under compute-sanitizer): smaller sizes.
inline bool quick() {
  return std::getenv("WORKER_KERNEL_TEST_QUICK") != nullptr;
}

inline std::vector<float> uniform(size_t n, std::mt19937& rng, float lo, float hi) {
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

// The kernels' block_sum_double over `nthreads` per-thread values (a multiple of 32): warp
// butterflies (xor 16..1), the warps' sums, then a butterfly over them (zeros beyond the warp
// count).
inline double emu_block_sum_double(std::vector<double> v) {
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

inline bool type_fits(GgmlType t, int n) {
  return n % act_block(act_type_of(t)) == 0;
}

// The fields quantize_act writes for `t`, for `rows` rows of n, as host vectors.
struct ActHost {
  std::vector<float> f;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bsum;
};

inline ActHost cpu_act(GgmlType t, const std::vector<float>& x, int rows, int n) {
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

inline ActHost gpu_act(GgmlType t, const kern::exact::ActBuf& a, int rows, int n) {
  ActHost h;
  const size_t total = static_cast<size_t>(rows) * n;
  const ActType k = act_type_of(t);
  if (k == ActType::Q8_0 || k == ActType::Q8_K) {
    h.q = dl(a.q, total);
    h.d = dl(a.d, total / act_block(k));
    if (k == ActType::Q8_K) h.bsum = dl(a.bsum, total / 16);
  } else {
    h.f = dl(a.f, total);
  }
  return h;
}

inline size_t act_mismatches(const ActHost& got, const ActHost& ref, const std::string& what) {
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

// An ActBuf for `rows` rows of n in device memory (poisoned: 0xFF).
struct ActDev {
  gputest::DevArray<uint8_t> mem;
  kern::exact::ActBuf a;
  ActDev(int rows, int n) : mem(kern::exact::act_buffer_bytes(rows, n)) {
    a = kern::exact::act_buffer_at(mem.get(), rows, n);
  }
};

}  // namespace worker::exacttest
