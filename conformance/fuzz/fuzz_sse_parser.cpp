// libFuzzer target: arbitrary bytes as an SSE response body for the harness's strict parser.
// It must never crash, and what it reports must not depend on how the bytes were split into
// reads (the first byte picks the split): events, comments and violations equal those of
// one feed of the whole body.
#include <cstdint>
#include <string_view>

#include "harness/sse_parser.h"

namespace {
void require(bool ok) {
  if (!ok) __builtin_trap();
}
bool same_events(const conformance::SseParser& a, const conformance::SseParser& b) {
  if (a.events().size() != b.events().size()) return false;
  for (size_t i = 0; i < a.events().size(); ++i) {
    const auto &x = a.events()[i], &y = b.events()[i];
    if (x.event != y.event || x.data != y.data || x.id != y.id || x.has_event != y.has_event ||
        x.has_id != y.has_id || x.data_lines != y.data_lines)
      return false;
  }
  if (a.comments().size() != b.comments().size()) return false;
  for (size_t i = 0; i < a.comments().size(); ++i)
    if (a.comments()[i].text != b.comments()[i].text) return false;
  return a.violations() == b.violations();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = data[0] % 16 + 1;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  conformance::SseParser whole, split;
  whole.feed(body);
  for (size_t at = 0; at < body.size(); at += step) split.feed(body.substr(at, step));
  const size_t before = whole.events().size();
  require(whole.take_new_events().size() == before);
  require(whole.take_new_events().empty());
  whole.finish();
  split.finish();
  require(same_events(whole, split));
  return 0;
}
