// Stop logic and streaming of the generation loop. The engine here is a scripted fake that
// returns one-hot logits: these tests check only the loop's stop/hold-back/cancel logic,
// never inference (inference is checked in the parity tests).
#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/utf8.h"
#include "engine/generation.h"

namespace worker {
namespace {

constexpr int32_t kEos = 256;

// Byte tokenizer: id b < 256 is the byte b, 256 is EOS.
class ByteTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return "test-bytes"; }
  int32_t vocab_size() const override { return 257; }
  std::vector<int32_t> encode(std::string_view text, bool, bool) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string token_to_piece(int32_t id, bool) const override {
    return id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_id() const override { return kEos; }
  bool is_eog(int32_t id) const override { return id == kEos; }
  bool add_bos() const override { return false; }
};

class ScriptedEngine : public Engine {
 public:
  explicit ScriptedEngine(std::vector<int32_t> script, int32_t n_ctx = 512)
      : script_(std::move(script)), n_ctx_(n_ctx), logits_(257) {}
  const ModelConfig& config() const override { return cfg_; }
  BackendInfo info() const override { return {}; }
  VramUsage vram() const override { return {}; }
  int32_t n_ctx() const override { return n_ctx_; }
  int32_t n_past() const override { return n_past_; }
  void reset() override {
    n_past_ = 0;
    evals_ = 0;
  }
  void eval(std::span<const int32_t> tokens, bool) override {
    calls.push_back(tokens.size() == 1 ? "E" + std::to_string(tokens[0])
                                       : "P" + std::to_string(tokens.size()));
    n_past_ += static_cast<int32_t>(tokens.size());
    std::fill(logits_.begin(), logits_.end(), 0.0f);
    const size_t k = static_cast<size_t>(evals_++);
    logits_[static_cast<size_t>(k < script_.size() ? script_[k] : 'x')] = 10.0f;
    eval_calls.push_back(static_cast<int32_t>(tokens.size()));
  }
  std::span<const float> logits() const override { return logits_; }
  std::span<const float> logits_at(size_t) const override { return logits_; }
  int32_t sample(const SamplingParams& p, std::span<const int32_t> h, std::mt19937_64& rng,
                 uint64_t* hash) override {
    const int32_t id = Engine::sample(p, h, rng, hash);
    calls.push_back("S" + std::to_string(id));
    return id;
  }
  int32_t sample_and_continue(const SamplingParams& p, std::span<const int32_t> h,
                              std::mt19937_64& rng, uint64_t* hash) override {
    const int32_t id = Engine::sample(p, h, rng, hash);
    calls.push_back("C" + std::to_string(id));
    return id;
  }
  std::vector<int32_t> eval_calls;
  std::vector<std::string> calls;  // S<id> sample, C<id> sample_and_continue

 private:
  std::vector<int32_t> script_;
  int32_t n_ctx_;
  int32_t n_past_ = 0;
  int evals_ = 0;
  std::vector<float> logits_;
  ModelConfig cfg_;
};

std::vector<int32_t> bytes(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

// A greedy request for `prompt`, tokenized as generate()'s callers do.
GenerationRequest greedy_request(const Tokenizer& tok, const std::string& prompt,
                                 int32_t max_tokens) {
  GenerationRequest req;
  req.prompt = prompt;
  req.prompt_tokens = tokenize_prompt(tok, req.prompt, false);
  req.max_tokens = max_tokens;
  req.sampling.temperature = 0.0f;
  return req;
}

struct Run {
  GenerationResult res;
  std::vector<std::string> events;
};

Run run(const std::string& script, std::vector<std::string> stop, int32_t max_tokens = 100,
        bool eos_at_end = false) {
  auto ids = bytes(script);
  if (eos_at_end) ids.push_back(kEos);
  ScriptedEngine eng(ids);
  ByteTokenizer tok;
  GenerationRequest req = greedy_request(tok, "hi", max_tokens);
  req.stop = std::move(stop);
  Run r;
  GenerationCallbacks cb;
  cb.on_text = [&](const std::string& t, int32_t i, int32_t) {
    EXPECT_EQ(i, static_cast<int32_t>(r.events.size()));
    EXPECT_TRUE(utf8::is_valid(t)) << "event with a partial UTF-8 sequence";
    r.events.push_back(t);
  };
  r.res = generate(eng, tok, req, cb);
  return r;
}

// REQ: M0-W-1422 WRK-D7
TEST(EngineStopMatcher, HoldsPossibleStartAndNeverEmitsStop) {
  StopMatcher m({"END", "xyz"});
  EXPECT_EQ(m.push("abc E"), "abc ");  // "E" may start "END"
  EXPECT_EQ(m.push("N"), "");          // "EN" still may
  EXPECT_EQ(m.push("X"), "ENX");       // not a stop after all: released
  EXPECT_EQ(m.push("xy"), "");
  EXPECT_EQ(m.push("zEND"), "");  // "xyz" matches first (earliest occurrence)
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "xyz");
  EXPECT_EQ(m.push("more"), "");
}

// REQ: M0-W-1422 WRK-D7
TEST(EngineStopMatcher, TextBeforeStopInSameChunkIsEmitted) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.push("line1\n"), "line1");
  EXPECT_EQ(m.push("\nline2"), "");
  EXPECT_TRUE(m.matched());
  StopMatcher none({});
  EXPECT_EQ(none.push("a\n"), "a\n");
  EXPECT_EQ(none.release(), "");
}

