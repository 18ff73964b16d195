#include "common/fault_injection.h"

#include <atomic>
#include <cstdlib>

namespace worker::fault {

int64_t alloc_fault_at() {
  static const int64_t at = [] {
    const char* e = std::getenv(kAllocEnv);
    if (e == nullptr) return int64_t{0};
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    return end != e && *end == '\0' && v > 0 ? static_cast<int64_t>(v) : int64_t{0};
  }();
  return at;
}

bool inject_alloc_failure() {
  const int64_t at = alloc_fault_at();
  if (at == 0) return false;
  static std::atomic<int64_t> count{0};
  return count.fetch_add(1) + 1 == at;
}

std::string injected_alloc_message(size_t bytes, const std::string& what) {
  return "allocation of " + std::to_string(bytes) + " bytes for " + what + " failed (injected by " +
         kAllocEnv + ", a test-only switch)";
}

}  // namespace worker::fault
