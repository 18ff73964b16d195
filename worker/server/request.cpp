#include "server/request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "common/utf8.h"
#include "server/openai.h"
#include "tokenizer/tokenizer.h"

namespace worker::server {
namespace {

using nlohmann::json;
constexpr double kNoLimit = std::numeric_limits<double>::infinity();

void add(Violations& out, std::string field, std::string constraint, std::string message) {
  out.push_back({std::move(field), std::move(constraint), std::move(message)});
}

bool printable_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

// The prompt as the engine will see it (before tokenization): valid UTF-8, 1..32768 scalars.
void set_prompt(const std::string& s, const std::string& name, ParsedRequest& r, Violations& out) {
  const auto n = utf8::count_scalars(s);
  if (!n)
    add(out, name, "utf8", name + " must be valid UTF-8");
  else if (*n < 1)
    add(out, name, "min_length", name + " must hold at least 1 character");
  else if (*n > kMaxPromptScalars)
    add(out, name, "max_length", name + " must hold at most 32768 Unicode scalar values");
  else
    r.gen.prompt = s;
}

// Message content is a string or an array of {type:"text", text} parts.
bool content_text(const json& c, std::string& out) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) return false;
  out.clear();
  for (const auto& part : c) {
    // `== "text"` rather than value(): a non-string "type" is a bad part, not an exception.
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string())
      return false;
    out += part["text"].get<std::string>();
  }
  return true;
}

float as_float(const json& v) {
  return static_cast<float>(v.get<double>());
}

// Row land functions: the value has passed its row's type and range checks.
void land_job_id(const json& v, const std::string& f, ParsedRequest& r, Violations& out) {
  const auto& s = v.get_ref<const std::string&>();
  if (s.empty())
    add(out, f, "min_length", f + " must not be empty");
  else if (s.size() > kMaxJobIdLen)
    add(out, f, "max_length", f + " must be at most 128 characters");
  else if (!printable_ascii(s))
    add(out, f, "printable_ascii", f + " must be printable ASCII");
  else
    r.job_id = s;
}

void land_prompt(const json& v, const std::string& f, ParsedRequest& r, Violations& out) {
  if (v.is_string()) return set_prompt(v.get<std::string>(), f, r, out);
  // OpenAI completions also take a batch of one.
  if (r.route == kCompletion && v.is_array() && v.size() == 1 && v[0].is_string())
    return set_prompt(v[0].get<std::string>(), f, r, out);
  add(out, f, "type",
      r.route == kCompletion ? f + " must be a string (batches are not supported)"
                             : f + " must be a string");
}

void land_messages(const json& v, const std::string& f, ParsedRequest& r, Violations& out) {
  if (!v.is_array() || v.empty()) return add(out, f, "required", f + " must be a non-empty array");
  const size_t before = out.size();
  std::vector<std::pair<std::string, std::string>> msgs;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string mf = f + "[" + std::to_string(i) + "]";
    std::string text;
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      add(out, mf + ".role", "type", "role must be a string");
      continue;
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      add(out, mf + ".role", "enum", "role must be system, developer, user or assistant");
      continue;
    }
    if (!m.contains("content") || !content_text(m["content"], text)) {
      add(out, mf + ".content", "type", "content must be a string or text parts");
      continue;
    }
    msgs.emplace_back(role == "developer" ? "system" : role, text);
  }
  if (out.size() != before) return;
  if (msgs.size() == 1 && msgs[0].first == "user") {
    // One user turn: the model's own template (D8 `chat: true`).
    r.gen.chat = true;
    set_prompt(msgs[0].second, f, r, out);
  } else {
    r.prompt_is_template = true;
    set_prompt(chatml(msgs), f, r, out);
  }
}

void land_chat(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.gen.chat = v.get<bool>();
}

void land_max_tokens(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.gen.max_tokens = static_cast<int32_t>(v.get<int64_t>());
  r.max_tokens_given = true;
}

void land_temperature(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.gen.sampling.temperature = v.get<double>() < kMinTemperature ? 0.0f : as_float(v);
}

void land_top_p(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.gen.sampling.top_p = as_float(v);
}

void land_top_k(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  // Values past the vocabulary behave like "off"; clamp so int32 never overflows.
  r.gen.sampling.top_k = static_cast<int32_t>(std::min<uint64_t>(v.get<uint64_t>(), INT32_MAX));
}

