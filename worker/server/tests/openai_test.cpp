#include <gtest/gtest.h>

#include "server/openai.h"

namespace worker::server {
namespace {
using nlohmann::json;

// REQ: WRK-D5
TEST(ServerOpenAi, SingleUserTurnUsesTheModelTemplate) {
  OpenAiRequest r;
  auto v = parse_openai_body(
      R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,
          "temperature":0,"seed":1,"stop":"x","stream":true,"frequency_penalty":0,"user":"u"})",
      OpenAiKind::Chat, r);
  ASSERT_TRUE(v.empty());
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.prebuilt_template);
  EXPECT_EQ(r.execute["prompt"], "Hi");
  EXPECT_EQ(r.execute["chat"], true);
  EXPECT_EQ(r.execute["max_tokens"], 5);
  EXPECT_EQ(r.execute["stop"], json::array({"x"}));
  EXPECT_FALSE(r.execute.contains("frequency_penalty"));
}

// REQ: WRK-D5
TEST(ServerOpenAi, SystemAndMultiTurnBuildChatMl) {
  OpenAiRequest r;
  auto v = parse_openai_body(
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},
          {"role":"assistant","content":"Hello"},{"role":"user","content":[{"type":"text","text":"Again"}]}]})",
      OpenAiKind::Chat, r);
  ASSERT_TRUE(v.empty());
  EXPECT_TRUE(r.prebuilt_template);
  EXPECT_EQ(r.execute["prompt"],
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// REQ: WRK-D5 WRK-D8
TEST(ServerOpenAi, BadRequestsAreReported) {
  OpenAiRequest r;
  EXPECT_FALSE(parse_openai_body(R"({"messages":[]})", OpenAiKind::Chat, r).empty());
  EXPECT_FALSE(
      parse_openai_body(R"({"messages":[{"role":"robot","content":"x"}]})", OpenAiKind::Chat, r)
          .empty());
  EXPECT_FALSE(parse_openai_body(R"({"prompt":"x","n":2})", OpenAiKind::Completion, r).empty());
  EXPECT_FALSE(parse_openai_body(R"({"prompt":["a","b"]})", OpenAiKind::Completion, r).empty());
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
  auto check = [](const std::string& body, OpenAiKind kind, const std::string& field) {
    OpenAiRequest r;
    std::vector<FieldViolation> v;
    EXPECT_NO_THROW(v = parse_openai_body(body, kind, r)) << body;
    bool found = false;
    for (const auto& f : v) found |= f.field == field;
    EXPECT_TRUE(found) << body;
  };
  check(R"({"prompt":"x","stream_options":{"include_usage":"yes"}})", OpenAiKind::Completion,
        "stream_options.include_usage");
  check(R"({"messages":[{"role":"user","content":[{"type":5,"text":"x"}]}]})", OpenAiKind::Chat,
        "messages[0].content");
  check(R"({"prompt":"x","temperature":1e400})", OpenAiKind::Completion, "body");
  check(R"({"messages":[],"max_tokens":-1e999})", OpenAiKind::Chat, "body");
  OpenAiRequest r;
  EXPECT_TRUE(parse_openai_body(R"({"prompt":"x","stream_options":{"include_usage":null}})",
                                OpenAiKind::Completion, r)
                  .empty());
  EXPECT_FALSE(r.include_usage);
}

// REQ: WRK-D5
TEST(ServerOpenAi, CompletionDefaultsAndChunkShapes) {
  OpenAiRequest r;
  ASSERT_TRUE(parse_openai_body(R"({"prompt":"Once"})", OpenAiKind::Completion, r).empty());
  EXPECT_EQ(r.execute["max_tokens"], 16);
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
