// Unit tests of the harness's strict SSE parser and HTTP chunk decoding: the conformance
// verdicts are only as good as this parser.
#include <gtest/gtest.h>

#include "harness/sse_parser.h"
#include "harness/worker_stream.h"

namespace conformance {
namespace {

std::vector<SseEvent> parse_pieces(const std::vector<std::string>& pieces, SseParser& p) {
  for (const auto& s : pieces) p.feed(s);
  p.finish();
  return p.events();
}

TEST(ConformanceSseParser, SingleEventLf) {
  SseParser p;
  auto ev = parse_pieces({"event: token\ndata: {\"type\":\"token\"}\n\n"}, p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].event, "token");
  EXPECT_EQ(ev[0].data, "{\"type\":\"token\"}");
  EXPECT_EQ(ev[0].data_lines, 1);
  EXPECT_TRUE(p.violations().empty());
}

TEST(ConformanceSseParser, CrLfAndBareCrLineEnds) {
  SseParser p;
  auto ev = parse_pieces({"event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\r"}, p);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].event, "a");
  EXPECT_EQ(ev[0].data, "1");
  EXPECT_EQ(ev[1].event, "b");
  EXPECT_EQ(ev[1].data, "2");
  EXPECT_TRUE(p.violations().empty());
}

TEST(ConformanceSseParser, CrLfSplitBetweenReadsIsOneLineEnd) {
  SseParser p;
  // The CR ends one read and its LF starts the next: must not produce an empty line
  // (which would dispatch a half event).
  auto ev = parse_pieces({"event: a\r", "\ndata: x\r", "\n\r", "\n"}, p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].event, "a");
  EXPECT_EQ(ev[0].data, "x");
  EXPECT_TRUE(p.violations().empty()) << p.violations().front();
}

TEST(ConformanceSseParser, EventSplitAtEveryByte) {
  const std::string wire =
      "event: started\ndata: {\"a\":1}\n\n: queued\n\nevent: end\ndata: {\"b\":2}\n\n";
  SseParser p;
  for (char c : wire) p.feed(std::string_view(&c, 1));
  p.finish();
  ASSERT_EQ(p.events().size(), 2u);
  EXPECT_EQ(p.events()[0].data, "{\"a\":1}");
  EXPECT_EQ(p.events()[1].event, "end");
  ASSERT_EQ(p.comments().size(), 1u);
  EXPECT_EQ(p.comments()[0].text, " queued");
  EXPECT_TRUE(p.violations().empty());
}

TEST(ConformanceSseParser, EventIsOnlyCompleteAtTheBlankLine) {
  SseParser p;
  p.feed("event: token\ndata: {}\n");
  EXPECT_TRUE(p.events().empty());
  p.feed("\n");
  EXPECT_EQ(p.events().size(), 1u);
}

TEST(ConformanceSseParser, ArrivalTimeIsThatOfTheCompletingRead) {
  SseParser p;
  const auto t0 = Clock::now();
  const auto t1 = t0 + std::chrono::milliseconds(250);
  p.feed("event: token\ndata: {}\n", t0);
  p.feed("\n", t1);
  ASSERT_EQ(p.events().size(), 1u);
  EXPECT_EQ(p.events()[0].arrival, t1);
}

TEST(ConformanceSseParser, CommentsAreNotEvents) {
  SseParser p;
  auto ev = parse_pieces({": keep-alive\n\n:\n\nevent: x\ndata: 1\n\n"}, p);
  EXPECT_EQ(ev.size(), 1u);
  EXPECT_EQ(p.comments().size(), 2u);
  EXPECT_TRUE(p.violations().empty());
}

TEST(ConformanceSseParser, MultiLineDataJoinedWithNewline) {
  SseParser p;
  auto ev = parse_pieces({"data: line1\ndata:line2\ndata: \n\n"}, p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "line1\nline2\n");
  EXPECT_EQ(ev[0].data_lines, 3);
  EXPECT_EQ(ev[0].event, "message");
  EXPECT_FALSE(ev[0].has_event);
}

