// D8 validation through the request table: every rule is sent a bad value and must name the
// field and constraint.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "server/request.h"
#include "test_support.h"

namespace worker::server {
namespace {
using nlohmann::json;

std::vector<FieldViolation> check(const std::string& body) {
  ParsedRequest r;
  return parse_request(body, kExecute, r);
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
  ParsedRequest r;
  auto v = parse_request(with(""), kExecute, r);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(r.gen.prompt, "Hello");
  EXPECT_FALSE(r.gen.chat);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_FALSE(r.seed_given);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 1.0f);
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, AllFieldsAccepted) {
  ParsedRequest r;
  auto v = parse_request(
      R"({"job_id":"j-1","prompt":"x","chat":true,"max_tokens":2048,"temperature":2,"top_p":0,
          "top_k":40,"min_p":1,"repetition_penalty":2,"stop":["a","b","c","d"],
          "seed":18446744073709551615})",
      kExecute, r);
  ASSERT_TRUE(v.empty()) << v[0].field << " " << v[0].constraint;
  EXPECT_EQ(r.job_id, "j-1");
  EXPECT_EQ(r.gen.max_tokens, 2048);
  EXPECT_EQ(r.gen.sampling.seed, 18446744073709551615ull);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.gen.stop.size(), 4u);
  EXPECT_EQ(r.gen.sampling.top_k, 40);
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
    ParsedRequest r;
    EXPECT_TRUE(parse_request(with(std::string(R"("temperature":)") + t), kExecute, r).empty())
        << t;
    EXPECT_EQ(r.gen.sampling.temperature, 0.0f) << t;
  }
  // The repetition penalty has no neutral stand-in: below its minimum it is refused.
  EXPECT_TRUE(has(check(with(R"("repetition_penalty":1e-40)")), "repetition_penalty", "range"));
  EXPECT_TRUE(has(check(with(R"("repetition_penalty":9e-6)")), "repetition_penalty", "range"));
  EXPECT_TRUE(check(with(R"("repetition_penalty":1e-5)")).empty());
  ParsedRequest r;
  ASSERT_TRUE(parse_request(with(R"("temperature":1e-5)"), kExecute, r).empty());
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 1e-5f);
  ASSERT_TRUE(parse_request(with(R"("temperature":0.7)"), kExecute, r).empty());
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.7f);
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
  ParsedRequest r;
  ASSERT_TRUE(parse_request(with(""), kExecute, r).empty());
  // Default max_tokens: 2048 capped by what the context leaves.
  auto v = prepare_prompt(r, *m.tok, 64);
  ASSERT_TRUE(v.empty());
  ASSERT_GT(r.gen.prompt_tokens.size(), 1u);
  EXPECT_EQ(r.gen.max_tokens, 64 - static_cast<int32_t>(r.gen.prompt_tokens.size()));

  ParsedRequest r2;
  ASSERT_TRUE(parse_request(with(R"("max_tokens":100)"), kExecute, r2).empty());
  v = prepare_prompt(r2, *m.tok, 64);
  EXPECT_TRUE(has(v, "max_tokens", "context_length"));

  ParsedRequest r3;
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += " once upon a time";
  ASSERT_TRUE(parse_request(json{{"prompt", long_prompt}}.dump(), kExecute, r3).empty());
  v = prepare_prompt(r3, *m.tok, 64);
  EXPECT_TRUE(has(v, "prompt", "context_length"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, StopSequenceLongerThan32TokensIsRejected) {
  const auto& m = testing::stories();
  ASSERT_TRUE(m.tok);
  std::string long_stop;
  for (int i = 0; i < 40; ++i) long_stop += " zq";
  ASSERT_GT(m.tok->encode(long_stop, false, false).size(), 32u);
  ParsedRequest r;
  ASSERT_TRUE(parse_request(json{{"prompt", "hi"}, {"stop", {"ok", long_stop}}}.dump(), kExecute, r)
                  .empty());
  auto v = prepare_prompt(r, *m.tok, 512);
  EXPECT_TRUE(has(v, "stop[1]", "max_tokens"));
  EXPECT_FALSE(has(v, "stop[0]", "max_tokens"));
}

// REQ: M0-W-1302 WRK-D8
TEST(ServerValidation, ChatOnModelWithoutTemplateIsRejected) {
  const auto& m = testing::stories();
  ASSERT_TRUE(m.tok);
  ASSERT_TRUE(m.tok->chat_template().empty());  // stories260K has no chat template
  ParsedRequest r;
  ASSERT_TRUE(parse_request(with(R"("chat":true)"), kExecute, r).empty());
  EXPECT_TRUE(has(prepare_prompt(r, *m.tok, 512), "chat", "chat_template"));
}

// Both front ends read the one table: every row shared by /execute and an OpenAI route gives
// the same verdict (field, constraint) and lands the same value for the same probe. The
// probes come from the row itself (its type and range), so a new row is covered too.
// REQ: M0-W-1302 WRK-D5 WRK-D8
TEST(ServerRequestTable, ExecuteAndOpenAiRoutesShareEveryRow) {
  auto probes = [](const Field& f) {
    std::vector<json> p = {json(nullptr), json("x"),          json(5),   json(1.5), json(-1),
                           json::array(), json::array({"a"}), json(true)};
    if (f.type == JsonType::Integer || f.type == JsonType::Number) {
      for (double d : {f.lo, f.lo - 0.5, f.lo - 1, f.hi, f.hi + 0.5, f.hi + 1, (f.lo + f.hi) / 2})
        if (std::isfinite(d))
          p.push_back(f.type == JsonType::Integer ? json(static_cast<int64_t>(d)) : json(d));
    }
    return p;
  };
  const std::vector<std::pair<Route, json>> openai = {
      {kCompletion, {{"prompt", "Hello"}}},
      {kChat, {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}}}};
  size_t shared_rows = 0, compared = 0;
  for (const Field& f : request_fields()) {
    if (!(f.routes & kExecute) || !(f.routes & kOpenAi)) continue;
    ++shared_rows;
    for (const json& probe : probes(f)) {
      json eb = {{"prompt", "Hello"}};
      eb[std::string(f.name)] = probe;
      ParsedRequest er;
      const auto ev = parse_request(eb.dump(), kExecute, er);
      for (const auto& [route, base] : openai) {
        if (!(f.routes & route)) continue;
        // null means "not given" to OpenAI clients only; the alias is the same row.
        if (probe.is_null()) continue;
        std::vector<std::string_view> names = {f.name};
        if (!f.alias.empty()) names.push_back(f.alias);
        for (std::string_view name : names) {
          json ob = base;
          ob[std::string(name)] = probe;
          ParsedRequest orq;
          const auto ov = parse_request(ob.dump(), route, orq);
          // OpenAI takes one stop string where /execute wants an array: the only difference.
          if (f.name == "stop" && probe.is_string()) continue;
          // /v1/completions takes a batch of one prompt.
          if (f.name == "prompt" && probe == json::array({"a"})) continue;
          ASSERT_EQ(ev.size(), ov.size()) << f.name << " as " << name << " = " << probe.dump();
          for (size_t i = 0; i < ev.size(); ++i) {
            EXPECT_EQ(ev[i].constraint, ov[i].constraint) << f.name << " = " << probe.dump();
            EXPECT_EQ(ev[i].field, ov[i].field == name ? std::string(f.name) : ov[i].field);
          }
          if (ev.empty()) {
            EXPECT_EQ(er.gen.prompt, orq.gen.prompt);
            EXPECT_EQ(er.gen.stop, orq.gen.stop);
            EXPECT_EQ(er.gen.sampling.temperature, orq.gen.sampling.temperature);
            EXPECT_EQ(er.gen.sampling.top_p, orq.gen.sampling.top_p);
            EXPECT_EQ(er.gen.sampling.top_k, orq.gen.sampling.top_k);
            EXPECT_EQ(er.gen.sampling.min_p, orq.gen.sampling.min_p);
            EXPECT_EQ(er.gen.sampling.repetition_penalty, orq.gen.sampling.repetition_penalty);
            EXPECT_EQ(er.seed_given, orq.seed_given);
            if (er.seed_given) {
              EXPECT_EQ(er.gen.sampling.seed, orq.gen.sampling.seed);
            }
            if (er.max_tokens_given) {
              EXPECT_EQ(er.gen.max_tokens, orq.gen.max_tokens);
            }
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GE(shared_rows, 9u);  // prompt, max_tokens, the five sampling fields, stop, seed
  EXPECT_GT(compared, 100u);
}

// The /execute field list is the table's: an unknown field names exactly the rows /execute
// takes, and OpenAI-only rows (model, messages, ...) are unknown there.
// REQ: M0-W-1302 WRK-D8
TEST(ServerRequestTable, ExecuteAcceptsExactlyItsRows) {
  for (const Field& f : request_fields()) {
    const auto v = check(with("\"" + std::string(f.name) + "\":null"));
    EXPECT_EQ(has(v, std::string(f.name), "unknown_field"), !(f.routes & kExecute)) << f.name;
    if (!f.alias.empty()) {
      EXPECT_TRUE(has(check(with("\"" + std::string(f.alias) + "\":5")), std::string(f.alias),
                      "unknown_field"));
    }
  }
  const auto v = check(with(R"("temprature":1)"));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].message,
            "unknown field (allowed: job_id, prompt, chat, max_tokens, temperature, top_p, "
            "top_k, min_p, repetition_penalty, stop, seed)");
}

}  // namespace
}  // namespace worker::server
