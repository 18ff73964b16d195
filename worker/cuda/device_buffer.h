#pragma once
// RAII device and pinned-host memory (M0-W-1220, M0-SYS-2.2.1). Device memory comes only
// from cudaMalloc: never managed (cudaMallocManaged) or host-mapped memory, so every
// weight, cache and activation lives in VRAM. Pinned host memory is used only as the
// staging area of host->device copies and for the few bytes a step copies back.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace worker::cuda {

constexpr size_t kAlign = 256;
inline size_t align_up(size_t n, size_t a = kAlign) {
  return (n + a - 1) / a * a;
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws WorkerError(VramOom) naming `what` and the size when cudaMalloc fails.
  DeviceBuffer(size_t bytes, const std::string& what);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }
  void reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Bump allocator over one DeviceBuffer: every sub-allocation starts on a 256-byte boundary.
class Arena {
 public:
  Arena() = default;
  Arena(size_t bytes, const std::string& what) : buf_(align_up(bytes), what) {}
  // Throws WorkerError(Internal) when the arena was sized too small (a bug).
  void* alloc(size_t bytes);
  template <typename T>
  T* alloc_n(size_t n) {
    return static_cast<T*>(alloc(n * sizeof(T)));
  }
  const DeviceBuffer& buffer() const { return buf_; }
  size_t used() const { return used_; }
  size_t size() const { return buf_.size(); }

 private:
  DeviceBuffer buf_;
  size_t used_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// True when `p` is ordinary device memory of `device` (cudaMemoryTypeDevice, no host
// pointer): the residency check of M0-W-1010/1012. `why` says what failed.
bool is_device_resident(const void* p, int device, std::string* why);

}  // namespace worker::cuda
