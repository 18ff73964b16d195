#pragma once
// The request table (D5, D8, M0-W-1302): every field /execute and the OpenAI routes accept,
// one row each, parsed straight into the GenerationRequest the engine runs. Validation runs
// before anything is queued, lists every violation and never echoes the prompt; the prompt
// is tokenized once (prepare_prompt) and its ids travel with the job to generate().
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generation.h"

namespace worker {
class Tokenizer;
}

namespace worker::server {

struct FieldViolation {
  std::string field;
  std::string constraint;  // required | type | range | min_length | max_length | utf8 |
                           // unknown_field | max_items | non_empty | max_tokens | enum |
                           // printable_ascii | context_length | chat_template | json | ...
  std::string message;
};
using Violations = std::vector<FieldViolation>;

// The routes a row applies to (bit set).
enum Route : unsigned { kExecute = 1, kCompletion = 2, kChat = 4 };
inline constexpr unsigned kOpenAi = kCompletion | kChat;
inline constexpr unsigned kAllRoutes = kExecute | kOpenAi;

// A parsed request: the generation request plus what only the server reads.
struct ParsedRequest {
  Route route = kExecute;
  std::string job_id;     // empty: the worker generates one
  GenerationRequest gen;  // prompt ids filled by prepare_prompt()
  bool max_tokens_given = false;
  bool seed_given = false;
  bool prompt_is_template = false;  // ChatML built from several messages (specials parsed)
  // OpenAI routes only.
  std::string model;  // echoed back (empty: the worker's model name)
  bool stream = false;
  bool include_usage = false;
};

inline constexpr size_t kMaxPromptScalars = 32768;
inline constexpr int32_t kMaxTokensLimit = 2048;
inline constexpr int32_t kCompletionDefaultMaxTokens = 16;  // OpenAI's legacy default
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

// The JSON shape a row accepts; Any leaves every check to the row's land function.
enum class JsonType { Any, Bool, String, Integer, Uint64, Number };

struct Field {
  std::string_view name;   // the field name on every route the row applies to
  std::string_view alias;  // a second name on the OpenAI routes (same row, same rules)
  unsigned routes;
  JsonType type;
  double lo, hi;  // Integer / Number range (inclusive; lo excluded when lo_open)
  bool lo_open;
  std::string_view default_value;  // documentation (struct defaults hold it); or "required"
  std::string_view lands;          // where the value lands
  // Stores a value that passed the type and range checks (and checks what those cannot).
  void (*land)(const nlohmann::json& v, const std::string& name, ParsedRequest& r, Violations& out);
};

// Every row, in the order violations are reported.
std::span<const Field> request_fields();

// Parses a body for `route`: JSON syntax (invalid UTF-8 inside a string is reported against
// the field that holds it), then every row. /execute reports unknown fields; the OpenAI
// routes ignore them (clients send many) and read null as "not given".
Violations parse_request(const std::string& body, Route route, ParsedRequest& out);

// Tokenizes the prompt, once, into out.gen.prompt_tokens, and checks what needs the
// tokenizer: every stop sequence <= 32 tokens, prompt tokens + max_tokens <= n_ctx
// (constraint context_length); sets the default max_tokens.
Violations prepare_prompt(ParsedRequest& r, const Tokenizer& tok, int32_t n_ctx);

// {"error":{"code":"INVALID_REQUEST","message":...,"details":[...]}}
nlohmann::json invalid_request_body(const Violations& v);

// Draws a seed for requests without one (M0-W-1030: the effective seed is reported).
uint64_t random_seed();

}  // namespace worker::server
