// Parity logging (D16, --log-logits FILE): the same events with and without it, one JSONL
// record per evaluated position with the documented fields, argmax consistent with greedy.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "harness/suite.h"

namespace conformance {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    out.push_back(nlohmann::json::parse(line));  // a non-JSON line throws: test fails
  }
  return out;
}

// REQ: WRK-D16
TEST(ConformanceParityLog, SameEventsAndOneRecordPerEvaluatedPosition) {
  const fs::path dir =
      fs::temp_directory_path() / ("conformance-logits-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "logits.jsonl").string();
  fs::remove(path);

  WorkerOptions plain_opts;
  plain_opts.model = stories_model();
  WorkerOptions log_opts = plain_opts;
  log_opts.extra_args = {"--log-logits", path};
  WorkerProcess plain(plain_opts);
  WorkerProcess logged(log_opts);

  const int kTokens = 24;
  auto req = job_request("Once upon a time", kTokens, 0.0);
  JobStream a = run_job(plain.port(), req);
  JobStream b = run_job(logged.port(), req);
  ASSERT_TRUE(a.violations.empty()) << a.describe();
  ASSERT_TRUE(b.violations.empty()) << b.describe();
  EXPECT_EQ(a.pieces(), b.pieces());
  EXPECT_EQ(a.events.size(), b.events.size());
  const int prompt_tokens = (*b.started())["prompt_tokens"];
  const int tokens_out = (*b.terminal())["tokens_out"];
  ASSERT_EQ(tokens_out, kTokens);

  // Sampled, not greedy, on the same logged worker: its records must not mix with the first.
  auto req2 = job_request("The dog", 5, 0.8, 3);
  JobStream c = run_job(logged.port(), req2);
  ASSERT_TRUE(c.violations.empty()) << c.describe();
  const int prompt2 = (*c.started())["prompt_tokens"];

  // Flushed at job end: wait briefly for the writer thread, then at shutdown for sure.
  EXPECT_EQ(logged.stop(), 0);
  EXPECT_EQ(plain.stop(), 0);
  auto recs = read_jsonl(path);
  std::map<std::string, std::vector<nlohmann::json>> by_job;
  for (auto& r : recs) by_job[r.value("job_id", "")].push_back(r);
  ASSERT_EQ(by_job.size(), 2u) << "records for jobs other than the two requests";
  const auto& r1 = by_job[req["job_id"]];
  // Every prompt position plus every generated token fed back (the last one is not
  // evaluated: generation stops at max_tokens first).
  EXPECT_EQ(static_cast<int>(r1.size()), prompt_tokens + tokens_out - 1);
  EXPECT_EQ(static_cast<int>(by_job[req2["job_id"]].size()), prompt2 + 5 - 1);
  for (size_t k = 0; k < r1.size(); ++k) {
    const auto& r = r1[k];
    EXPECT_EQ(r["token_idx"], static_cast<int>(k)) << r.dump().substr(0, 200);
    for (const char* f : {"checkpoint", "dtype", "shape", "values", "argmax", "logsumexp", "top"})
      EXPECT_TRUE(r.contains(f)) << f;
    EXPECT_EQ(r["shape"], nlohmann::json::array({512})) << r["shape"];
    EXPECT_TRUE(std::isfinite(r["logsumexp"].get<double>()));
    ASSERT_TRUE(r["top"].is_object()) << r["top"];
    const auto& ids = r["top"]["ids"];
    ASSERT_TRUE(ids.is_array());
    EXPECT_EQ(ids.size(), 10u);
    EXPECT_EQ(r["top"]["logits"].size(), 10u);
    EXPECT_EQ(ids[0], r["argmax"]);
  }
}

}  // namespace
}  // namespace conformance
