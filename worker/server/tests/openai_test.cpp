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
