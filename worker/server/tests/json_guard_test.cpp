// The pre-parse guard of request bodies (issue 15 rows 3, 4).
#include "server/json_guard.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace worker::server {
namespace {

void parse(const char* text) {
  const auto j = nlohmann::json::parse(text);
  EXPECT_FALSE(j.is_discarded());
}

// REQ: WRK-D19
TEST(JsonGuard, DepthLimitCountsOnlyStructure) {
  EXPECT_FALSE(check_json_limits(std::string(64, '[') + std::string(64, ']')));
  auto e = check_json_limits(std::string(65, '[') + std::string(65, ']'));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rule, "depth");
  // Brackets inside strings (escaped quotes included) are text, not nesting.
  EXPECT_FALSE(check_json_limits(R"({"p":")" + std::string(1000, '[') + R"(\"[[["})"));
  // Depth is current nesting, not a count of brackets.
  std::string flat;
  for (int i = 0; i < 1000; ++i) flat += "[[]],";
  EXPECT_FALSE(check_json_limits("[" + flat + "1]"));
}

// REQ: WRK-D19
TEST(JsonGuard, StopsAMegabyteOfOpenBracketsEarly) {
  const std::string attack(1 << 20, '[');
  auto e = check_json_limits(attack);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->rule, "depth");
  EXPECT_EQ(e->field, "body");
}

// REQ: WRK-D19
TEST(JsonGuard, RejectsNumbersNoDoubleHolds) {
  for (const char* bad : {R"({"max_tokens":1e400})", R"([-1e400])", R"({"a":{"b":[1,2,1E+309]}})",
                          R"({"t":123456789e301})"}) {
    auto e = check_json_limits(bad);
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->rule, "number_range") << bad;
    // The parser itself throws on these: the guard is what keeps them from a 500.
    EXPECT_THROW(parse(bad), nlohmann::json::out_of_range) << bad;
  }
  for (const char* ok : {R"({"t":1e-400})", R"({"t":1.7976931348623157e308})",
                         R"({"n":123456789012345678901234567890})", R"({"s":"1e400"})",
                         R"({"x":-0.0,"y":true,"z":null,"w":false})"}) {
    EXPECT_FALSE(check_json_limits(ok)) << ok;
    EXPECT_NO_THROW(parse(ok)) << ok;
  }
}

// REQ: WRK-D19
TEST(JsonGuard, LeavesSyntaxErrorsToTheParser) {
  EXPECT_FALSE(check_json_limits(R"({"a":"unterminated)"));
  EXPECT_FALSE(check_json_limits("]]]]"));
  EXPECT_FALSE(check_json_limits("-"));
  EXPECT_FALSE(check_json_limits(""));
}

}  // namespace
}  // namespace worker::server
