#include <gtest/gtest.h>

#include "common/utf8.h"

using namespace worker;

// REQ: M0-W-1362 WRK-D7
TEST(Utf8, ValidAndInvalidSequences) {
  EXPECT_TRUE(utf8::is_valid("plain ascii"));
  EXPECT_TRUE(utf8::is_valid("\xE6\x97\xA5\xE6\x9C\xAC"));  // 日本
  EXPECT_TRUE(utf8::is_valid("\xF0\x9F\x98\x80"));          // 😀
  EXPECT_FALSE(utf8::is_valid("\xC0\xAF"));                 // overlong '/'
  EXPECT_FALSE(utf8::is_valid("\xED\xA0\x80"));             // surrogate
  EXPECT_FALSE(utf8::is_valid("\xF4\x90\x80\x80"));         // > U+10FFFF
  EXPECT_FALSE(utf8::is_valid("\xE6\x97"));                 // truncated
  EXPECT_EQ(utf8::count_scalars("a\xE6\x97\xA5\xF0\x9F\x98\x80").value(), 3u);
}

// REQ: M0-W-1362 WRK-D7
TEST(Utf8, CompletePrefixStopsBeforeTruncatedSequence) {
  EXPECT_EQ(utf8::complete_prefix_len("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8::complete_prefix_len("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8::complete_prefix_len("\xE6"), 0u);
  EXPECT_EQ(utf8::complete_prefix_len("x\xFFy"), 3u);  // invalid byte is not held back
}

TEST(Utf8, AppendRoundTrip) {
  std::string s;
  for (uint32_t cp : {0x41u, 0xE9u, 0x65E5u, 0x1F600u}) utf8::append(s, cp);
  const auto cps = utf8::decode_lossy(s);
  ASSERT_EQ(cps.size(), 4u);
  EXPECT_EQ(cps[3], 0x1F600u);
}
