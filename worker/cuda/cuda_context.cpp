#include "cuda/cuda_context.h"

#include <mutex>

#include "common/errors.h"
#include "cuda_check.h"

namespace worker::cuda {

namespace {
std::mutex g_mu;
std::weak_ptr<CudaContext> g_ctx;
}  // namespace

std::shared_ptr<CudaContext> CudaContext::acquire(int device) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (auto c = g_ctx.lock()) {
    if (c->device() != device) {
      throw WorkerError(ErrorCode::CudaError,
                        "one CUDA device per process: device " + std::to_string(c->device()) +
                            " is in use, asked for " + std::to_string(device));
    }
    return c;
  }
  std::shared_ptr<CudaContext> c(new CudaContext(device));
  g_ctx = c;
  return c;
}

CudaContext::CudaContext(int device) : device_(device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw WorkerError(ErrorCode::CudaError,
                      std::string("no CUDA device available (cudaGetDeviceCount: ") +
                          cudaGetErrorName(err) + ", count " + std::to_string(count) + ")");
  }
  if (device < 0 || device >= count) {
    throw WorkerError(ErrorCode::CudaError, "GPU device " + std::to_string(device) +
                                                " does not exist (" + std::to_string(count) +
                                                " device(s): 0.." + std::to_string(count - 1) +
                                                ")");
  }
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
  // The spec's VRAM-only settings: no in-kernel malloc heap, L1-preferring cache split.
  // The real enforcement is that this backend allocates only with cudaMalloc and checks
  // every allocation with cudaPointerGetAttributes.
  CUDA_CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 0));
  CUDA_CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferL1));
  CUDA_CHECK(cudaDeviceGetLimit(&heap_limit_, cudaLimitMallocHeapSize));
  CUDA_CHECK(cudaDeviceGetCacheConfig(&cache_config_));
}

CudaContext::~CudaContext() {
  (void)cudaDeviceReset();  // M0-W-1401: the context's teardown frees everything left
}

std::string CudaContext::sm() const {
  return std::to_string(props_.major) + "." + std::to_string(props_.minor);
}

std::string CudaContext::runtime_version() const {
  int v = 0;
  (void)cudaRuntimeGetVersion(&v);
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace worker::cuda
