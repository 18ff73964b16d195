#include "cuda_check.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>

#include "common/errors.h"

namespace worker {

namespace {
std::string where(const char* stmt, const char* file, int line) {
  return std::string(stmt) + " at " + file + ":" + std::to_string(line);
}
}  // namespace

void cuda_check(cudaError_t err, const char* stmt, const char* file, int line) {
  if (err == cudaSuccess) return;
  // Clear the sticky-free error state so a later call does not report this one again.
  (void)cudaGetLastError();
  const std::string msg = std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ") in " + where(stmt, file, line);
  throw WorkerError(err == cudaErrorMemoryAllocation ? ErrorCode::VramOom : ErrorCode::CudaError,
                    msg);
}

void cublas_check(cublasStatus_t st, const char* stmt, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  const std::string msg = std::string("cuBLAS error ") + cublasGetStatusName(st) + " (" +
                          cublasGetStatusString(st) + ") in " + where(stmt, file, line);
  throw WorkerError(st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::VramOom : ErrorCode::CudaError,
                    msg);
}

void cuda_check_launch(const char* kernel, const char* file, int line) {
  cuda_check(cudaGetLastError(), kernel, file, line);
}

namespace kern {
bool pdl_enabled() {
  static const bool on = [] {
    if (std::getenv("WORKER_NO_PDL") != nullptr) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}
bool pdl_skipped(const char* kernel_name) {
  static const std::string skip = [] {
    std::string list;
    if (const char* e = std::getenv("WORKER_PDL_SKIP")) {
      list.push_back(',');
      list.append(e);
      list.push_back(',');
    }
    return list;
  }();
  if (skip.empty()) return false;
  std::string needle(1, ',');
  needle.append(kernel_name);
  needle.push_back(',');
  return skip.find(needle) != std::string::npos;
}
void prefer_max_shared(const void* kernel, size_t dynamic_bytes) {
  static std::mutex mu;
  static std::unordered_set<const void*> done;
  const std::lock_guard<std::mutex> lock(mu);
  if (!done.insert(kernel).second) return;
  cudaFuncAttributes fa = {};
  cuda_check(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes", __FILE__, __LINE__);
  if (fa.sharedSizeBytes == 0 && dynamic_bytes == 0) return;
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)", __FILE__, __LINE__);
}
}  // namespace kern

}  // namespace worker