void land_min_p(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.gen.sampling.min_p = as_float(v);
}

void land_repetition_penalty(const json& v, const std::string& f, ParsedRequest& r,
                             Violations& out) {
  if (v.get<double>() < kMinRepetitionPenalty)
    return add(out, f, "range", f + " must be >= 1e-05 (a smaller one overflows the logits)");
  r.gen.sampling.repetition_penalty = as_float(v);
}

void land_stop(const json& v, const std::string& f, ParsedRequest& r, Violations& out) {
  // OpenAI clients may send one stop string.
  const json x = r.route != kExecute && v.is_string() ? json::array({v}) : v;
  if (!x.is_array()) return add(out, f, "type", f + " must be an array of strings");
  if (x.size() > kMaxStopSequences)
    return add(out, f, "max_items", f + " must hold at most 4 sequences");
  for (size_t i = 0; i < x.size(); ++i) {
    const std::string e = f + "[" + std::to_string(i) + "]";
    if (!x[i].is_string())
      add(out, e, "type", e + " must be a string");
    else if (x[i].get_ref<const std::string&>().empty())
      add(out, e, "non_empty", e + " must not be empty");
    else if (!utf8::is_valid(x[i].get_ref<const std::string&>()))
      add(out, e, "utf8", e + " must be valid UTF-8");
    else
      r.gen.stop.push_back(x[i].get<std::string>());
  }
}

void land_seed(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.gen.sampling.seed = v.get<uint64_t>();
  r.seed_given = true;
}

void land_model(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.model = v.get<std::string>();
}

void land_stream(const json& v, const std::string&, ParsedRequest& r, Violations&) {
  r.stream = v.get<bool>();
}

void land_stream_options(const json& v, const std::string& f, ParsedRequest& r, Violations& out) {
  if (!v.is_object() || !v.contains("include_usage")) return;
  const json& u = v["include_usage"];
  if (u.is_boolean())
    r.include_usage = u.get<bool>();
  else if (!u.is_null())
    add(out, f + ".include_usage", "type", "include_usage must be a boolean");
}

void land_n(const json& v, const std::string& f, ParsedRequest&, Violations& out) {
  if (v != 1) add(out, f, "range", "only n = 1 is supported");
}

void land_echo(const json& v, const std::string& f, ParsedRequest&, Violations& out) {
  if (v == true) add(out, f, "unsupported", "echo is not supported");
}

constexpr unsigned kPrompted = kExecute | kCompletion;

// name, alias, routes, type, lo, hi, lo_open, default, lands, land
constexpr Field kFields[] = {
    {"job_id", "", kExecute, JsonType::String, 0, 0, false, "generated", "Job::id", land_job_id},
    {"prompt", "", kPrompted, JsonType::Any, 0, 0, false, "required", "gen.prompt", land_prompt},
    {"chat", "", kExecute, JsonType::Bool, 0, 0, false, "false", "gen.chat", land_chat},
    {"max_tokens", "max_completion_tokens", kAllRoutes, JsonType::Integer, 1, kMaxTokensLimit,
     false, "2048 capped by the context left (completions: 16)", "gen.max_tokens", land_max_tokens},
    {"temperature", "", kAllRoutes, JsonType::Number, 0, 2, false, "1", "gen.sampling.temperature",
     land_temperature},
    {"top_p", "", kAllRoutes, JsonType::Number, 0, 1, false, "1", "gen.sampling.top_p", land_top_p},
    {"top_k", "", kAllRoutes, JsonType::Integer, 0, kNoLimit, false, "0 (off)",
     "gen.sampling.top_k", land_top_k},
    {"min_p", "", kAllRoutes, JsonType::Number, 0, 1, false, "0", "gen.sampling.min_p", land_min_p},
    {"repetition_penalty", "", kAllRoutes, JsonType::Number, 0, 2, true, "1 (off)",
     "gen.sampling.repetition_penalty", land_repetition_penalty},
    {"stop", "", kAllRoutes, JsonType::Any, 0, 0, false, "none", "gen.stop", land_stop},
    {"seed", "", kAllRoutes, JsonType::Uint64, 0, 0, false, "random (reported in `started`)",
     "gen.sampling.seed", land_seed},
    {"messages", "", kChat, JsonType::Any, 0, 0, false, "required",
     "gen.prompt + gen.chat (one user turn) or ChatML", land_messages},
    {"model", "", kOpenAi, JsonType::String, 0, 0, false, "the worker's model", "model",
     land_model},
    {"stream", "", kOpenAi, JsonType::Bool, 0, 0, false, "false", "stream", land_stream},
    {"stream_options", "", kOpenAi, JsonType::Any, 0, 0, false, "none", "include_usage",
     land_stream_options},
    {"n", "", kOpenAi, JsonType::Any, 0, 0, false, "1", "(checked only)", land_n},
    {"echo", "", kCompletion, JsonType::Any, 0, 0, false, "false", "(checked only)", land_echo},
};

