#include "cuda_check.h"

#include <algorithm>
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
void carveout_for_occupancy(const void* kernel, unsigned threads, size_t dynamic_bytes) {
  static std::mutex mu;
  static std::unordered_set<const void*> done;
  const std::lock_guard<std::mutex> lock(mu);
  if (!done.insert(kernel).second) return;
  cudaFuncAttributes fa = {};
  cuda_check(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes", __FILE__, __LINE__);
  const size_t per_block = fa.sharedSizeBytes + dynamic_bytes;
  if (per_block == 0) return;
  // Blocks per SM without the shared-memory limit (compute capability 9.0: 64K registers
  // allocated per warp in units of 256, 64 warps, 32 blocks), each with the 1 KB the
  // system reserves, as a percentage of the 228 KB maximum.
  const size_t warps = (threads + 31) / 32;
  const size_t regs_warp = ((static_cast<size_t>(fa.numRegs) * 32 + 255) / 256) * 256;
  const size_t by_regs = regs_warp == 0 ? 32 : 65536 / (regs_warp * warps);
  const size_t blocks = std::max<size_t>(1, std::min({by_regs, 64 / warps, size_t{32}}));
  constexpr size_t kMaxShared = size_t{228} * 1024;
  const size_t need = blocks * (per_block + 1024);
  const int pct =
      static_cast<int>(std::min<size_t>(100, (need * 100 + kMaxShared - 1) / kMaxShared));
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, pct),
             "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)", __FILE__, __LINE__);
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
      (void)cudaGetLastError();
      v = 132;
    }
    return v;
  }();
  return n;
}
}  // namespace kern

}  // namespace worker