// REQ: M0-W-1422 WRK-D7 WRK-D6
TEST(EngineGeneration, StopSequenceEndsWithoutItsText) {
  const auto r = run("Hello END world", {"END"});
  EXPECT_EQ(r.res.stop_reason, StopReason::StopSequence);
  EXPECT_EQ(r.res.stop_sequence_matched, "END");
  EXPECT_EQ(r.res.text, "Hello ");
  std::string joined;
  for (const auto& e : r.events) joined += e;
  EXPECT_EQ(joined, "Hello ");
  EXPECT_EQ(r.res.tokens.size(), 9u);  // generation stopped at the 'D'
}

// REQ: M0-W-1422 WRK-D7
TEST(EngineGeneration, HeldTextReleasedAtMaxTokens) {
  const auto r = run("abcEN", {"END"}, 5);
  EXPECT_EQ(r.res.stop_reason, StopReason::MaxTokens);
  EXPECT_EQ(r.res.text, "abcEN");
  EXPECT_EQ(r.res.tokens.size(), 5u);
  ASSERT_FALSE(r.events.empty());
  EXPECT_EQ(r.events.back(), "EN");
}

// REQ: M0-W-1422
TEST(EngineGeneration, EosStopsAndIsNotEmitted) {
  const auto r = run("ok", {}, 100, true);
  EXPECT_EQ(r.res.stop_reason, StopReason::Eos);
  EXPECT_EQ(r.res.text, "ok");
  EXPECT_EQ(r.res.tokens.back(), kEos);
}

// REQ: WRK-D7 M0-W-1824
TEST(EngineGeneration, MultibyteCharactersNeverSplitAcrossEvents) {
  const std::string text = "a\xE6\x97\xA5\xF0\x9F\x98\x80z";  // a, U+65E5, U+1F600, z
  const auto r = run(text, {}, static_cast<int32_t>(text.size()));
  EXPECT_EQ(r.res.text, text);
  EXPECT_EQ(r.events.size(), 4u);
}

// The loop's calls, in order: the prompt, then sample_and_continue (a backend may start the
// picked token's step there) followed by the eval of exactly that token, for every token but
// the last, which takes sample() and no eval. An EOS picked by sample_and_continue ends the job
// with no eval after it (the started step is left to the engine to drop).
// REQ: M0-W-1420 M0-W-1422
TEST(EngineGeneration, SampleAndContinueIsFollowedByTheEvalOfItsToken) {
  {
    ScriptedEngine eng(bytes("abcd"));
    ByteTokenizer tok;
    (void)generate(eng, tok, greedy_request(tok, "hi", 4), {});
    const std::vector<std::string> want = {"P2", "C97", "E97", "C98", "E98", "C99", "E99", "S100"};
    EXPECT_EQ(eng.calls, want);
  }
  {
    auto ids = bytes("ab");
    ids.push_back(kEos);
    ScriptedEngine eng(ids);
    ByteTokenizer tok;
    const auto res = generate(eng, tok, greedy_request(tok, "hi", 10), {});
    EXPECT_EQ(res.stop_reason, StopReason::Eos);
    const std::vector<std::string> want = {"P2",  "C97", "E97",
                                           "C98", "E98", "C" + std::to_string(kEos)};
    EXPECT_EQ(eng.calls, want);
  }
}

