#pragma once
// The GGUF tests' in-test file builder, so corrupt files are made from scratch here rather
// than stored (fixture paths: common/test_helpers.h).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/test_helpers.h"

namespace worker::test {

// Little-endian byte builder for GGUF files.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& v) {
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
  Bytes& pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  size_t size() const { return b.size(); }
};

}  // namespace worker::test
