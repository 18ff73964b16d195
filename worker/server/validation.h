#pragma once
// Request validation for POST /execute (D8, M0-W-1302): runs before anything is queued,
// lists every violation, never echoes the prompt.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace worker {
class Tokenizer;
}

namespace worker::server {

struct FieldViolation {
  std::string field;
  std::string constraint;  // required | type | range | min_length | max_length | utf8 |
                           // unknown_field | max_items | non_empty | max_tokens |
                           // printable_ascii | context_length | json
  std::string message;
};

// The fields of an /execute request after structural validation.
struct ExecuteRequest {
  std::string job_id;  // empty: the worker generates one
  std::string prompt;
  bool chat = false;
  std::optional<int32_t> max_tokens;  // nullopt: default (2048 capped by the context left)
  SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
};

inline constexpr size_t kMaxPromptScalars = 32768;
inline constexpr int32_t kMaxTokensLimit = 2048;
inline constexpr size_t kMaxStopSequences = 4;
inline constexpr size_t kMaxStopTokens = 32;
inline constexpr size_t kMaxJobIdLen = 128;
// WRK-D27: a temperature in (0, kMinTemperature) is sampled as 0 (greedy). Below it the
// sampler's logit / temperature overflows float for realistic logits (at 1e-40 every
// logit becomes +-inf and the probabilities NaN); 1e-5 keeps a margin of ~1e29 for
// logits up to 1e4, and a distribution that sharp is greedy for any logit gap >= 1e-3.
inline constexpr double kMinTemperature = 1e-5;
// WRK-D27: the repetition penalty divides positive logits; below this it overflows them the
// same way, and no value stands in for it, so it is a range violation.
inline constexpr double kMinRepetitionPenalty = 1e-5;

// Parses the raw body: JSON syntax (invalid UTF-8 inside a string is reported against the
// field that holds it), types, ranges, unknown fields. Fills `out` when no violation.
std::vector<FieldViolation> parse_execute_body(const std::string& body, ExecuteRequest& out);
// Structural validation of an already parsed object.
std::vector<FieldViolation> validate_execute_json(const nlohmann::json& j, ExecuteRequest& out);

// Checks that need the tokenizer and the context size: every stop sequence <= 32 tokens,
// prompt tokens + max_tokens <= n_ctx (constraint context_length); sets the default
// max_tokens. `prompt_tokens` receives the prompt as the engine will see it.
std::vector<FieldViolation> check_token_limits(ExecuteRequest& req, const Tokenizer& tok,
                                               int32_t n_ctx, std::vector<int32_t>& prompt_tokens);

// {"error":{"code":"INVALID_REQUEST","message":...,"details":[...]}}
nlohmann::json invalid_request_body(const std::vector<FieldViolation>& v);

// Draws a seed for requests without one (M0-W-1030: the effective seed is reported).
uint64_t random_seed();

}  // namespace worker::server
