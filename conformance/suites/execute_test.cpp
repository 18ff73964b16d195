// POST /execute: event order and payloads (D6), UTF-8 streaming (D7, M0-W-1824), stop
// sequences, max_tokens and EOS, sampling parameters, reproducibility (D15), chat.
// Model: stories260K.gguf (real, SPM vocabulary), plus a generated qwen2 model with ChatML
// specials for chat and byte-level partial-sequence checks.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "harness/suite.h"

namespace conformance {
namespace {

class ExecuteTest : public SharedWorkerTest<ExecuteTest> {
 public:
  static WorkerOptions worker_options() {
    WorkerOptions o;
    o.model = stories_model();
    return o;
  }

 protected:
  JobStream run(const nlohmann::json& req) {
    JobStream js = run_job(port(), req);
    EXPECT_EQ(js.status, 200);
    EXPECT_TRUE(js.violations.empty()) << js.describe();
    return js;
  }
  std::string greedy_text(const std::string& prompt, int n) {
    return run(job_request(prompt, n, 0.0)).text();
  }
};

// REQ: M0-W-1300 M0-W-1310 M0-W-1311 M0-W-1312 WRK-D6
TEST_F(ExecuteTest, EventOrderAndPayloads) {
  auto req = job_request("Once upon a time", 20, 0.0);
  JobStream js = run(req);
  ASSERT_NE(js.started(), nullptr) << js.describe();
  const auto& st = *js.started();
  EXPECT_EQ(st["job_id"], req["job_id"]);
  EXPECT_FALSE(st["model"].get<std::string>().empty());
  EXPECT_GE(st["prompt_tokens"].get<int>(), 2);  // BOS + at least one piece
  ASSERT_NE(js.terminal(), nullptr);
  EXPECT_EQ(js.events.back().event, "end") << js.describe();
  const auto& end = *js.terminal();
  EXPECT_EQ(end["tokens_out"].get<int>(), 20);
  EXPECT_EQ(end["stop_reason"], "max_tokens");
  EXPECT_GE(js.tokens().size(), 1u);
  EXPECT_LE(js.tokens().size(), 20u);
  EXPECT_GE(end["decode_time_ms"].get<double>(), 0.0);
  EXPECT_GE(end["first_token_ms"].get<double>(), 0.0);
}

// REQ: WRK-D6 M0-W-1300
TEST_F(ExecuteTest, ResponseHeadersAreThoseOfAnUnbufferedEventStream) {
  SseStream s(port(), "/execute", job_request("Hello", 3, 0.0));
  EXPECT_EQ(s.status(), 200);
  auto ct = s.response().header("content-type");
  ASSERT_TRUE(ct.has_value());
  EXPECT_EQ(ct->rfind("text/event-stream", 0), 0u) << *ct;
  EXPECT_EQ(s.response().header("x-accel-buffering").value_or(""), "no");
  JobStream js = collect(s);
  EXPECT_TRUE(js.violations.empty()) << js.describe();
}

// REQ: WRK-D5 M0-W-1300
TEST_F(ExecuteTest, V2AliasServesTheSameStream) {
  auto req = job_request("The dog", 12, 0.0);
  JobStream a = run(req);
  req["job_id"] = unique_job_id();
  JobStream b = run_job(port(), req, {}, "/v2/execute");
  EXPECT_TRUE(b.violations.empty()) << b.describe();
  EXPECT_EQ(a.pieces(), b.pieces());
}

// The engine is a real model: greedy text equals llama.cpp's reference continuation.
// REQ: M0-W-1420 M0-W-1032 WRK-D15
TEST_F(ExecuteTest, GreedyTextMatchesTheLlamaCppReference) {
  std::ifstream f(shared_fixture("stories260K.greedy200.json"));
  const auto ref = nlohmann::json::parse(f);
  const std::string ref_text = ref["text"];
  const std::string prompt = "Once upon a time";
  ASSERT_EQ(ref_text.rfind(prompt, 0), 0u);
  const std::string got = greedy_text(prompt, 40);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(ref_text.substr(prompt.size(), got.size()), got)
      << "worker: '" << got << "'\nllama.cpp: '" << ref_text.substr(prompt.size(), 200) << "'";
}

// REQ: M0-W-1422 WRK-D6
TEST_F(ExecuteTest, MaxTokensStopsWithStopReasonMaxTokens) {
  for (int n : {1, 2, 7}) {
    JobStream js = run(job_request("Once upon a time", n, 0.8, 99));
    ASSERT_NE(js.terminal(), nullptr) << js.describe();
    EXPECT_EQ((*js.terminal())["tokens_out"], n);
    EXPECT_EQ((*js.terminal())["stop_reason"], "max_tokens");
  }
}

// The stop text is not sent and the text before it is (held back, then released).
// REQ: M0-W-1422 WRK-D7 WRK-D6
TEST_F(ExecuteTest, StopSequenceEndsTheStreamAndIsNotSent) {
  const std::string full = greedy_text("Once upon a time", 60);
  // A stop string taken from the middle of the greedy text, spanning a piece boundary.
  const size_t at = full.find("little girl");
  ASSERT_NE(at, std::string::npos) << full;
  auto req = job_request("Once upon a time", 60, 0.0);
  req["stop"] = {"zzzq", "le gir"};
  JobStream js = run(req);
  ASSERT_NE(js.terminal(), nullptr) << js.describe();
  const auto& end = *js.terminal();
  EXPECT_EQ(end["stop_reason"], "stop_sequence");
  EXPECT_EQ(end["stop_sequence_matched"], "le gir");
  EXPECT_EQ(js.text(), full.substr(0, full.find("le gir")));
  EXPECT_EQ(js.text().find("le gir"), std::string::npos);
}

// A stop sequence that never matches must not lose or reorder any text.
// REQ: WRK-D7 M0-W-1422
TEST_F(ExecuteTest, UnmatchedStopSequenceLosesNoText) {
  const std::string full = greedy_text("Once upon a time", 50);
  auto req = job_request("Once upon a time", 50, 0.0);
  req["stop"] = {"Lily.\nQ", ", there was a little boy"};
  JobStream js = run(req);
  EXPECT_EQ(js.text(), full);
  ASSERT_NE(js.terminal(), nullptr);
  EXPECT_EQ((*js.terminal())["stop_reason"], "max_tokens");
}

// REQ: M0-W-1422 WRK-D7
TEST_F(ExecuteTest, EarliestOfSeveralStopSequencesWins) {
  const std::string full = greedy_text("Once upon a time", 60);
  ASSERT_NE(full.find("girl"), std::string::npos) << full;
  ASSERT_NE(full.find("park"), std::string::npos) << full;
  ASSERT_LT(full.find("girl"), full.find("park"));
  auto req = job_request("Once upon a time", 60, 0.0);
  req["stop"] = {"park", "girl"};
  JobStream js = run(req);
  ASSERT_NE(js.terminal(), nullptr);
  EXPECT_EQ((*js.terminal())["stop_sequence_matched"], "girl");
  EXPECT_EQ(js.text(), full.substr(0, full.find("girl")));
}

// M0-W-1824: CJK (3-byte), emoji (4-byte) and mixed-script prompts; the stream is valid
// UTF-8, no U+FFFD, and no token event holds a partial sequence (checked per event).
// REQ: M0-W-1824 WRK-D7 M0-W-1362
TEST_F(ExecuteTest, Utf8PromptsGiveValidUtf8Streams) {
  const std::vector<std::string> prompts = {
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
      "\xF0\x9F\x9A\x80\xF0\x9F\x94\xA5 GPU \xF0\x9F\x92\xBB",         // 🚀🔥 GPU 💻
      "Hello \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xE3\x81\x93\xE3\x82\x93 "
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xF0\x9F\x98\x80"};  // mixed scripts
  for (const auto& p : prompts) {
    for (unsigned seed : {7u, 8u}) {
      JobStream js = run(job_request(p, 20, 0.7, seed));
      ASSERT_NE(js.terminal(), nullptr) << js.describe();
      EXPECT_EQ(js.events.back().event, "end") << js.describe();
      const std::string text = js.text();
      EXPECT_TRUE(valid_utf8(text));
      EXPECT_EQ(text.find("\xEF\xBF\xBD"), std::string::npos) << "U+FFFD in: " << text;
    }
  }
}

// REQ: M0-W-1032 M0-W-1421
TEST_F(ExecuteTest, TopKOneEqualsGreedyAtAnyTemperature) {
  const std::string greedy = greedy_text("The cat sat", 40);
  for (unsigned seed : {1u, 2u, 3u}) {
    auto req = job_request("The cat sat", 40, 1.5, seed);
    req["top_k"] = 1;
    EXPECT_EQ(run(req).text(), greedy) << "seed " << seed;
  }
}

// min_p = 1 keeps only the most likely token: greedy again.
// REQ: M0-W-1421
TEST_F(ExecuteTest, MinPOneEqualsGreedy) {
  const std::string greedy = greedy_text("The cat sat", 40);
  auto req = job_request("The cat sat", 40, 1.0, 5);
  req["min_p"] = 1.0;
  EXPECT_EQ(run(req).text(), greedy);
}

// Temperature changes the output; different seeds give different samples.
// REQ: M0-W-1032 M0-W-1421 M0-W-1030
TEST_F(ExecuteTest, TemperatureAndSeedChangeTheOutput) {
  const std::string greedy = greedy_text("Once upon a time", 40);
  std::set<std::string> samples;
  int differs_from_greedy = 0;
  for (unsigned seed = 1; seed <= 5; ++seed) {
    const std::string t = run(job_request("Once upon a time", 40, 1.0, seed)).text();
    samples.insert(t);
    differs_from_greedy += t != greedy;
  }
  EXPECT_GE(differs_from_greedy, 4);
  EXPECT_GE(samples.size(), 4u) << "5 seeds at temperature 1 gave too few distinct texts";
}

// REQ: M0-W-1421
TEST_F(ExecuteTest, RepetitionPenaltyChangesGreedyOutput) {
  const std::string plain = greedy_text("Once upon a time", 80);
  auto req = job_request("Once upon a time", 80, 0.0);
  req["repetition_penalty"] = 1.5;
  EXPECT_NE(run(req).text(), plain);
}

// REQ: M0-W-1421
TEST_F(ExecuteTest, TinyTopPIsGreedy) {
  const std::string greedy = greedy_text("Once upon a time", 30);
  auto req = job_request("Once upon a time", 30, 1.0, 11);
  req["top_p"] = 0.0;  // the nucleus always keeps the single most likely token
  EXPECT_EQ(run(req).text(), greedy);
}

// REQ: M0-W-1826 M0-SYS-2.3.1 WRK-D15 M0-W-1031
TEST_F(ExecuteTest, SameRequestTwiceSameTokensAtTemperatureZero) {
  auto req = job_request("Write a haiku about GPU computing", 50, 0.0, 42);
  JobStream a = run(req);
  req["job_id"] = unique_job_id();
  JobStream b = run(req);
  EXPECT_EQ(a.pieces(), b.pieces());
  EXPECT_EQ((*a.terminal())["tokens_out"], (*b.terminal())["tokens_out"]);
}

// REQ: M0-W-1030 WRK-D15 M0-SYS-2.3.1
TEST_F(ExecuteTest, SameSeedTwiceSameTokensAtTemperature07) {
  auto req = job_request("Once upon a time", 60, 0.7, 123456789);
  JobStream a = run(req);
  req["job_id"] = unique_job_id();
  JobStream b = run(req);
  EXPECT_EQ(a.pieces(), b.pieces());
  EXPECT_EQ((*a.started())["seed"], 123456789u);
}

// An omitted seed is generated, returned in `started`, and reusing it reproduces the run.
// REQ: M0-W-1030 WRK-D6 WRK-D15
TEST_F(ExecuteTest, OmittedSeedIsReturnedAndReproduces) {
  auto req = job_request("Once upon a time", 40, 0.9);
  JobStream a = run(req);
  ASSERT_NE(a.started(), nullptr);
  const auto seed = (*a.started())["seed"].get<unsigned long long>();
  auto req2 = job_request("Once upon a time", 40, 0.9, seed);
  JobStream b = run(req2);
  EXPECT_EQ(a.pieces(), b.pieces());
  // Two omitted seeds are not the same constant.
  JobStream c = run(job_request("Once upon a time", 40, 0.9));
  EXPECT_NE((*c.started())["seed"], (*a.started())["seed"]);
}

// The largest seed (u64 max) is accepted and echoed exactly.
// REQ: WRK-D8 M0-W-1030
TEST_F(ExecuteTest, MaxU64SeedEchoedExactly) {
  auto req = job_request("Hi", 3, 0.7);
  req["seed"] = 18446744073709551615ull;
  JobStream js = run(req);
  ASSERT_NE(js.started(), nullptr);
  EXPECT_EQ((*js.started())["seed"].get<unsigned long long>(), 18446744073709551615ull);
}

// A chat request on a model without a chat template is refused clearly, never garbled.
// REQ: WRK-D8
TEST_F(ExecuteTest, ChatWithoutTemplateIsAClearError) {
  auto req = job_request("Hello", 5, 0.0);
  req["chat"] = true;
  SseStream s(port(), "/execute", req);
  if (s.status() == 400) {
    const auto body = nlohmann::json::parse(s.read_body());
    EXPECT_EQ(body["error"]["code"], "INVALID_REQUEST");
    EXPECT_EQ(body["error"]["details"][0]["field"], "chat");
  } else {
    // stories260K carries no template: an accepted chat request must not be served.
    ADD_FAILURE() << "chat:true on a template-less model answered " << s.status();
  }
}

// Chat wraps the prompt in the model's ChatML template (qwen2 fixture with specials), and
// byte-level BPE output never splits a UTF-8 sequence across token events.
class ExecuteQwenTest : public SharedWorkerTest<ExecuteQwenTest> {
 public:
  static WorkerOptions worker_options() {
    WorkerOptions o;
    o.model = generated_fixture("qwen2-g1-f32.gguf");
    return o;
  }
};

// REQ: WRK-D8 M0-W-1363 M0-W-1300
TEST_F(ExecuteQwenTest, ChatAddsTheChatMlTurn) {
  auto plain = job_request("Write a haiku", 4, 0.0);
  JobStream a = run_job(port(), plain);
  auto chat = job_request("Write a haiku", 4, 0.0);
  chat["chat"] = true;
  JobStream b = run_job(port(), chat);
  ASSERT_TRUE(a.violations.empty()) << a.describe();
  ASSERT_TRUE(b.violations.empty()) << b.describe();
  // <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n adds at least 8 tokens,
  // the specials as single ids.
  const int pa = (*a.started())["prompt_tokens"], pb = (*b.started())["prompt_tokens"];
  EXPECT_GE(pb, pa + 8);
  EXPECT_LE(pb, pa + 14);
}

// Random weights over a byte-level vocabulary emit arbitrary byte tokens: the worker must
// still send only whole UTF-8 sequences, event by event.
// REQ: WRK-D7 M0-W-1362 M0-W-1824
TEST_F(ExecuteQwenTest, ByteLevelOutputNeverSplitsUtf8) {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    JobStream js = run_job(
        port(), job_request("\xE6\x97\xA5\xE6\x9C\xAC GPU \xF0\x9F\x94\xA5", 40, 2.0, seed));
    EXPECT_TRUE(js.violations.empty()) << js.describe();
    EXPECT_TRUE(valid_utf8(js.text()));
  }
}

// stories260K never emits </s> (llama2.c separates stories with <s>), so EOS is checked on
// the generated EOS model: </s> has probability 0.1 at every position, and is the argmax.
// REQ: M0-W-1422 WRK-D6
TEST(ConformanceEos, EosStopsWithStopReasonEos) {
  WorkerOptions o;
  o.model = eos_model();
  WorkerProcess w(o);
  // Greedy: </s> first, so no text at all.
  JobStream g = run_job(w.port(), job_request("Once upon a time", 50, 0.0));
  ASSERT_TRUE(g.violations.empty()) << g.describe();
  EXPECT_EQ((*g.terminal())["stop_reason"], "eos");
  EXPECT_TRUE(g.tokens().empty()) << g.describe();
  EXPECT_EQ(g.text().find("</s>"), std::string::npos);
  // Sampling: every seed ends on EOS well before 300 tokens (P(no EOS) = 0.9^300).
  for (unsigned seed = 1; seed <= 5; ++seed) {
    JobStream js = run_job(w.port(), job_request("Once upon a time", 300, 1.0, seed));
    ASSERT_TRUE(js.violations.empty()) << js.describe();
    EXPECT_EQ((*js.terminal())["stop_reason"], "eos") << js.describe();
    EXPECT_LT((*js.terminal())["tokens_out"].get<int>(), 300);
    EXPECT_EQ(js.text().find("</s>"), std::string::npos) << "the EOS token's text was sent";
  }
  EXPECT_EQ(w.stop(), 0);
}

}  // namespace
}  // namespace conformance