// REQ: M0-W-1330 WRK-D10
TEST(EngineGeneration, ShouldStopPolledBeforeEveryForwardPass) {
  ScriptedEngine eng(bytes("abcdefgh"));
  ByteTokenizer tok;
  const GenerationRequest req = greedy_request(tok, "p", 100);
  int polls = 0;
  GenerationCallbacks cb;
  cb.should_stop = [&] { return ++polls > 3; };  // prefill + 2 decode passes allowed
  const auto res = generate(eng, tok, req, cb);
  EXPECT_EQ(res.stop_reason, StopReason::Cancelled);
  EXPECT_EQ(eng.eval_calls.size(), 3u);
  EXPECT_EQ(res.tokens.size(), 3u);
  EXPECT_STREQ(stop_reason_name(res.stop_reason), "cancelled");
  EXPECT_EQ(eng.n_past(), 0) << "a cancelled job must free its KV cache (D10)";
}

// on_prompt_running: once, during the prompt's eval (eval_overlapped), before any text; decode
// steps use eval(); a job stopped before its prompt never calls it.
// REQ: M0-W-1311 WRK-D6
TEST(EngineGeneration, PromptRunningHookOnceBeforeAnyText) {
  class Overlapping : public ScriptedEngine {
   public:
    using ScriptedEngine::ScriptedEngine;
    void eval_overlapped(std::span<const int32_t> tokens, bool all_logits,
                         const std::function<void()>& meanwhile) override {
      ++overlapped;
      eval(tokens, all_logits);
      if (meanwhile) meanwhile();
    }
    int overlapped = 0;
  };
  Overlapping eng(bytes("abcdef"));
  ByteTokenizer tok;
  const GenerationRequest req = greedy_request(tok, "pq", 4);
  std::vector<std::string> seen;
  GenerationCallbacks cb;
  cb.on_prompt_running = [&] { seen.push_back("running@" + std::to_string(eng.n_past())); };
  cb.on_text = [&](const std::string& t, int32_t, int32_t) { seen.push_back(t); };
  const auto res = generate(eng, tok, req, cb);
  EXPECT_EQ(res.text, "abcd");
  EXPECT_EQ(seen, (std::vector<std::string>{"running@2", "a", "b", "c", "d"}));
  EXPECT_EQ(eng.overlapped, 1);
  EXPECT_EQ(eng.eval_calls, (std::vector<int32_t>{2, 1, 1, 1}));

  Overlapping stopped(bytes("abc"));
  int calls = 0;
  GenerationCallbacks cs;
  cs.should_stop = [] { return true; };
  cs.on_prompt_running = [&] { ++calls; };
  EXPECT_EQ(generate(stopped, tok, req, cs).stop_reason, StopReason::Cancelled);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(stopped.overlapped, 0);
}

// REQ: M0-W-1420 WRK-D8
TEST(EngineGeneration, MaxTokensCappedByContextAndValidated) {
  ScriptedEngine eng(bytes("abcdefghijkl"), 6);
  ByteTokenizer tok;
  GenerationRequest req = greedy_request(tok, "pp", 100);  // 2 tokens, context 6: <= 4 new
  const auto res = generate(eng, tok, req, {});
  EXPECT_EQ(res.tokens.size(), 4u);
  EXPECT_EQ(res.stop_reason, StopReason::MaxTokens);
  EXPECT_LE(eng.n_past(), 6);
  req.prompt = "pppppp";
  req.prompt_tokens = tokenize_prompt(tok, req.prompt, false);
  EXPECT_THROW(generate(eng, tok, req, {}), WorkerError);
  req.prompt = "p";
  req.prompt_tokens = tokenize_prompt(tok, req.prompt, false);
  req.max_tokens = 0;
  EXPECT_THROW(generate(eng, tok, req, {}), WorkerError);
}

}  // namespace
}  // namespace worker
