#include "server/validation.h"

#include <random>
#include <set>

#include "common/utf8.h"
#include "engine/generation.h"
#include "tokenizer/tokenizer.h"

namespace worker::server {
namespace {

using nlohmann::json;

const std::set<std::string>& known_fields() {
  static const std::set<std::string> k = {"job_id",     "prompt",      "chat",
                                          "max_tokens", "temperature", "top_p",
                                          "top_k",      "min_p",       "repetition_penalty",
                                          "stop",       "seed"};
  return k;
}

struct Checker {
  std::vector<FieldViolation>& v;
  void add(std::string field, std::string constraint, std::string message) {
    v.push_back({std::move(field), std::move(constraint), std::move(message)});
  }
  // A JSON number as double within [lo, hi]; `lo_open` excludes lo.
  std::optional<double> number(const json& j, const std::string& f, double lo, double hi,
                               bool lo_open = false) {
    if (!j.is_number()) {
      add(f, "type", f + " must be a number");
      return std::nullopt;
    }
    const double x = j.get<double>();
    if ((lo_open ? x <= lo : x < lo) || x > hi) {
      add(f, "range",
          f + " must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " + json(hi).dump() +
              "]");
      return std::nullopt;
    }
    return x;
  }
};

bool printable_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

}  // namespace

std::vector<FieldViolation> validate_execute_json(const json& j, ExecuteRequest& out) {
  std::vector<FieldViolation> v;
  Checker c{v};
  if (!j.is_object()) {
    c.add("body", "type", "request body must be a JSON object");
    return v;
  }
  ExecuteRequest r;
  for (const auto& [key, val] : j.items()) {
    (void)val;
    // The name of an unknown field is client-chosen text: print it only when it is short.
    if (!known_fields().count(key))
      c.add(key.size() <= 64 ? key : key.substr(0, 64), "unknown_field",
            "unknown field (allowed: job_id, prompt, chat, max_tokens, temperature, top_p, "
            "top_k, min_p, repetition_penalty, stop, seed)");
  }
  if (j.contains("job_id")) {
    const json& x = j["job_id"];
    if (!x.is_string()) {
      c.add("job_id", "type", "job_id must be a string");
    } else {
      const auto& s = x.get_ref<const std::string&>();
      if (s.empty())
        c.add("job_id", "min_length", "job_id must not be empty");
      else if (s.size() > kMaxJobIdLen)
        c.add("job_id", "max_length", "job_id must be at most 128 characters");
      else if (!printable_ascii(s))
        c.add("job_id", "printable_ascii", "job_id must be printable ASCII");
      else
        r.job_id = s;
    }
  }
  if (!j.contains("prompt")) {
    c.add("prompt", "required", "prompt is required");
  } else if (!j["prompt"].is_string()) {
    c.add("prompt", "type", "prompt must be a string");
  } else {
    const auto& s = j["prompt"].get_ref<const std::string&>();
    const auto n = utf8::count_scalars(s);
    if (!n)
      c.add("prompt", "utf8", "prompt must be valid UTF-8");
    else if (*n < 1)
      c.add("prompt", "min_length", "prompt must hold at least 1 character");
    else if (*n > kMaxPromptScalars)
      c.add("prompt", "max_length", "prompt must hold at most 32768 Unicode scalar values");
    else
      r.prompt = s;
  }
  if (j.contains("chat")) {
    if (!j["chat"].is_boolean())
      c.add("chat", "type", "chat must be a boolean");
    else
      r.chat = j["chat"].get<bool>();
  }
  if (j.contains("max_tokens")) {
    const json& x = j["max_tokens"];
    if (!x.is_number_integer()) {
      c.add("max_tokens", "type", "max_tokens must be an integer");
    } else {
      const bool in_range = x.is_number_unsigned()
                                ? x.get<uint64_t>() >= 1 && x.get<uint64_t>() <= kMaxTokensLimit
                                : x.get<int64_t>() >= 1 && x.get<int64_t>() <= kMaxTokensLimit;
      if (!in_range)
        c.add("max_tokens", "range", "max_tokens must be in [1, 2048]");
      else
        r.max_tokens = static_cast<int32_t>(x.get<int64_t>());
    }
  }
  if (j.contains("temperature"))
    if (auto x = c.number(j["temperature"], "temperature", 0, 2))
      r.sampling.temperature = *x < kMinTemperature ? 0.0f : static_cast<float>(*x);
  if (j.contains("top_p"))
    if (auto x = c.number(j["top_p"], "top_p", 0, 1)) r.sampling.top_p = static_cast<float>(*x);
  if (j.contains("min_p"))
    if (auto x = c.number(j["min_p"], "min_p", 0, 1)) r.sampling.min_p = static_cast<float>(*x);
  if (j.contains("repetition_penalty")) {
    if (auto x = c.number(j["repetition_penalty"], "repetition_penalty", 0, 2, true)) {
      if (*x < kMinRepetitionPenalty)
        c.add("repetition_penalty", "range",
              "repetition_penalty must be >= 1e-05 (a smaller one overflows the logits)");
      else
        r.sampling.repetition_penalty = static_cast<float>(*x);
    }
  }
  if (j.contains("top_k")) {
    const json& x = j["top_k"];
    if (!x.is_number_integer())
      c.add("top_k", "type", "top_k must be an integer");
    else if (!x.is_number_unsigned() && x.get<int64_t>() < 0)
      c.add("top_k", "range", "top_k must be >= 0");
    else  // Values past the vocabulary behave like "off"; clamp so int32 never overflows.
      r.sampling.top_k = static_cast<int32_t>(std::min<uint64_t>(x.get<uint64_t>(), INT32_MAX));
  }
  if (j.contains("seed")) {
    const json& x = j["seed"];
    if (!x.is_number_integer())
      c.add("seed", "type", "seed must be an unsigned 64-bit integer");
    else if (!x.is_number_unsigned() && x.get<int64_t>() < 0)
      c.add("seed", "range", "seed must be in [0, 18446744073709551615]");
    else {
      r.sampling.seed = x.get<uint64_t>();
      r.seed_given = true;
    }
  }
  if (j.contains("stop")) {
    const json& x = j["stop"];
    if (!x.is_array()) {
      c.add("stop", "type", "stop must be an array of strings");
    } else if (x.size() > kMaxStopSequences) {
      c.add("stop", "max_items", "stop must hold at most 4 sequences");
    } else {
      for (size_t i = 0; i < x.size(); ++i) {
        const std::string f = "stop[" + std::to_string(i) + "]";
        if (!x[i].is_string())
          c.add(f, "type", f + " must be a string");
        else if (x[i].get_ref<const std::string&>().empty())
          c.add(f, "non_empty", f + " must not be empty");
        else if (!utf8::is_valid(x[i].get_ref<const std::string&>()))
          c.add(f, "utf8", f + " must be valid UTF-8");
        else
          r.stop.push_back(x[i].get<std::string>());
      }
    }
  }
  if (v.empty()) out = std::move(r);
  return v;
}

std::vector<FieldViolation> parse_execute_body(const std::string& body, ExecuteRequest& out) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    // nlohmann rejects ill-formed UTF-8 (and lone surrogate escapes) while lexing a string.
    // Name the field whose string value holds the bad byte: the last known key before it.
    const std::string what = e.what();
    const bool utf8_problem =
        what.find("UTF-8") != std::string::npos || what.find("surrogate") != std::string::npos;
    if (utf8_problem) {
      const size_t at = std::min(body.size(), static_cast<size_t>(e.byte));
      std::string field = "body";
      size_t best = 0;
      for (const char* k : {"prompt", "job_id", "stop"}) {
        const size_t p = body.rfind("\"" + std::string(k) + "\"", at);
        if (p != std::string::npos && (field == "body" || p > best)) {
          best = p;
          field = k;
        }
      }
      return {{field, "utf8", field + " must be valid UTF-8"}};
    }
    return {
        {"body", "json", "request body is not valid JSON (byte " + std::to_string(e.byte) + ")"}};
  } catch (const json::out_of_range&) {  // a number past double's range (1e400)
    return {{"body", "json", "request body holds a number out of range"}};
  }
  return validate_execute_json(j, out);
}

