// tools/compare_logits.py is a pass/fail gate, not a printout: it must exit 0 within the
// bound, 1 beyond it or on a greedy mismatch, 2 on unusable input.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_helpers.h"
#include "engine/parity/logits_record.h"

namespace worker {
namespace {

namespace fs = std::filesystem;

class EngineCompareTool : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("worker-cmp-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Our D16 records for logits `l` (one row per position).
  std::string write_ours(const std::vector<std::vector<float>>& l) {
    const auto p = (dir_ / "ours.jsonl").string();
    std::ofstream f(p);
    for (size_t i = 0; i < l.size(); ++i)
      f << parity::logits_record(l[i], "logits", "t", static_cast<int64_t>(i)).dump() << "\n";
    return p;
  }
  // Oracle records: log-softmax of `l` shifted by `delta` at entry 0.
  std::string write_oracle(const std::vector<std::vector<float>>& l, double delta,
                           const std::vector<int32_t>& greedy) {
    const auto p = (dir_ / "oracle.jsonl").string();
    std::ofstream f(p);
    f << nlohmann::json{{"kind", "meta"}, {"n_vocab", l[0].size()}}.dump() << "\n";
    for (size_t i = 0; i < l.size(); ++i) {
      double mx = l[i][0], s = 0;
      for (float v : l[i]) mx = std::max(mx, static_cast<double>(v));
      for (float v : l[i]) s += std::exp(static_cast<double>(v) - mx);
      std::vector<double> lp;
      for (float v : l[i]) lp.push_back(static_cast<double>(v) - mx - std::log(s));
      lp[0] += delta;
      f << nlohmann::json{{"kind", "logprobs"}, {"token_idx", i}, {"logprobs", lp}}.dump() << "\n";
    }
    f << nlohmann::json{{"kind", "greedy"}, {"tokens", greedy}}.dump() << "\n";
    return p;
  }
  int run(const std::string& args) {
    const std::string cmd = "/usr/bin/python3 '" + test::source_dir() +
                            "/tools/compare_logits.py' " + args + " > /dev/null 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }
  fs::path dir_;
};

TEST_F(EngineCompareTool, PassesWithinBoundFailsBeyondAndOnGreedyMismatch) {
  const std::vector<std::vector<float>> l = {{1.0f, 2.0f, -1.0f, 0.5f}, {0.0f, -3.0f, 4.0f, 1.0f}};
  const auto ours = write_ours(l);
  EXPECT_EQ(run(ours + " " + write_oracle(l, 5e-5, {1, 2}) + " --max-abs 1e-4"), 0);
  EXPECT_EQ(run(ours + " " + write_oracle(l, 5e-3, {1, 2}) + " --max-abs 1e-4"), 1);
  const auto ids = (dir_ / "ids.json").string();
  std::ofstream(ids) << R"({"tokens":[1,2]})";
  EXPECT_EQ(run(ours + " " + write_oracle(l, 0.0, {1, 2}) + " --ids " + ids), 0);
  EXPECT_EQ(run(ours + " " + write_oracle(l, 0.0, {1, 3}) + " --ids " + ids), 1);
  EXPECT_EQ(run(ours + " " + (dir_ / "missing.jsonl").string()), 2);
  // A position the oracle has and we do not is a failure, not a silent skip.
  const auto short_ours = write_ours({l[0]});
  EXPECT_EQ(run(short_ours + " " + write_oracle(l, 0.0, {1, 2})), 1);
}

}  // namespace
}  // namespace worker
