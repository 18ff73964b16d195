// --log-logits (D16): one record per evaluated position, same events with and without it.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>

#include <fstream>

#include "engine/generation.h"
#include "server/job_runner.h"
#include "server/logits_log.h"
#include "test_support.h"

namespace worker::server {
namespace {
using namespace std::chrono_literals;
using nlohmann::json;

std::vector<JobEvent> run_one(JobRunner& r, const std::string& id) {
  auto j = std::make_shared<Job>();
  j->id = id;
  j->request.prompt = "Once upon a time";
  j->request.max_tokens = 12;
  j->request.sampling.temperature = 0;
  j->request.prompt_tokens = tokenize_prompt(*testing::stories().tok, j->request.prompt, false);
  EXPECT_EQ(r.submit(j), JobRunner::Admission::Accepted);
  std::vector<JobEvent> evs;
  for (int k = 0; k < 1000; ++k) {
    auto ev = j->events.pop(50ms);
    if (!ev) continue;
    evs.push_back(*ev);
    if (ev->terminal()) break;
  }
  return evs;
}

// REQ: WRK-D16
TEST(ServerLogitsLog, OneRecordPerEvaluatedPositionAndSameEvents) {
  ASSERT_TRUE(testing::stories().model);
  const auto path = std::filesystem::temp_directory_path() /
                    ("server_logits_" + std::to_string(::getpid()) + ".jsonl");
  auto engine = make_engine("cpu", testing::stories().model, 512);
  std::vector<JobEvent> plain, logged;
  {
    JobRunner r(*engine, *testing::stories().tok, {});
    plain = run_one(r, "plain");
  }
  {
    LogitsLog log(path.string());
    JobRunner r(*engine, *testing::stories().tok, {}, nullptr, &log);
    logged = run_one(r, "logged");
    EXPECT_EQ(log.dropped(), 0u);
  }
  ASSERT_EQ(plain.size(), logged.size());
  for (size_t i = 1; i < plain.size(); ++i)
    if (plain[i].kind == JobEvent::Kind::Token) {
      EXPECT_EQ(plain[i].data, logged[i].data);
    }
  ASSERT_EQ(logged.back().data["type"], "end");
  const int64_t tokens_out = logged.back().data["tokens_out"];
  const int64_t prompt = logged.front().data["prompt_tokens"];

  std::ifstream in(path);
  std::vector<json> recs;
  for (std::string line; std::getline(in, line);) recs.push_back(json::parse(line));
  std::filesystem::remove(path);
  // Prompt positions + every generated token but the last (it is never evaluated).
  ASSERT_EQ(static_cast<int64_t>(recs.size()), prompt + tokens_out - 1);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i]["token_idx"], static_cast<int64_t>(i));
    EXPECT_EQ(recs[i]["job_id"], "logged");
    EXPECT_EQ(recs[i]["checkpoint"], "logits");
    EXPECT_EQ(recs[i]["dtype"], "f32");
    EXPECT_EQ(recs[i]["shape"][0], 512);
    EXPECT_EQ(recs[i]["values"].size(), kLogitsValues);
    EXPECT_EQ(recs[i]["top"]["ids"].size(), 10u);
    EXPECT_EQ(recs[i]["top"]["ids"][0], recs[i]["argmax"]);
    EXPECT_TRUE(recs[i]["logsumexp"].is_number());
  }
}

// REQ: WRK-D16
TEST(ServerLogitsLog, FullQueueDropsAndCountsInsteadOfBlocking) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("server_logits_drop_" + std::to_string(::getpid()) + ".jsonl");
  std::vector<float> row(1000);
  for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>(i % 97) * 0.25f;
  uint64_t written = 0, dropped = 0;
  {
    LogitsLog log(path.string(), /*max_records=*/4, /*max_bytes=*/1 << 20);
    for (int i = 0; i < 2000; ++i) log.push(row, "j", i);
    EXPECT_TRUE(log.flush(5000));
    written = log.written();
    dropped = log.dropped();
  }
  EXPECT_EQ(written + dropped, 2000u);
  EXPECT_GT(written, 0u);
  std::ifstream in(path);
  size_t lines = 0;
  for (std::string l; std::getline(in, l);) {
    const json j = json::parse(l);
    EXPECT_EQ(j["argmax"], 96);
    ++lines;
  }
  EXPECT_EQ(lines, written);
  std::filesystem::remove(path);
}

// REQ: WRK-D16
TEST(ServerLogitsLog, OverByteBudgetSummarizesInPlaceWithoutLoss) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("server_logits_budget_" + std::to_string(::getpid()) + ".jsonl");
  std::vector<float> row(4096, 0.0f);
  row[123] = 5.0f;
  {
    LogitsLog log(path.string(), 100000, /*max_bytes=*/4096 * 4 * 2);  // room for 2 raw rows
    for (int i = 0; i < 200; ++i) log.push(row, "j", i);
    EXPECT_TRUE(log.flush(5000));
    EXPECT_EQ(log.dropped(), 0u);
    EXPECT_EQ(log.written(), 200u);
  }
  std::ifstream in(path);
  int n = 0;
  for (std::string l; std::getline(in, l); ++n) EXPECT_EQ(json::parse(l)["argmax"], 123);
  EXPECT_EQ(n, 200);
  std::filesystem::remove(path);
}

// WRK-D28 (issue 15): a parity log that cannot be written (/dev/full: every write fails with
// ENOSPC) is a warning; the jobs still stream every event and end, one after the other.
// REQ: WRK-D28 WRK-D16
TEST(ServerLogitsLog, UnwritableLogWarnsAndServingContinues) {
  ASSERT_TRUE(testing::stories().model);
  ASSERT_TRUE(std::filesystem::exists("/dev/full")) << "needs Linux's /dev/full";
  auto engine = make_engine("cpu", testing::stories().model, 512);
  std::vector<JobEvent> plain;
  {
    JobRunner r(*engine, *testing::stories().tok, {});
    plain = run_one(r, "plain");
  }
  ::testing::internal::CaptureStderr();
  std::vector<JobEvent> a, b;
  uint64_t errors = 0;
  {
    LogitsLog log("/dev/full");
    JobRunner r(*engine, *testing::stories().tok, {}, nullptr, &log);
    a = run_one(r, "full-a");
    b = run_one(r, "full-b");
    errors = log.write_errors();
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_GT(errors, 0u);
  EXPECT_NE(err.find("\"log_logits_write_failed\""), std::string::npos) << err;
  EXPECT_NE(err.find("\"warn\""), std::string::npos) << err;
  for (const auto* evs : {&a, &b}) {
    ASSERT_EQ(evs->size(), plain.size());
    EXPECT_EQ(evs->back().data["type"], "end");
    for (size_t i = 1; i < plain.size(); ++i) {
      if (plain[i].kind == JobEvent::Kind::Token) {
        EXPECT_EQ((*evs)[i].data, plain[i].data);
      }
    }
  }
}

}  // namespace
}  // namespace worker::server