std::vector<FieldViolation> check_token_limits(ExecuteRequest& req, const Tokenizer& tok,
                                               int32_t n_ctx, std::vector<int32_t>& prompt_tokens) {
  std::vector<FieldViolation> v;
  for (size_t i = 0; i < req.stop.size(); ++i) {
    const size_t n = tok.encode(req.stop[i], false, false).size();
    if (n > kMaxStopTokens)
      v.push_back({"stop[" + std::to_string(i) + "]", "max_tokens",
                   "stop sequence is " + std::to_string(n) + " tokens; at most 32 allowed"});
  }
  try {
    prompt_tokens = tokenize_prompt(tok, req.prompt, req.chat);
  } catch (const std::exception& e) {
    // Only the chat template can refuse a valid UTF-8 prompt (a model without one).
    v.push_back({"chat", "chat_template", e.what()});
    return v;
  }
  const int64_t np = static_cast<int64_t>(prompt_tokens.size());
  const int64_t left = int64_t(n_ctx) - np;
  if (left < 1) {
    v.push_back({"prompt", "context_length",
                 "prompt is " + std::to_string(np) + " tokens; the context holds " +
                     std::to_string(n_ctx) + " and at least 1 must be left to generate"});
  } else if (req.max_tokens && *req.max_tokens > left) {
    v.push_back({"max_tokens", "context_length",
                 "prompt tokens (" + std::to_string(np) + ") + max_tokens (" +
                     std::to_string(*req.max_tokens) + ") exceed the context size (" +
                     std::to_string(n_ctx) + ")"});
  } else if (!req.max_tokens) {
    req.max_tokens = static_cast<int32_t>(std::min<int64_t>(kMaxTokensLimit, left));
  }
  return v;
}

nlohmann::json invalid_request_body(const std::vector<FieldViolation>& v) {
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
