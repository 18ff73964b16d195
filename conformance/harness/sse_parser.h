#pragma once
// A strict Server-Sent Events parser (WHATWG "event stream interpretation"), fed with the
// body bytes exactly as they arrive from the socket. Strict means: anything the worker's
// framing (D6) never legitimately produces is recorded as a violation instead of being
// silently ignored, so a test can assert that a stream had none.
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace conformance {

using Clock = std::chrono::steady_clock;

struct SseEvent {
  std::string event;       // value of the `event:` line ("message" when absent)
  std::string data;        // `data:` lines joined with '\n'
  std::string id;          // last `id:` value, when has_id
  bool has_event = false;  // an explicit `event:` line was present
  bool has_id = false;
  int data_lines = 0;         // how many `data:` lines made up `data`
  Clock::time_point arrival;  // when the blank line completing the event was received
};

struct SseComment {
  std::string text;  // without the leading ':'
  Clock::time_point arrival;
};

class SseParser {
 public:
  // Feeds bytes received at `now`. Complete events become available through events().
  void feed(std::string_view bytes, Clock::time_point now = Clock::now());
  // Marks the end of the stream: a partially received event is a violation.
  void finish();

  const std::vector<SseEvent>& events() const { return events_; }
  const std::vector<SseComment>& comments() const { return comments_; }
  // Framing violations (unknown fields, lines without ':', truncated event, ...).
  const std::vector<std::string>& violations() const { return violations_; }
  // Events not yet handed out through take_new_events().
  std::vector<SseEvent> take_new_events();

 private:
  void consume(std::string_view bytes, Clock::time_point now);
  void process_line(std::string_view line, Clock::time_point now);
  void dispatch(Clock::time_point now);

  std::string line_;         // bytes of the line being received
  bool pending_cr_ = false;  // last byte seen was CR: a following LF belongs to it
  bool bom_checked_ = false;
  std::string head_;  // first bytes, held while they may still be a split BOM
  SseEvent current_;
  bool current_has_data_ = false;
  bool current_started_ = false;  // any field line seen since the last dispatch
  std::vector<SseEvent> events_;
  size_t handed_out_ = 0;
  std::vector<SseComment> comments_;
  std::vector<std::string> violations_;
  bool finished_ = false;
};

}  // namespace conformance
