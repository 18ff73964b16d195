#include <gtest/gtest.h>

#include "server/openai.h"

namespace worker::server {
namespace {
using nlohmann::json;

// REQ: WRK-D5
TEST(ServerOpenAi, SingleUserTurnUsesTheModelTemplate) {
  ParsedRequest r;
  auto v = parse_request(
      R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,
          "temperature":0,"seed":1,"stop":"x","stream":true,"frequency_penalty":0,"user":"u"})",
      kChat, r);
  ASSERT_TRUE(v.empty());
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.prompt_is_template);
  EXPECT_EQ(r.gen.prompt, "Hi");
  EXPECT_TRUE(r.gen.chat);
  EXPECT_EQ(r.gen.max_tokens, 5);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"x"});
}

// REQ: WRK-D5
TEST(ServerOpenAi, SystemAndMultiTurnBuildChatMl) {
  ParsedRequest r;
  auto v = parse_request(
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},
          {"role":"assistant","content":"Hello"},{"role":"user","content":[{"type":"text","text":"Again"}]}]})",
      kChat, r);
  ASSERT_TRUE(v.empty());
  EXPECT_TRUE(r.prompt_is_template);
  EXPECT_FALSE(r.gen.chat);
  EXPECT_EQ(r.gen.prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// REQ: WRK-D5 WRK-D8
TEST(ServerOpenAi, BadRequestsAreReported) {
  ParsedRequest r;
  EXPECT_FALSE(parse_request(R"({"messages":[]})", kChat, r).empty());
  EXPECT_FALSE(parse_request(R"({"messages":[{"role":"robot","content":"x"}]})", kChat, r).empty());
  EXPECT_FALSE(parse_request(R"({"prompt":"x","n":2})", kCompletion, r).empty());
  EXPECT_FALSE(parse_request(R"({"prompt":["a","b"]})", kCompletion, r).empty());
  EXPECT_FALSE(parse_request(R"({"prompt":"x","echo":true})", kCompletion, r).empty());
  const json e = openai_invalid({{"max_tokens", "range", "bad"}});
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_TRUE(e["error"]["message"].is_string());
}

// Shapes that used to escape the validator as a JSON library exception (a 500 with its
// internal text): a non-boolean include_usage, a content part whose "type" is not a
// string, a number past double's range. Each is a 400 naming the field now.
// REQ: WRK-D5 M0-W-1302
TEST(ServerOpenAi, WrongTypesAreViolationsNotExceptions) {
  auto check = [](const std::string& body, Route route, const std::string& field) {
    ParsedRequest r;
    Violations v;
    EXPECT_NO_THROW(v = parse_request(body, route, r)) << body;
    bool found = false;
    for (const auto& f : v) found |= f.field == field;
    EXPECT_TRUE(found) << body;
  };
  check(R"({"prompt":"x","stream_options":{"include_usage":"yes"}})", kCompletion,
        "stream_options.include_usage");
  check(R"({"messages":[{"role":"user","content":[{"type":5,"text":"x"}]}]})", kChat,
        "messages[0].content");
  check(R"({"prompt":"x","temperature":1e400})", kCompletion, "body");
  check(R"({"messages":[],"max_tokens":-1e999})", kChat, "body");
  ParsedRequest r;
  EXPECT_TRUE(
      parse_request(R"({"prompt":"x","stream_options":{"include_usage":null}})", kCompletion, r)
          .empty());
  EXPECT_FALSE(r.include_usage);
}

// REQ: WRK-D5
TEST(ServerOpenAi, CompletionDefaultsAndChunkShapes) {
  ParsedRequest r;
  ASSERT_TRUE(parse_request(R"({"prompt":"Once"})", kCompletion, r).empty());
  EXPECT_EQ(r.gen.max_tokens, 16);
  EXPECT_TRUE(r.max_tokens_given);
  OpenAiStream s{OpenAiKind::Chat, "chatcmpl-1", "m", 100};
  const json c = s.chunk({{"content", "hi"}}, nullptr);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "hi");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  const json f = s.full("text", "length", 3, 4);
  EXPECT_EQ(f["object"], "chat.completion");
  EXPECT_EQ(f["choices"][0]["message"]["content"], "text");
  EXPECT_EQ(f["usage"]["total_tokens"], 7);
  EXPECT_STREQ(openai_finish_reason("max_tokens"), "length");
  EXPECT_STREQ(openai_finish_reason("eos"), "stop");
  EXPECT_STREQ(openai_finish_reason("stop_sequence"), "stop");
}

}  // namespace
}  // namespace worker::server
