#include <gtest/gtest.h>

#include "server/sse.h"

namespace worker::server {
namespace {
using nlohmann::json;

// REQ: WRK-D6 M0-W-1310 M0-W-1811
TEST(ServerSse, EventFrameIsEventLineDataLineBlankLine) {
  const std::string f = sse_event("token", {{"t", "hi"}, {"i", 3}});
  EXPECT_EQ(f.rfind("event: token\ndata: ", 0), 0u);
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f.substr(f.size() - 2), "\n\n");
  const std::string data = f.substr(std::string("event: token\ndata: ").size());
  const json j = json::parse(data.substr(0, data.size() - 2));
  EXPECT_EQ(j["type"], "token");
  EXPECT_EQ(j["t"], "hi");
  EXPECT_EQ(j["i"], 3);
}

// REQ: WRK-D6
TEST(ServerSse, NewlinesInTextNeverSplitTheDataLine) {
  const std::string f = sse_event("token", {{"t", "a\nb\r\n\nc"}, {"i", 0}});
  // Exactly: "event:" line, "data:" line, blank line -> 3 newlines total.
  EXPECT_EQ(std::count(f.begin(), f.end(), '\n'), 3);
  EXPECT_NE(f.find(R"(a\nb\r\n\nc)"), std::string::npos);
}

// REQ: WRK-D6
TEST(ServerSse, InvalidUtf8IsReplacedNotThrown) {
  std::string f;
  EXPECT_NO_THROW(f = sse_event("token", {{"t", std::string("\xff")}, {"i", 0}}));
  EXPECT_NE(f.find("\xef\xbf\xbd"), std::string::npos);  // U+FFFD
}

// REQ: WRK-D9
TEST(ServerSse, CommentAndDataFrames) {
  EXPECT_EQ(sse_comment("queued position 2"), ": queued position 2\n\n");
  EXPECT_EQ(sse_comment("a\nb"), ": a b\n\n");
  EXPECT_EQ(sse_data("[DONE]"), "data: [DONE]\n\n");
}

// REQ: WRK-D6
TEST(ServerSse, ExplicitTypeIsKept) {
  const std::string f = sse_event("end", {{"type", "end"}, {"tokens_out", 1}});
  EXPECT_NE(f.find(R"("type":"end")"), std::string::npos);
}

}  // namespace
}  // namespace worker::server
