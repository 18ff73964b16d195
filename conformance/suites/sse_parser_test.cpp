// Unit tests of the harness's strict SSE parser and HTTP chunk decoding: the conformance
// verdicts are only as good as this parser.
#include <gtest/gtest.h>

#include "harness/sse_parser.h"
#include "harness/worker_stream.h"

namespace conformance {
namespace {

// Each test gets a fresh parser `p`; parse() feeds it one read per piece and ends the
// stream, so a test states only the wire bytes and what the parser made of them.
class ConformanceSseParser : public ::testing::Test {
 protected:
  std::vector<SseEvent> parse(const std::vector<std::string>& reads) {
    for (const auto& r : reads) p.feed(r);
    p.finish();
    return p.events();
  }
  SseParser p;
};

TEST_F(ConformanceSseParser, SingleEventLf) {
  auto ev = parse({"event: token\ndata: {\"type\":\"token\"}\n\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].event, "token");
  EXPECT_EQ(ev[0].data, "{\"type\":\"token\"}");
  EXPECT_EQ(ev[0].data_lines, 1);
  EXPECT_TRUE(p.violations().empty());
}

TEST_F(ConformanceSseParser, CrLfAndBareCrLineEnds) {
  auto ev = parse({"event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\r"});
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].event, "a");
  EXPECT_EQ(ev[0].data, "1");
  EXPECT_EQ(ev[1].event, "b");
  EXPECT_EQ(ev[1].data, "2");
  EXPECT_TRUE(p.violations().empty());
}

TEST_F(ConformanceSseParser, CrLfSplitBetweenReadsIsOneLineEnd) {
  // The CR ends one read and its LF starts the next: must not produce an empty line
  // (which would dispatch a half event).
  auto ev = parse({"event: a\r", "\ndata: x\r", "\n\r", "\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].event, "a");
  EXPECT_EQ(ev[0].data, "x");
  EXPECT_TRUE(p.violations().empty()) << p.violations().front();
}

TEST_F(ConformanceSseParser, EventSplitAtEveryByte) {
  const std::string wire =
      "event: started\ndata: {\"a\":1}\n\n: queued\n\nevent: end\ndata: {\"b\":2}\n\n";
  std::vector<std::string> reads;
  for (char c : wire) reads.emplace_back(1, c);
  auto ev = parse(reads);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].data, "{\"a\":1}");
  EXPECT_EQ(ev[1].event, "end");
  ASSERT_EQ(p.comments().size(), 1u);
  EXPECT_EQ(p.comments()[0].text, " queued");
  EXPECT_TRUE(p.violations().empty());
}

// Found by fuzz_sse_parser (issue 15): a leading BOM split across reads was taken as line
// bytes instead of being reported, so the verdict depended on how the socket split the body.
// REQ: WRK-D6
TEST_F(ConformanceSseParser, LeadingBomSplitAcrossReadsIsStillReported) {
  const std::string wire =
      "\xEF\xBB\xBF"
      "event: a\ndata: 1\n\n";
  SseParser whole;
  whole.feed(wire);
  whole.finish();
  std::vector<std::string> reads;
  for (char c : wire) reads.emplace_back(1, c);
  auto ev = parse(reads);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].event, "a");
  ASSERT_EQ(p.violations().size(), 1u);
  EXPECT_NE(p.violations()[0].find("BOM"), std::string::npos);
  EXPECT_EQ(p.violations(), whole.violations());
  // The fuzzer's input: a BOM, then bytes that start like one but are not.
  const std::string crash = "\xEF\xBB\xBF\xEFt" + std::string(1, '\0') + "da\x03\xEFtaa:\xF8";
  SseParser a, b;
  a.feed(crash);
  a.finish();
  for (char c : crash) b.feed(std::string(1, c));
  b.finish();
  EXPECT_EQ(a.violations(), b.violations());
  // Only part of a BOM, then the end: those bytes are an unterminated line, not a BOM.
  SseParser c;
  c.feed("\xEF");
  c.feed("\xBB");
  c.finish();
  ASSERT_EQ(c.violations().size(), 1u);
  EXPECT_NE(c.violations()[0].find("inside a line"), std::string::npos);
}

TEST_F(ConformanceSseParser, EventIsOnlyCompleteAtTheBlankLine) {
  p.feed("event: token\ndata: {}\n");
  EXPECT_TRUE(p.events().empty());
  p.feed("\n");
  EXPECT_EQ(p.events().size(), 1u);
}

TEST_F(ConformanceSseParser, ArrivalTimeIsThatOfTheCompletingRead) {
  const auto t0 = Clock::now();
  const auto t1 = t0 + std::chrono::milliseconds(250);
  p.feed("event: token\ndata: {}\n", t0);
  p.feed("\n", t1);
  ASSERT_EQ(p.events().size(), 1u);
  EXPECT_EQ(p.events()[0].arrival, t1);
}

TEST_F(ConformanceSseParser, CommentsAreNotEvents) {
  auto ev = parse({": keep-alive\n\n:\n\nevent: x\ndata: 1\n\n"});
  EXPECT_EQ(ev.size(), 1u);
  EXPECT_EQ(p.comments().size(), 2u);
  EXPECT_TRUE(p.violations().empty());
}

