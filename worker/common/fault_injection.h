#pragma once
// Test-only fault injection (WRK-D28), off unless its environment variable is set; never
// for production use. WORKER_TEST_FAULT_ALLOC=N (N >= 1): the N-th job-time scratch
// allocation of the engine, counted from process start, fails once with VRAM_OOM, as a
// failed cudaMalloc would. The CPU engine allocates its activations on every forward pass,
// so N counts forward passes there (N = 3: prefill and one decode step succeed, the next
// fails); the CUDA engine's one job-time device allocation is the prefill scratch (the first
// multi-token prompt after startup, or after a failed attempt), so N = 1 fails the first
// job's prompt.
#include <cstdint>
#include <string>

namespace worker::fault {

inline constexpr const char* kAllocEnv = "WORKER_TEST_FAULT_ALLOC";

// The N of WORKER_TEST_FAULT_ALLOC, 0 when unset or invalid (read once).
int64_t alloc_fault_at();
// Counts one job-time allocation; true for the one the switch names (the caller then throws
// the VRAM_OOM a real failure would).
bool inject_alloc_failure();
// The VRAM_OOM message for an injected failure of `bytes` for `what`.
std::string injected_alloc_message(size_t bytes, const std::string& what);

}  // namespace worker::fault
