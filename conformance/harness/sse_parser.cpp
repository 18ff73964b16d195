#include "harness/sse_parser.h"

#include <algorithm>

namespace conformance {

void SseParser::feed(std::string_view bytes, Clock::time_point now) {
  if (finished_) {
    violations_.push_back("bytes received after the end of the stream");
    return;
  }
  if (bom_checked_) return consume(bytes, now);
  // The specification allows one leading BOM; the worker never sends one. It may arrive split
  // across reads: hold the first bytes until they can or cannot be a BOM.
  static constexpr std::string_view kBom = "\xEF\xBB\xBF";
  head_.append(bytes);
  const size_t n = std::min(head_.size(), kBom.size());
  if (n < kBom.size() && std::string_view(head_) == kBom.substr(0, n)) return;
  bom_checked_ = true;
  const std::string held = std::move(head_);
  head_.clear();
  std::string_view rest = held;
  if (rest.substr(0, kBom.size()) == kBom) {
    violations_.push_back("stream starts with a UTF-8 BOM");
    rest.remove_prefix(kBom.size());
  }
  consume(rest, now);
}

void SseParser::consume(std::string_view bytes, Clock::time_point now) {
  for (const char c : bytes) {
    if (pending_cr_) {
      pending_cr_ = false;
      if (c == '\n') continue;  // CRLF split across (or within) reads: one line end
    }
    if (c == '\r') {
      process_line(line_, now);
      line_.clear();
      pending_cr_ = true;
    } else if (c == '\n') {
      process_line(line_, now);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::finish() {
  if (finished_) return;
  if (!bom_checked_) {  // fewer bytes than a BOM arrived, all of them a BOM's start
    bom_checked_ = true;
    consume(head_, Clock::now());
    head_.clear();
  }
  finished_ = true;
  if (!line_.empty()) violations_.push_back("stream ended inside a line: '" + line_ + "'");
  if (current_started_) violations_.push_back("stream ended inside an event (no blank line)");
}

std::vector<SseEvent> SseParser::take_new_events() {
  std::vector<SseEvent> out(events_.begin() + static_cast<std::ptrdiff_t>(handed_out_),
                            events_.end());
  handed_out_ = events_.size();
  return out;
}

void SseParser::process_line(std::string_view line, Clock::time_point now) {
  if (line.empty()) {
    dispatch(now);
    return;
  }
  if (line.front() == ':') {
    comments_.push_back({std::string(line.substr(1)), now});
    return;
  }
  std::string_view field, value;
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) {
    field = line;  // the whole line names the field, with an empty value
    if (field != "data" && field != "event" && field != "id") {
      violations_.push_back("line without ':' ('" + std::string(line) + "')");
      return;
    }
  } else {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  current_started_ = true;
  if (field == "event") {
    if (current_.has_event) violations_.push_back("two 'event:' lines in one event");
    current_.event = std::string(value);
    current_.has_event = true;
  } else if (field == "data") {
    if (current_has_data_) current_.data.push_back('\n');
    current_.data.append(value);
    current_has_data_ = true;
    ++current_.data_lines;
  } else if (field == "id") {
    if (value.find('\0') != std::string_view::npos) {
      violations_.push_back("id field contains NUL");
    } else {
      current_.id = std::string(value);
      current_.has_id = true;
    }
  } else if (field == "retry") {
    // Allowed by the format; must be ASCII digits.
    if (value.empty() || value.find_first_not_of("0123456789") != std::string_view::npos)
      violations_.push_back("retry field is not an integer: '" + std::string(value) + "'");
  } else {
    violations_.push_back("unknown field '" + std::string(field) + "'");
  }
}

void SseParser::dispatch(Clock::time_point now) {
  if (!current_started_) return;  // consecutive blank lines: nothing to dispatch
  if (!current_has_data_) {
    // A browser would silently drop it; for the worker it means a lost payload.
    violations_.push_back("event '" + current_.event + "' without a data line");
  } else {
    if (!current_.has_event) current_.event = "message";
    current_.arrival = now;
    events_.push_back(current_);
  }
  current_ = SseEvent{};
  current_has_data_ = false;
  current_started_ = false;
}

}  // namespace conformance
