// libFuzzer target: arbitrary bytes as a /v1/chat/completions or /v1/completions body (the
// first byte picks the route: odd, e.g. "C", chat; even, e.g. "P", completions). The request
// table must never throw or crash; an accepted request obeys the same invariants as
// fuzz_execute_validator's, and a rejected one renders as an OpenAI error body.
#include <cstdint>
#include <string>

#include "common/utf8.h"
#include "server/openai.h"
#include "server/request.h"
#include "server/sse.h"

namespace {
void require(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace worker::server;
  if (size == 0) return 0;
  const Route route = data[0] & 1 ? kChat : kCompletion;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  ParsedRequest r;
  const auto v = parse_request(body, route, r);
  if (!v.empty()) {
    require(!dump_json(openai_invalid(v)).empty());
    return 0;
  }
  require(r.route == route);
  require(worker::utf8::is_valid(r.gen.prompt) && !r.gen.prompt.empty());
  // Completions default to 16 tokens; chat leaves the default to the context check.
  require(r.max_tokens_given ? r.gen.max_tokens >= 1 && r.gen.max_tokens <= kMaxTokensLimit
                             : route == kChat);
  const float t = r.gen.sampling.temperature;
  require(t == 0.0f || (t >= static_cast<float>(kMinTemperature) && t <= 2.0f));
  require(r.gen.stop.size() <= kMaxStopSequences);
  return 0;
}
