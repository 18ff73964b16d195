// Acceptance 5 of issue 6, end to end: the real worker-orcd process, started with
// --backend cuda on a model that cannot fit on the card (a ~206 GB sparse GGUF written by
// fixtures/make_huge_model.py: real header, data region a hole), exits with status 1 at
// startup and logs INSUFFICIENT_VRAM with required_bytes and available_bytes fields.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/test_helpers.h"
#include "gpu_test_util.h"

namespace worker {
namespace {

namespace fs = std::filesystem;

using test::env_or;

// REQ: M0-W-1020 M0-W-1220
TEST(CudaStartup, ModelTooLargeForCardExitsOneWithRequiredAndAvailableBytes) {
  REQUIRE_GPU();
  const std::string stories = test::shared_fixtures() + "/stories260K.gguf";
  ASSERT_TRUE(fs::is_regular_file(stories)) << "missing fixture " << stories;
  // The binary built with this test; WORKER_ORCD_BIN overrides it where binaries were
  // moved (ci/gpu-run.sh runs copies on the device machine).
  const std::string bin = env_or("WORKER_ORCD_BIN", WORKER_ORCD_BIN);
  ASSERT_TRUE(fs::is_regular_file(bin)) << "missing worker binary " << bin;

  const fs::path dir = fs::temp_directory_path() / ("cuda_startup_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string model = (dir / "huge.gguf").string();
  const std::string gen = "python3 '" + test::source_dir() +
                          "/fixtures/make_huge_model.py' --vocab '" + stories + "' --out '" +
                          model + "' > /dev/null";
  ASSERT_EQ(std::system(gen.c_str()), 0) << gen;
  const auto size = fs::file_size(model);
  ASSERT_GT(size, 200ull * 1000 * 1000 * 1000) << "the model must not fit any card";

  const std::string log = (dir / "stderr.log").string();
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  // timeout: a worker that does not fail fast is a failure, not a hang of the test.
  const std::string cmd = "timeout 120 '" + bin + "' --backend cuda --gpu-device 0 --model '" +
                          model + "' --port " + std::to_string(port) + " > /dev/null 2> '" + log +
                          "'";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st)) << cmd;
  const int rc = WEXITSTATUS(st);

  std::ifstream in(log);
  std::string line, all;
  nlohmann::json err;
  while (std::getline(in, line)) {
    all += line + "\n";
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("level", "") == "error") err = j;
  }
  EXPECT_EQ(rc, 1) << all;
  ASSERT_TRUE(err.is_object()) << "no error log line:\n" << all;
  EXPECT_EQ(err.value("code", ""), "INSUFFICIENT_VRAM") << err.dump();
  ASSERT_TRUE(err.contains("required_bytes")) << err.dump();
  ASSERT_TRUE(err.contains("available_bytes")) << err.dump();
  const uint64_t required = err["required_bytes"].get<uint64_t>();
  const uint64_t available = err["available_bytes"].get<uint64_t>();
  EXPECT_GT(required, available);
  // The weights alone are the file's data: required covers them.
  EXPECT_GE(required, size - (1ull << 20));
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  EXPECT_LE(available, total_b);
  EXPECT_GT(available, 0u);
  std::printf("worker exit %d; required %llu bytes, available %llu bytes\n", rc,
              static_cast<unsigned long long>(required),
              static_cast<unsigned long long>(available));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace worker
