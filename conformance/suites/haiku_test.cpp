// The haiku anti-cheat test (D17, M0-W-1800) against the real worker, its plain form, and
// the mutation check proving it can fail (issue 7, acceptance 2).
//   conformance_haiku                         default model fixtures/haiku/haiku-qwen2.gguf
//   conformance_haiku --model /path/x.gguf    any real model (also env HAIKU_MODEL)
// A missing model FAILS the test: it is never skipped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "haiku/haiku_check.h"
#include "harness/suite.h"

namespace conformance {
namespace {

using haiku::Attempt;

// --model PATH / --model=PATH from the test binary's own command line (gtest ignores
// arguments it does not know), else HAIKU_MODEL, else the fixture.
std::string haiku_model() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(f, a, '\0');) args.push_back(a);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--model" && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind("--model=", 0) == 0) return args[i].substr(8);
  }
  return haiku_model_path();
}

std::string require_model() {
  const std::string m = haiku_model();
  if (!file_exists(m))
    throw std::runtime_error("haiku model not found: " + m +
                             " (train/commit fixtures/haiku/haiku-qwen2.gguf, or pass --model "
                             "or HAIKU_MODEL)");
  return m;
}

TEST(ConformanceHaikuWords, MinuteWords) {
  EXPECT_EQ(haiku::minute_word(0), "zero");
  EXPECT_EQ(haiku::minute_word(7), "seven");
  EXPECT_EQ(haiku::minute_word(13), "thirteen");
  EXPECT_EQ(haiku::minute_word(20), "twenty");
  EXPECT_EQ(haiku::minute_word(21), "twenty-one");
  EXPECT_EQ(haiku::minute_word(40), "forty");
  EXPECT_EQ(haiku::minute_word(59), "fifty-nine");
  EXPECT_THROW(haiku::minute_word(60), std::out_of_range);
}

TEST(ConformanceHaikuWords, CountingAndPrompt) {
  EXPECT_EQ(haiku::count_occurrences("one one", "one"), 2);
  EXPECT_EQ(haiku::count_occurrences("One gone", "one"), 1);  // case-sensitive; inside "gone"
  EXPECT_EQ(haiku::count_occurrences("aaaa", "aa"), 2);       // non-overlapping
  EXPECT_EQ(haiku::count_occurrences("twenty-one", "twenty"), 1);
  const std::string n = haiku::make_nonce();
  ASSERT_EQ(n.size(), 8u);
  for (char c : n) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << n;
  EXPECT_NE(haiku::make_nonce(), haiku::make_nonce());
  EXPECT_EQ(haiku::anti_cheat_prompt("twenty-one", "Ab3dEf9Z"),
            "Write a haiku about GPU computing that includes the word \"twenty-one\" (nonce: "
            "Ab3dEf9Z)");
}

std::string describe(const std::vector<Attempt>& attempts) {
  std::string s;
  for (const auto& a : attempts) {
    s += "\nprompt: " + a.prompt + "\ntext: " + a.text;
    for (const auto& f : a.failures) s += "\n  failure: " + f;
  }
  return s;
}

// REQ: WRK-D17 M0-W-1800 M0-W-1311 M0-W-1230
TEST(ConformanceHaiku, AntiCheat) {
  const std::string model = require_model();
  WorkerOptions o;
  o.model = model;
  WorkerProcess w(o);
  auto attempts = haiku::run_anti_cheat(w.port(), model, "haiku");
  ASSERT_FALSE(attempts.empty());
  const Attempt& a = attempts.back();
  EXPECT_TRUE(a.failures.empty()) << describe(attempts);
  EXPECT_EQ(a.first_event, "started");
  EXPECT_GE(a.token_events, 1);
  EXPECT_EQ(a.last_event, "end");
  EXPECT_EQ(a.occurrences, 1) << a.text;
  EXPECT_LE(a.total_ms, 30000.0);
  RecordProperty("minute_word", a.word);
  RecordProperty("total_ms", std::to_string(a.total_ms));
  EXPECT_EQ(w.stop(), 0);
}

// The specification's plain form: same request twice -> identical tokens.
// REQ: M0-W-1800 M0-W-1826 WRK-D15
TEST(ConformanceHaiku, PlainFormTwiceIdentical) {
  const std::string model = require_model();
  WorkerOptions o;
  o.model = model;
  WorkerProcess w(o);
  auto req = [] {
    return nlohmann::json{{"job_id", unique_job_id("haiku-plain")},
                          {"prompt", "Write a haiku about GPU computing"},
                          {"chat", true},
                          {"max_tokens", 50},
                          {"temperature", 0.7},
                          {"seed", 42}};
  };
  JobStream a = run_job(w.port(), req());
  JobStream b = run_job(w.port(), req());
  ASSERT_TRUE(a.violations.empty()) << a.describe();
  ASSERT_TRUE(b.violations.empty()) << b.describe();
  EXPECT_EQ(a.events.front().event, "started");
  EXPECT_GE(a.tokens().size(), 1u);
  EXPECT_EQ(a.events.back().event, "end");
  EXPECT_EQ(a.pieces(), b.pieces());
  write_result("haiku/plain_form.txt", a.text() + "\n");
  EXPECT_EQ(w.stop(), 0);
}

// Mutation check: the same check against a worker serving deliberately corrupted weights
// (haiku/corrupt_model.py permutes the blocks within every tensor) must FAIL; a check that
// passed here would prove nothing. Corrupted output is a jumble of the trained vocabulary, in
// which the short minute words ("three", "ten") can occur exactly once by chance, so one run
// at the current minute would pass or fail with the clock. Instead the check runs for every
// one of the 60 minute words (fixed seeds) and must fail for at least 40 of them; the trained
// model passes it at whatever minute the AntiCheat test runs.
// REQ: WRK-D17
TEST(ConformanceHaiku, MutationCorruptWeightsFailsTheCheck) {
  const std::string model = require_model();
  const std::string bad = results_dir() + "/haiku-mutation/corrupted.gguf";
  write_result("haiku-mutation/.keep", "");
  const std::string cmd = "/usr/bin/python3 '" + source_dir() +
                          "/conformance/haiku/corrupt_model.py' '" + model + "' '" + bad + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  WorkerOptions o;
  o.model = bad;
  WorkerProcess w(o);
  int failed = 0;
  std::string passed_words;
  nlohmann::json runs = nlohmann::json::array();
  for (int minute = 0; minute < 60; ++minute) {
    const haiku::Attempt a = haiku::run_check(w.port(), minute, 20261126u + minute, "fixed");
    ASSERT_TRUE(a.first_event == "started" && a.last_event == "end") << a.text;
    failed += !a.failures.empty();
    if (a.failures.empty()) passed_words += " " + a.word;
    runs.push_back({{"word", a.word}, {"occurrences", a.occurrences}, {"text", a.text}});
  }
  write_result("haiku-mutation/runs.json", runs.dump(1) + "\n");
  std::printf(
      "haiku mutation: the check failed for %d of 60 minute words against corrupted "
      "weights (passed by chance:%s)\n",
      failed, passed_words.empty() ? " none" : passed_words.c_str());
  EXPECT_GE(failed, 40) << "the anti-cheat check passed against corrupted weights for:"
                        << passed_words;
  std::filesystem::remove(bad);
  EXPECT_EQ(w.stop(), 0);
}

}  // namespace
}  // namespace conformance
