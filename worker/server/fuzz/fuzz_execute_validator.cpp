// libFuzzer target: arbitrary bytes as a POST /execute body. The request table must never
// throw and never crash; an accepted request must hold only values the engine can run safely
// (valid UTF-8, ranges of D8, a temperature that is 0 or >= the WRK-D27 minimum), and a
// rejected one must render as a JSON 400 body.
#include <cmath>
#include <cstdint>
#include <string>

#include "common/utf8.h"
#include "server/request.h"
#include "server/sse.h"

namespace {
void require(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace worker::server;
  const std::string body(reinterpret_cast<const char*>(data), size);
  ParsedRequest r;
  const auto v = parse_request(body, kExecute, r);
  if (!v.empty()) {
    require(!dump_json(invalid_request_body(v)).empty());
    return 0;
  }
  const auto& s = r.gen.sampling;
  require(worker::utf8::is_valid(r.gen.prompt) && !r.gen.prompt.empty());
  require(!r.max_tokens_given || (r.gen.max_tokens >= 1 && r.gen.max_tokens <= kMaxTokensLimit));
  require(s.temperature == 0.0f ||
          (s.temperature >= static_cast<float>(kMinTemperature) && s.temperature <= 2.0f));
  require(std::isfinite(s.top_p) && s.top_p >= 0.0f && s.top_p <= 1.0f);
  require(std::isfinite(s.min_p) && s.min_p >= 0.0f && s.min_p <= 1.0f);
  require(s.repetition_penalty >= static_cast<float>(kMinRepetitionPenalty) &&
          s.repetition_penalty <= 2.0f);
  require(s.top_k >= 0);
  require(r.gen.stop.size() <= kMaxStopSequences);
  for (const auto& st : r.gen.stop) require(!st.empty() && worker::utf8::is_valid(st));
  require(r.job_id.size() <= kMaxJobIdLen);
  return 0;
}
