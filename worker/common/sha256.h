#pragma once
// SHA-256 (FIPS 180-4) and the content hash of a model file used by receipts (WRK-D18).
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace worker {

class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> data);
  void update(const void* data, size_t n) {
    update(std::span<const uint8_t>(static_cast<const uint8_t*>(data), n));
  }
  std::array<uint8_t, 32> finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string to_hex(std::span<const uint8_t> bytes);
std::string sha256_hex(std::span<const uint8_t> data);

// A file's content hash, "sha256-tree-16MiB:" + hex: SHA-256 over the concatenated SHA-256
// digests of the file's consecutive 16 MiB pieces (the last one shorter), so the pieces can
// be hashed in parallel. `threads` 0 = the machine's cores less one (at least one);
// `progress` (may be empty) is called with the bytes hashed so far and returns false to
// abandon the work. Throws std::runtime_error when the file cannot be read or the work was
// abandoned.
std::string file_content_hash(
    const std::string& path, unsigned threads = 0,
    const std::function<bool(uint64_t done, uint64_t total)>& progress = {});

}  // namespace worker
