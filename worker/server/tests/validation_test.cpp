// D8 validation: every rule is sent a bad value and must name the field and constraint.
#include <gtest/gtest.h>

#include <string>

#include "server/validation.h"
#include "test_support.h"

namespace worker::server {
namespace {
using nlohmann::json;

std::vector<FieldViolation> check(const std::string& body) {
  ExecuteRequest r;
  return parse_execute_body(body, r);
}

bool has(const std::vector<FieldViolation>& v, const std::string& field,
         const std::string& constraint) {
  for (const auto& f : v)
    if (f.field == field && f.constraint == constraint) return true;
  return false;
}

std::string with(const std::string& extra) {
  return R"({"prompt":"Hello")" + (extra.empty() ? "" : "," + extra) + "}";
}

// REQ: M0-W-1302 WRK-D8 M0-W-1811
TEST(ServerValidation, MinimalRequestIsValidWithDefaults) {
  ExecuteRequest r;
  auto v = parse_execute_body(with(""), r);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(r.prompt, "Hello");
  EXPECT_FALSE(r.chat);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.seed_given);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, AllFieldsAccepted) {
  ExecuteRequest r;
  auto v = parse_execute_body(
      R"({"job_id":"j-1","prompt":"x","chat":true,"max_tokens":2048,"temperature":2,"top_p":0,
          "top_k":40,"min_p":1,"repetition_penalty":2,"stop":["a","b","c","d"],
          "seed":18446744073709551615})",
      r);
  ASSERT_TRUE(v.empty()) << v[0].field << " " << v[0].constraint;
  EXPECT_EQ(r.job_id, "j-1");
  EXPECT_EQ(*r.max_tokens, 2048);
  EXPECT_EQ(r.sampling.seed, 18446744073709551615ull);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.stop.size(), 4u);
  EXPECT_EQ(r.sampling.top_k, 40);
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, PromptRules) {
  EXPECT_TRUE(has(check(R"({})"), "prompt", "required"));
  EXPECT_TRUE(has(check(R"({"prompt":5})"), "prompt", "type"));
  EXPECT_TRUE(has(check(R"({"prompt":""})"), "prompt", "min_length"));
  // 32768 scalars pass, 32769 fail; counted in scalars, not bytes ("é" is 2 bytes).
  std::string ok, too_long;
  for (int i = 0; i < 32768; ++i) ok += "\xc3\xa9";
  too_long = ok + "a";
  EXPECT_TRUE(check(json{{"prompt", ok}}.dump()).empty());
  EXPECT_TRUE(has(check(json{{"prompt", too_long}}.dump()), "prompt", "max_length"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, InvalidUtf8InPromptNamesThePrompt) {
  const std::string body = std::string(R"({"max_tokens":5,"prompt":"ab)") + "\xff\xfe" + R"("})";
  auto v = check(body);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].field, "prompt");
  EXPECT_EQ(v[0].constraint, "utf8");
  // A lone surrogate escape is not a Unicode scalar value either.
  EXPECT_TRUE(has(check(R"({"prompt":"a\ud800b"})"), "prompt", "utf8"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, PromptIsNeverEchoed) {
  const std::string secret = "TOP-SECRET-PROMPT-TEXT";
  auto v = check(json{{"prompt", secret}, {"max_tokens", 0}, {"temperature", "hot"}}.dump());
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(invalid_request_body(v).dump().find(secret), std::string::npos);
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, MaxTokensRules) {
  EXPECT_TRUE(has(check(with(R"("max_tokens":0)")), "max_tokens", "range"));
  EXPECT_TRUE(has(check(with(R"("max_tokens":2049)")), "max_tokens", "range"));
  EXPECT_TRUE(has(check(with(R"("max_tokens":-1)")), "max_tokens", "range"));
  EXPECT_TRUE(has(check(with(R"("max_tokens":1.5)")), "max_tokens", "type"));
  EXPECT_TRUE(has(check(with(R"("max_tokens":"10")")), "max_tokens", "type"));
  EXPECT_TRUE(check(with(R"("max_tokens":1)")).empty());
}

// A number past double's range used to escape as the JSON library's out_of_range (a 500).
// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, NumberOutOfRangeIsAJsonViolation) {
  for (const char* body :
       {R"({"prompt":"x","temperature":1e400})", R"({"prompt":"x","seed":-1e999})",
        R"({"prompt":"x","stop":[1E+400]})"}) {
    std::vector<FieldViolation> v;
    EXPECT_NO_THROW(v = check(body)) << body;
    EXPECT_TRUE(has(v, "body", "json")) << body;
  }
}

// WRK-D27: temperatures below the documented minimum are sampled greedily (the sampler's
// logit / temperature would overflow to inf and NaN at 1e-40); the minimum itself samples.
// REQ: WRK-D27 M0-W-1032
TEST(ServerValidation, TinyTemperatureIsGreedy) {
  for (const char* t : {"1e-40", "1e-38", "1e-300", "9.99e-6", "5e-324"}) {
    ExecuteRequest r;
    EXPECT_TRUE(parse_execute_body(with(std::string(R"("temperature":)") + t), r).empty()) << t;
    EXPECT_EQ(r.sampling.temperature, 0.0f) << t;
  }
  // The repetition penalty has no neutral stand-in: below its minimum it is refused.
  EXPECT_TRUE(has(check(with(R"("repetition_penalty":1e-40)")), "repetition_penalty", "range"));
  EXPECT_TRUE(has(check(with(R"("repetition_penalty":9e-6)")), "repetition_penalty", "range"));
  EXPECT_TRUE(check(with(R"("repetition_penalty":1e-5)")).empty());
  ExecuteRequest r;
  ASSERT_TRUE(parse_execute_body(with(R"("temperature":1e-5)"), r).empty());
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1e-5f);
  ASSERT_TRUE(parse_execute_body(with(R"("temperature":0.7)"), r).empty());
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f);
}