const char* type_words(JsonType t) {
  switch (t) {
    case JsonType::Bool: return " must be a boolean";
    case JsonType::String: return " must be a string";
    case JsonType::Integer: return " must be an integer";
    case JsonType::Uint64: return " must be an unsigned 64-bit integer";
    case JsonType::Number: return " must be a number";
    case JsonType::Any: break;
  }
  return "";
}

bool type_ok(JsonType t, const json& v) {
  switch (t) {
    case JsonType::Bool: return v.is_boolean();
    case JsonType::String: return v.is_string();
    case JsonType::Integer:
    case JsonType::Uint64: return v.is_number_integer();
    case JsonType::Number: return v.is_number();
    case JsonType::Any: break;
  }
  return true;
}

// The range check of a value whose type passed; the message when it fails.
std::optional<std::string> out_of_range(const Field& f, const json& v) {
  const std::string n(f.name);
  switch (f.type) {
    case JsonType::Uint64:
      if (v.is_number_unsigned() || v.get<int64_t>() >= 0) return std::nullopt;
      return " must be in [0, 18446744073709551615]";
    case JsonType::Integer: {
      const double x = v.is_number_unsigned() ? static_cast<double>(v.get<uint64_t>())
                                              : static_cast<double>(v.get<int64_t>());
      const bool ok = x >= f.lo && x <= f.hi;
      if (ok) return std::nullopt;
      if (std::isinf(f.hi)) return " must be >= " + std::to_string(static_cast<int64_t>(f.lo));
      return " must be in [" + std::to_string(static_cast<int64_t>(f.lo)) + ", " +
             std::to_string(static_cast<int64_t>(f.hi)) + "]";
    }
    case JsonType::Number: {
      const double x = v.get<double>();
      if (!(f.lo_open ? x <= f.lo : x < f.lo) && x <= f.hi) return std::nullopt;
      return std::string(" must be in ") + (f.lo_open ? "(" : "[") + json(f.lo).dump() + ", " +
             json(f.hi).dump() + "]";
    }
    default: return std::nullopt;
  }
}

// One row, one value, under the name the client used.
void apply(const Field& f, const std::string& name, const json& v, ParsedRequest& r,
           Violations& out) {
  if (!type_ok(f.type, v)) return add(out, name, "type", name + type_words(f.type));
  if (auto why = out_of_range(f, v)) return add(out, name, "range", name + *why);
  f.land(v, name, r, out);
}

std::string execute_field_list() {
  std::string s;
  for (const Field& f : kFields)
    if (f.routes & kExecute) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// nlohmann rejects ill-formed UTF-8 (and lone surrogate escapes) while lexing a string.
// Name the field whose string value holds the bad byte: the last field name before it.
std::string utf8_field(const std::string& body, size_t at, Route route) {
  std::string field = "body";
  size_t best = 0;
  for (const Field& f : kFields) {
    if (!(f.routes & route) || (f.type != JsonType::String && f.type != JsonType::Any)) continue;
    const size_t p = body.rfind("\"" + std::string(f.name) + "\"", at);
    if (p != std::string::npos && (field == "body" || p > best)) {
      best = p;
      field = f.name;
    }
  }
  return field;
}

}  // namespace

std::span<const Field> request_fields() {
  return kFields;
}

