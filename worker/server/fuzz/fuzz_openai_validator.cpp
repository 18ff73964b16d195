// libFuzzer target: arbitrary bytes as a /v1/chat/completions or /v1/completions body (the
// first byte picks the route: odd, e.g. "C", chat; even, e.g. "P", completions). Mapping + the
// shared /execute rules must never throw or crash; an accepted request obeys the same invariants as
// fuzz_execute_validator's, and a rejected one renders as an OpenAI error body.
#include <cstdint>
#include <string>

#include "common/utf8.h"
#include "server/openai.h"
#include "server/sse.h"
#include "server/validation.h"

namespace {
void require(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace worker::server;
  if (size == 0) return 0;
  const OpenAiKind kind = data[0] & 1 ? OpenAiKind::Chat : OpenAiKind::Completion;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  OpenAiRequest o;
  auto v = parse_openai_body(body, kind, o);
  ExecuteRequest r;
  if (v.empty()) v = validate_execute_json(o.execute, r);
  if (!v.empty()) {
    require(!dump_json(openai_invalid(v)).empty());
    return 0;
  }
  require(o.kind == kind);
  require(worker::utf8::is_valid(r.prompt) && !r.prompt.empty());
  // Completions default to 16 tokens; chat leaves the default to the context check.
  require(r.max_tokens ? *r.max_tokens >= 1 && *r.max_tokens <= kMaxTokensLimit
                       : kind == OpenAiKind::Chat);
  const float t = r.sampling.temperature;
  require(t == 0.0f || (t >= static_cast<float>(kMinTemperature) && t <= 2.0f));
  require(r.stop.size() <= kMaxStopSequences);
  return 0;
}