TEST_F(ConformanceSseParser, MultiLineDataJoinedWithNewline) {
  auto ev = parse({"data: line1\ndata:line2\ndata: \n\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "line1\nline2\n");
  EXPECT_EQ(ev[0].data_lines, 3);
  EXPECT_EQ(ev[0].event, "message");
  EXPECT_FALSE(ev[0].has_event);
}

TEST_F(ConformanceSseParser, OnlyOneLeadingSpaceIsStripped) {
  auto ev = parse({"event:  two\ndata:  x\n\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].event, " two");
  EXPECT_EQ(ev[0].data, " x");
}

TEST_F(ConformanceSseParser, IdField) {
  auto ev = parse({"id: 7\nevent: a\ndata: 1\n\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].has_id);
  EXPECT_EQ(ev[0].id, "7");
}

TEST_F(ConformanceSseParser, StrictViolations) {
  parse({"evnt: typo\ndata: 1\n\nevent: nodata\n\nbare\ndata: 2\n\nevent: cut\ndata: 3"});
  const auto& v = p.violations();
  ASSERT_EQ(v.size(), 5u);
  EXPECT_NE(v[0].find("unknown field 'evnt'"), std::string::npos);
  EXPECT_NE(v[1].find("without a data line"), std::string::npos);
  EXPECT_NE(v[2].find("line without ':'"), std::string::npos);
  EXPECT_NE(v[3].find("inside a line"), std::string::npos);
  EXPECT_NE(v[4].find("inside an event"), std::string::npos);
  // The truncated last event is never dispatched.
  EXPECT_EQ(p.events().size(), 2u);
}

TEST_F(ConformanceSseParser, TakeNewEventsHandsOutEachEventOnce) {
  p.feed("data: 1\n\ndata: 2\n\n");
  EXPECT_EQ(p.take_new_events().size(), 2u);
  EXPECT_TRUE(p.take_new_events().empty());
  p.feed("data: 3\n\n");
  auto more = p.take_new_events();
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].data, "3");
}

// The D6 checker must reject what the worker must never send. Streams are built from
// one well-formed event of each type; a test changes only the part it is about.
SseEvent ev(const std::string& type, const std::string& data) {
  SseEvent e;
  e.event = type;
  e.has_event = true;
  e.data = data;
  e.data_lines = 1;
  return e;
}

SseEvent started_event() {
  return ev(
      "started",
      R"({"type":"started","job_id":"j","model":"m","started_at":"2026-01-01T00:00:00.000Z","seed":1,"prompt_tokens":2})");
}
SseEvent end_event() {
  return ev(
      "end",
      R"({"type":"end","tokens_out":1,"decode_time_ms":1.5,"first_token_ms":1,"stop_reason":"max_tokens"})");
}
// `t` is pasted in raw, so a test can send bytes that are not valid UTF-8.
SseEvent token_event(int i, const std::string& t = "a") {
  return ev("token", R"({"type":"token","t":")" + t + R"(","i":)" + std::to_string(i) + "}");
}

testing::AssertionResult rejected(const std::vector<SseEvent>& stream) {
  if (check_job_stream(stream).empty()) return testing::AssertionFailure() << "accepted";
  return testing::AssertionSuccess();
}

// REQ: M0-W-1311 M0-W-1312 WRK-D6
TEST(ConformanceStreamChecker, AcceptsAWellFormedStream) {
  auto v = check_job_stream({started_event(), token_event(0), end_event()});
  EXPECT_TRUE(v.empty()) << v.front();
}

// REQ: M0-W-1311 WRK-D6
TEST(ConformanceStreamChecker, RejectsBadOrderAndMissingTerminal) {
  EXPECT_TRUE(rejected({token_event(0), started_event(), end_event()}));
  EXPECT_TRUE(rejected({started_event(), token_event(0)}));
  EXPECT_TRUE(rejected({started_event(), end_event(), end_event()}));
}

// REQ: M0-W-1312 WRK-D6 WRK-D7
TEST(ConformanceStreamChecker, RejectsBadPayloads) {
  EXPECT_TRUE(rejected({started_event(), token_event(1), end_event()})) << "token index gap";
  EXPECT_TRUE(rejected({started_event(), token_event(0, "\xE4\xB8"), end_event()}))
      << "partial UTF-8 sequence (first two bytes of a 3-byte character)";
  EXPECT_TRUE(rejected(
      {ev("started",
          R"({"type":"started","job_id":"j","model":"m","started_at":"2026-01-01T00:00:00Z","prompt_tokens":2})"),
       end_event()}))
      << "started without seed";
  EXPECT_TRUE(
      rejected({started_event(), ev("error", R"({"type":"error","code":"X","message":"m"})")}))
      << "error without retriable";
}

TEST(ConformanceUtf8, Checker) {
  EXPECT_TRUE(valid_utf8("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xC3"));
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(valid_utf8("\xC0\xAF"));      // overlong
}

}  // namespace
}  // namespace conformance