Violations parse_request(const std::string& body, Route route, ParsedRequest& out) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("surrogate") != std::string::npos) {
      const std::string f = utf8_field(body, std::min(body.size(), size_t(e.byte)), route);
      return {{f, "utf8", f + " must be valid UTF-8"}};
    }
    return {
        {"body", "json", "request body is not valid JSON (byte " + std::to_string(e.byte) + ")"}};
  } catch (const json::out_of_range&) {  // a number past double's range (1e400)
    return {{"body", "json", "request body holds a number out of range"}};
  }
  if (!j.is_object()) return {{"body", "type", "request body must be a JSON object"}};

  Violations v;
  ParsedRequest r;
  r.route = route;
  const bool openai = route != kExecute;
  if (!openai) {
    static const std::string allowed = "unknown field (allowed: " + execute_field_list() + ")";
    for (const auto& [key, val] : j.items()) {
      (void)val;
      bool known = false;
      for (const Field& f : kFields) known |= (f.routes & kExecute) && f.name == key;
      // The name of an unknown field is client-chosen text: print it only when it is short.
      if (!known) add(v, key.size() <= 64 ? key : key.substr(0, 64), "unknown_field", allowed);
    }
  }
  for (const Field& f : kFields) {
    if (!(f.routes & route)) continue;
    bool given = false;
    // The alias is read after the name: it wins when a client sends both.
    for (std::string_view name : {f.name, openai ? f.alias : std::string_view()}) {
      const std::string key(name);
      if (key.empty() || !j.contains(key)) continue;
      const json& x = j[key];
      if (openai && x.is_null()) continue;  // OpenAI clients send null for "not given"
      given = true;
      apply(f, key, x, r, v);
    }
    if (!given && f.default_value == "required")
      add(v, std::string(f.name), "required", std::string(f.name) + " is required");
  }
  if (route == kCompletion && !r.max_tokens_given) {
    r.gen.max_tokens = kCompletionDefaultMaxTokens;
    r.max_tokens_given = true;
  }
  if (v.empty()) out = std::move(r);
  return v;
}

Violations prepare_prompt(ParsedRequest& r, const Tokenizer& tok, int32_t n_ctx) {
  Violations v;
  for (size_t i = 0; i < r.gen.stop.size(); ++i) {
    const size_t n = tok.encode(r.gen.stop[i], false, false).size();
    if (n > kMaxStopTokens)
      add(v, "stop[" + std::to_string(i) + "]", "max_tokens",
          "stop sequence is " + std::to_string(n) + " tokens; at most 32 allowed");
  }
  auto& ids = r.gen.prompt_tokens;
  try {
    if (r.prompt_is_template) {
      // ChatML built from several messages: its markers are special tokens, and the model
      // must have a ChatML template (apply_chat_template says why not).
      (void)apply_chat_template(tok, "");
      ids = tok.encode(r.gen.prompt, true, true);
    } else {
      ids = tokenize_prompt(tok, r.gen.prompt, r.gen.chat);
    }
  } catch (const std::exception& e) {
    // Only the chat template can refuse a valid UTF-8 prompt (a model without one).
    add(v, r.route == kChat ? "messages" : "chat", "chat_template", e.what());
    return v;
  }
  const int64_t np = static_cast<int64_t>(ids.size());
  const int64_t left = int64_t(n_ctx) - np;
  if (left < 1) {
    add(v, "prompt", "context_length",
        "prompt is " + std::to_string(np) + " tokens; the context holds " + std::to_string(n_ctx) +
            " and at least 1 must be left to generate");
  } else if (r.max_tokens_given && r.gen.max_tokens > left) {
    add(v, "max_tokens", "context_length",
        "prompt tokens (" + std::to_string(np) + ") + max_tokens (" +
            std::to_string(r.gen.max_tokens) + ") exceed the context size (" +
            std::to_string(n_ctx) + ")");
  } else if (!r.max_tokens_given) {
    r.gen.max_tokens = static_cast<int32_t>(std::min<int64_t>(kMaxTokensLimit, left));
  }
  return v;
}

json invalid_request_body(const Violations& v) {
  json details = json::array();
  std::string msg = "invalid request:";
  for (const auto& f : v) {
    details.push_back({{"field", f.field}, {"constraint", f.constraint}, {"message", f.message}});
    msg += " " + f.field + " (" + f.constraint + ");";
  }
  if (!msg.empty() && msg.back() == ';') msg.pop_back();
  return {{"error", {{"code", "INVALID_REQUEST"}, {"message", msg}, {"details", details}}}};
}

uint64_t random_seed() {
  static thread_local std::mt19937_64 gen{std::random_device{}()};
  return gen();
}

}  // namespace worker::server
