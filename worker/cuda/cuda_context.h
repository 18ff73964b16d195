#pragma once
// The process's CUDA context (M0-W-1010, 1400, 1401, M0-SYS-2.5.1): validates the device
// index, selects it, reads its properties and applies the VRAM-only settings. Shared by
// every engine of the process; the last owner's release calls cudaDeviceReset.
#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace worker::cuda {

class CudaContext {
 public:
  // Throws WorkerError(CudaError) when there is no such device.
  static std::shared_ptr<CudaContext> acquire(int device);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  const cudaDeviceProp& props() const { return props_; }
  std::string sm() const;               // "9.0"
  std::string runtime_version() const;  // "13.0"
  size_t malloc_heap_limit() const { return heap_limit_; }
  cudaFuncCache cache_config() const { return cache_config_; }

 private:
  explicit CudaContext(int device);
  int device_ = 0;
  cudaDeviceProp props_{};
  size_t heap_limit_ = 0;
  cudaFuncCache cache_config_ = cudaFuncCachePreferNone;
};

}  // namespace worker::cuda
