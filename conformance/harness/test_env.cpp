#include "harness/test_env.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace conformance {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string require_file(const std::string& path, const std::string& what) {
  if (!fs::exists(path))
    throw std::runtime_error(what + " not found: " + path +
                             " (set the environment variable that points to it)");
  return path;
}

}  // namespace

std::string source_dir() {
  return env_or("WORKER_SOURCE_DIR", WORKER_SOURCE_DIR);
}

std::string worker_bin() {
  return require_file(env_or("WORKER_BIN", CONFORMANCE_WORKER_BIN), "worker binary (WORKER_BIN)");
}

std::string test_backend() {
  return env_or("WORKER_BACKEND", "cpu");
}

std::string shared_fixture(const std::string& name) {
  const std::string dir = env_or("WORKER_SHARED_FIXTURES", source_dir() + "/../shared/fixtures");
  return require_file(dir + "/" + name, "shared fixture (WORKER_SHARED_FIXTURES)");
}

std::string generated_fixtures_dir() {
  return env_or("WORKER_GENERATED_FIXTURES", source_dir() + "/fixtures/generated");
}

std::string generated_fixture(const std::string& name) {
  return require_file(generated_fixtures_dir() + "/" + name,
                      "generated fixture (run fixtures/generate_all.sh)");
}

std::string stories_model() {
  return shared_fixture("stories260K.gguf");
}

std::string haiku_model_path() {
  return env_or("HAIKU_MODEL", source_dir() + "/fixtures/haiku/haiku-qwen2.gguf");
}

std::string slow_model() {
  return require_file(env_or("WORKER_SLOW_MODEL", CONFORMANCE_SLOW_MODEL),
                      "slow conformance model (WORKER_SLOW_MODEL; built by the "
                      "conformance_slow_model target)");
}

std::string eos_model() {
  return require_file(env_or("WORKER_EOS_MODEL", CONFORMANCE_EOS_MODEL),
                      "EOS conformance model (WORKER_EOS_MODEL; built by the "
                      "conformance_slow_model target)");
}

std::string results_dir() {
  const std::string dir =
      env_or("WORKER_RESULTS_DIR", std::string(WORKER_BINARY_DIR) + "/test-results");
  fs::create_directories(dir);
  return dir;
}

bool file_exists(const std::string& path) {
  return fs::exists(path);
}

void write_result(const std::string& relpath, const std::string& text) {
  const fs::path p = fs::path(results_dir()) / relpath;
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

}  // namespace conformance
