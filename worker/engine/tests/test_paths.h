#pragma once
// Locating fixtures: shared ones (WORKER_SHARED_FIXTURES) and generated ones
// (WORKER_GENERATED_FIXTURES). Missing files are test failures, never skips.
#include <cstdlib>
#include <filesystem>
#include <string>

namespace worker::testpaths {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}
inline std::string source_dir() {
  return env_or("WORKER_SOURCE_DIR", WORKER_SOURCE_DIR);
}
inline std::string shared_fixtures() {
  return env_or("WORKER_SHARED_FIXTURES", source_dir() + "/../shared/fixtures");
}
inline std::string generated_fixtures() {
  return env_or("WORKER_GENERATED_FIXTURES", source_dir() + "/fixtures/generated");
}

}  // namespace worker::testpaths