// REQ: M0-W-1302 WRK-D8 M0-W-1032
TEST(ServerValidation, SamplingRanges) {
  EXPECT_TRUE(has(check(with(R"("temperature":-0.1)")), "temperature", "range"));
  EXPECT_TRUE(has(check(with(R"("temperature":2.01)")), "temperature", "range"));
  EXPECT_TRUE(has(check(with(R"("temperature":"1")")), "temperature", "type"));
  EXPECT_TRUE(check(with(R"("temperature":0)")).empty());
  EXPECT_TRUE(has(check(with(R"("top_p":1.5)")), "top_p", "range"));
  EXPECT_TRUE(has(check(with(R"("top_p":-0.5)")), "top_p", "range"));
  EXPECT_TRUE(has(check(with(R"("top_k":-1)")), "top_k", "range"));
  EXPECT_TRUE(has(check(with(R"("top_k":1.5)")), "top_k", "type"));
  EXPECT_TRUE(check(with(R"("top_k":0)")).empty());
  EXPECT_TRUE(has(check(with(R"("min_p":1.01)")), "min_p", "range"));
  EXPECT_TRUE(has(check(with(R"("min_p":-1)")), "min_p", "range"));
  EXPECT_TRUE(has(check(with(R"("repetition_penalty":0)")), "repetition_penalty", "range"));
  EXPECT_TRUE(has(check(with(R"("repetition_penalty":2.5)")), "repetition_penalty", "range"));
  EXPECT_TRUE(check(with(R"("repetition_penalty":0.01)")).empty());
}

