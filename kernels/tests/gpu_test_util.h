#pragma once
// Helpers for GPU tests: device detection (tests skip as "not run" without a GPU), RAII
// device arrays, NaN poisoning and relative-error metrics.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace worker::gputest {

inline bool have_gpu() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

#define REQUIRE_GPU()                                                              \
  do {                                                                             \
    if (!::worker::gputest::have_gpu()) GTEST_SKIP() << "not run: no CUDA device"; \
  } while (0)

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(cudaGetLastError())

template <typename T>
class DevArray {
 public:
  explicit DevArray(size_t n) : n_(n) {
    if (cudaMalloc(&p_, sizeof(T) * (n ? n : 1)) != cudaSuccess) p_ = nullptr;
    poison();
  }
  explicit DevArray(const std::vector<T>& h) : DevArray(h.size()) { upload(h); }
  ~DevArray() {
    if (p_) cudaFree(p_);
  }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  // 0xFF bytes: NaN for float/half/double, -1 for ints; unwritten outputs show up.
  void poison() {
    if (p_) cudaMemset(p_, 0xFF, sizeof(T) * n_);
  }
  void upload(const std::vector<T>& h) {
    cudaMemcpy(p_, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// ||got - ref|| / ||ref||; any non-finite value in got gives +inf (NaN never passes).
inline double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace worker::gputest
