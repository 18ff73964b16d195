#include "cuda/device_buffer.h"

#include <utility>

#include "common/errors.h"
#include "cuda_check.h"

namespace worker::cuda {

DeviceBuffer::DeviceBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    ptr_ = nullptr;
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    throw WorkerError(err == cudaErrorMemoryAllocation ? ErrorCode::VramOom : ErrorCode::CudaError,
                      "cudaMalloc of " + std::to_string(bytes) + " bytes for " + what +
                          " failed (" + cudaGetErrorName(err) + "); " + std::to_string(free_b) +
                          " of " + std::to_string(total_b) + " bytes free");
  }
}

DeviceBuffer::~DeviceBuffer() {
  reset();
}

void DeviceBuffer::reset() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);  // a destructor must not throw
  ptr_ = nullptr;
  bytes_ = 0;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void* Arena::alloc(size_t bytes) {
  const size_t off = align_up(used_);
  if (off + bytes > buf_.size()) {
    throw WorkerError(ErrorCode::Internal, "device arena overflow: " + std::to_string(off + bytes) +
                                               " > " + std::to_string(buf_.size()));
  }
  used_ = off + bytes;
  return static_cast<uint8_t*>(buf_.data()) + off;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
}
PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

bool is_device_resident(const void* p, int device, std::string* why) {
  cudaPointerAttributes a{};
  const cudaError_t err = cudaPointerGetAttributes(&a, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("cudaPointerGetAttributes failed: ") + cudaGetErrorName(err);
    return false;
  }
  if (a.type != cudaMemoryTypeDevice) {
    if (why) *why = "memory type " + std::to_string(static_cast<int>(a.type)) + " is not device";
    return false;
  }
  if (a.hostPointer != nullptr) {
    if (why) *why = "device allocation has a host mapping";
    return false;
  }
  if (a.device != device) {
    if (why) *why = "allocation on device " + std::to_string(a.device);
    return false;
  }
  return true;
}

}  // namespace worker::cuda