// REQ: M0-W-1302 WRK-D8 M0-W-1030
TEST(ServerValidation, SeedRules) {
  EXPECT_TRUE(has(check(with(R"("seed":-1)")), "seed", "range"));
  EXPECT_TRUE(has(check(with(R"("seed":1.5)")), "seed", "type"));
  EXPECT_TRUE(has(check(with(R"("seed":18446744073709551616)")), "seed", "type"));
  EXPECT_TRUE(has(check(with(R"("seed":"42")")), "seed", "type"));
  EXPECT_TRUE(check(with(R"("seed":0)")).empty());
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, StopRules) {
  EXPECT_TRUE(has(check(with(R"("stop":"x")")), "stop", "type"));
  EXPECT_TRUE(has(check(with(R"("stop":["a","b","c","d","e"])")), "stop", "max_items"));
  EXPECT_TRUE(has(check(with(R"("stop":["a",""])")), "stop[1]", "non_empty"));
  EXPECT_TRUE(has(check(with(R"("stop":["a",3])")), "stop[1]", "type"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, ChatJobIdUnknownAndBody) {
  EXPECT_TRUE(has(check(with(R"("chat":"yes")")), "chat", "type"));
  EXPECT_TRUE(has(check(with(R"("job_id":"")")), "job_id", "min_length"));
  EXPECT_TRUE(has(check(with(R"("job_id":7)")), "job_id", "type"));
  EXPECT_TRUE(has(check(json{{"prompt", "x"}, {"job_id", std::string(129, 'a')}}.dump()), "job_id",
                  "max_length"));
  EXPECT_TRUE(has(check(with(R"("job_id":"a\nb")")), "job_id", "printable_ascii"));
  EXPECT_TRUE(has(check(with(R"("temprature":1)")), "temprature", "unknown_field"));
  EXPECT_TRUE(has(check("{not json"), "body", "json"));
  EXPECT_TRUE(has(check("[1,2]"), "body", "type"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, AllViolationsAreListed) {
  auto v = check(R"({"prompt":"","max_tokens":0,"temperature":9,"top_p":2,"top_k":-3,
                     "min_p":5,"repetition_penalty":0,"stop":[""],"seed":-2,"chat":1,"x":1})");
  EXPECT_EQ(v.size(), 11u);
  const json body = invalid_request_body(v);
  EXPECT_EQ(body["error"]["code"], "INVALID_REQUEST");
  EXPECT_EQ(body["error"]["details"].size(), 11u);
  for (const auto& d : body["error"]["details"]) {
    EXPECT_TRUE(d.contains("field"));
    EXPECT_TRUE(d.contains("constraint"));
    EXPECT_TRUE(d.contains("message"));
  }
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, ContextLengthAndDefaultMaxTokensWithRealTokenizer) {
  const auto& m = testing::stories();
  ASSERT_TRUE(m.tok);
  ExecuteRequest r;
  ASSERT_TRUE(parse_execute_body(with(""), r).empty());
  std::vector<int32_t> toks;
  // Default max_tokens: 2048 capped by what the context leaves.
  auto v = check_token_limits(r, *m.tok, 64, toks);
  ASSERT_TRUE(v.empty());
  ASSERT_GT(toks.size(), 1u);
  EXPECT_EQ(*r.max_tokens, 64 - static_cast<int32_t>(toks.size()));

  ExecuteRequest r2;
  ASSERT_TRUE(parse_execute_body(with(R"("max_tokens":100)"), r2).empty());
  v = check_token_limits(r2, *m.tok, 64, toks);
  EXPECT_TRUE(has(v, "max_tokens", "context_length"));

  ExecuteRequest r3;
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += " once upon a time";
  ASSERT_TRUE(parse_execute_body(json{{"prompt", long_prompt}}.dump(), r3).empty());
  v = check_token_limits(r3, *m.tok, 64, toks);
  EXPECT_TRUE(has(v, "prompt", "context_length"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, StopSequenceLongerThan32TokensIsRejected) {
  const auto& m = testing::stories();
  ASSERT_TRUE(m.tok);
  std::string long_stop;
  for (int i = 0; i < 40; ++i) long_stop += " zq";
  ASSERT_GT(m.tok->encode(long_stop, false, false).size(), 32u);
  ExecuteRequest r;
  ASSERT_TRUE(
      parse_execute_body(json{{"prompt", "hi"}, {"stop", {"ok", long_stop}}}.dump(), r).empty());
  std::vector<int32_t> toks;
  auto v = check_token_limits(r, *m.tok, 512, toks);
  EXPECT_TRUE(has(v, "stop[1]", "max_tokens"));
  EXPECT_FALSE(has(v, "stop[0]", "max_tokens"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, ChatOnModelWithoutTemplateIsRejected) {
  const auto& m = testing::stories();
  ASSERT_TRUE(m.tok);
  ASSERT_TRUE(m.tok->chat_template().empty());  // stories260K has no chat template
  ExecuteRequest r;
  ASSERT_TRUE(parse_execute_body(with(R"("chat":true)"), r).empty());
  std::vector<int32_t> toks;
  EXPECT_TRUE(has(check_token_limits(r, *m.tok, 512, toks), "chat", "chat_template"));
}

}  // namespace
}  // namespace worker::server
