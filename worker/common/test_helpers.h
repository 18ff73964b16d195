#pragma once
// Helpers shared by every test binary (the test targets define WORKER_SOURCE_DIR,
// cmake/WorkerTest.cmake): where the fixtures are, float bit patterns, a seeded RNG.
// Missing fixtures are test failures, never skips.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace worker::test {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}
inline std::string source_dir() {
  return env_or("WORKER_SOURCE_DIR", WORKER_SOURCE_DIR);
}
// ../shared/fixtures (stories260K and llama.cpp's greedy output for it).
inline std::string shared_fixtures() {
  return env_or("WORKER_SHARED_FIXTURES", source_dir() + "/../shared/fixtures");
}
// fixtures/generate_all.sh's output.
inline std::string generated_fixtures() {
  return env_or("WORKER_GENERATED_FIXTURES", source_dir() + "/fixtures/generated");
}
// llama.cpp's tokenizer test vocabularies (ggml-vocab-*.gguf + .inp/.out).
inline std::string llama_models_dir() {
  return env_or("WORKER_LLAMA_SRC", source_dir() + "/.deps/llama.cpp") + "/models";
}

// Whether this x86-64 host has the AVX-512 subsets whose ggml-cpu builds (node-llama-cpp's
// zen4 / icelake / skylakex libraries) sum in the orders the CPU reference reproduces; without
// them llama.cpp runs its 8-lane kernels and only loose bounds against it hold.
inline bool host_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// The bit pattern of a float: bitwise comparisons (-0 != +0, NaN payloads kept).
inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// A small deterministic generator (xorshift64) for test data.
struct XorShift {
  uint64_t s;
  explicit XorShift(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  // Uniform in [lo, hi), 24 random bits.
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) / static_cast<float>(1 << 24);
  }
};

}  // namespace worker::test