TEST(ConformanceSseParser, OnlyOneLeadingSpaceIsStripped) {
  SseParser p;
  auto ev = parse_pieces({"event:  two\ndata:  x\n\n"}, p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].event, " two");
  EXPECT_EQ(ev[0].data, " x");
}

TEST(ConformanceSseParser, IdField) {
  SseParser p;
  auto ev = parse_pieces({"id: 7\nevent: a\ndata: 1\n\n"}, p);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].has_id);
  EXPECT_EQ(ev[0].id, "7");
}

TEST(ConformanceSseParser, StrictViolations) {
  SseParser p;
  parse_pieces({"evnt: typo\ndata: 1\n\nevent: nodata\n\nbare\ndata: 2\n\nevent: cut\ndata: 3"}, p);
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

TEST(ConformanceSseParser, TakeNewEventsHandsOutEachEventOnce) {
  SseParser p;
  p.feed("data: 1\n\ndata: 2\n\n");
  EXPECT_EQ(p.take_new_events().size(), 2u);
  EXPECT_TRUE(p.take_new_events().empty());
  p.feed("data: 3\n\n");
  auto more = p.take_new_events();
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].data, "3");
}

// The D6 checker must reject what the worker must never send.
SseEvent ev(const std::string& type, const std::string& data) {
  SseEvent e;
  e.event = type;
  e.has_event = true;
  e.data = data;
  e.data_lines = 1;
  return e;
}

const char* kStarted =
    R"({"type":"started","job_id":"j","model":"m","started_at":"2026-01-01T00:00:00.000Z","seed":1,"prompt_tokens":2})";
const char* kEnd =
    R"({"type":"end","tokens_out":1,"decode_time_ms":1.5,"first_token_ms":1,"stop_reason":"max_tokens"})";

// REQ: M0-W-1311 M0-W-1312 WRK-D6
TEST(ConformanceStreamChecker, AcceptsAWellFormedStream) {
  auto v = check_job_stream(
      {ev("started", kStarted), ev("token", R"({"type":"token","t":"a","i":0})"), ev("end", kEnd)});
  EXPECT_TRUE(v.empty()) << v.front();
}

// REQ: M0-W-1311 WRK-D6
TEST(ConformanceStreamChecker, RejectsBadOrderAndMissingTerminal) {
  EXPECT_FALSE(check_job_stream({ev("token", R"({"type":"token","t":"a","i":0})"),
                                 ev("started", kStarted), ev("end", kEnd)})
                   .empty());
  EXPECT_FALSE(
      check_job_stream({ev("started", kStarted), ev("token", R"({"type":"token","t":"a","i":0})")})
          .empty());
  EXPECT_FALSE(
      check_job_stream({ev("started", kStarted), ev("end", kEnd), ev("end", kEnd)}).empty());
}

// REQ: M0-W-1312 WRK-D6 WRK-D7
TEST(ConformanceStreamChecker, RejectsBadPayloads) {
  // token index gap
  EXPECT_FALSE(check_job_stream({ev("started", kStarted),
                                 ev("token", R"({"type":"token","t":"a","i":1})"), ev("end", kEnd)})
                   .empty());
  // partial UTF-8 sequence in a token (first two bytes of a 3-byte character)
  EXPECT_FALSE(check_job_stream({ev("started", kStarted),
                                 ev("token", "{\"type\":\"token\",\"t\":\"\xE4\xB8\",\"i\":0}"),
                                 ev("end", kEnd)})
                   .empty());
  // started without seed
  EXPECT_FALSE(
      check_job_stream(
          {ev("started",
              R"({"type":"started","job_id":"j","model":"m","started_at":"2026-01-01T00:00:00Z","prompt_tokens":2})"),
           ev("end", kEnd)})
          .empty());
  // error without retriable
  EXPECT_FALSE(check_job_stream({ev("started", kStarted),
                                 ev("error", R"({"type":"error","code":"X","message":"m"})")})
                   .empty());
}

TEST(ConformanceUtf8, Checker) {
  EXPECT_TRUE(valid_utf8("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xC3"));
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(valid_utf8("\xC0\xAF"));      // overlong
}

}  // namespace
}  // namespace conformance
