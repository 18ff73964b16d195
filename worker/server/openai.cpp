#include "server/openai.h"

namespace worker::server {
namespace {
using nlohmann::json;

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
}  // namespace

std::string chatml(const std::vector<std::pair<std::string, std::string>>& messages) {
  std::string s;
  for (const auto& [role, content] : messages)
    s += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
  s += "<|im_start|>assistant\n";
  return s;
}

json openai_error(const std::string& message, const std::string& type, const std::string& code,
                  const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code}}}};
}

json openai_invalid(const std::vector<FieldViolation>& v) {
  std::string msg;
  json details = json::array();
  for (const auto& f : v) {
    if (!msg.empty()) msg += "; ";
    msg += f.field + ": " + f.message;
    details.push_back({{"field", f.field}, {"constraint", f.constraint}, {"message", f.message}});
  }
  json e = openai_error(msg, "invalid_request_error", "INVALID_REQUEST",
                        v.empty() ? std::string() : v.front().field);
  e["error"]["details"] = details;
  return e;
}

std::vector<FieldViolation> parse_openai_body(const std::string& body, OpenAiKind kind,
                                              OpenAiRequest& out) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    return {{"body", "json", std::string("request body is not valid JSON: ") + e.what()}};
  } catch (const json::out_of_range&) {  // a number past double's range (1e400)
    return {{"body", "json", "request body holds a number out of range"}};
  }
  if (!j.is_object()) return {{"body", "type", "request body must be a JSON object"}};
  std::vector<FieldViolation> v;
  OpenAiRequest r;
  r.kind = kind;
  json ex = json::object();
  if (j.contains("model")) {
    if (!j["model"].is_string())
      v.push_back({"model", "type", "model must be a string"});
    else
      r.model = j["model"].get<std::string>();
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean())
      v.push_back({"stream", "type", "stream must be a boolean"});
    else
      r.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && j["stream_options"].is_object() &&
      j["stream_options"].contains("include_usage")) {
    const json& u = j["stream_options"]["include_usage"];
    if (u.is_boolean())
      r.include_usage = u.get<bool>();
    else if (!u.is_null())
      v.push_back({"stream_options.include_usage", "type", "include_usage must be a boolean"});
  }
  if (j.contains("n") && !j["n"].is_null() && j["n"] != 1)
    v.push_back({"n", "range", "only n = 1 is supported"});

  if (kind == OpenAiKind::Chat) {
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
      v.push_back({"messages", "required", "messages must be a non-empty array"});
    } else {
      std::vector<std::pair<std::string, std::string>> msgs;
      for (size_t i = 0; i < j["messages"].size(); ++i) {
        const json& m = j["messages"][i];
        const std::string f = "messages[" + std::to_string(i) + "]";
        std::string text;
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
          v.push_back({f + ".role", "type", "role must be a string"});
          continue;
        }
        const std::string role = m["role"].get<std::string>();
        if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
          v.push_back({f + ".role", "enum", "role must be system, developer, user or assistant"});
          continue;
        }
        if (!m.contains("content") || !content_text(m["content"], text)) {
          v.push_back({f + ".content", "type", "content must be a string or text parts"});
          continue;
        }
        msgs.emplace_back(role == "developer" ? "system" : role, text);
      }
      if (v.empty()) {
        if (msgs.size() == 1 && msgs[0].first == "user") {
          // One user turn: the model's own template (D8 `chat: true`).
          ex["prompt"] = msgs[0].second;
          ex["chat"] = true;
        } else {
          ex["prompt"] = chatml(msgs);
          r.prebuilt_template = true;
        }
      }
    }
  } else {
    if (!j.contains("prompt")) {
      v.push_back({"prompt", "required", "prompt is required"});
    } else if (j["prompt"].is_string()) {
      ex["prompt"] = j["prompt"];
    } else if (j["prompt"].is_array() && j["prompt"].size() == 1 && j["prompt"][0].is_string()) {
      ex["prompt"] = j["prompt"][0];
    } else {
      v.push_back({"prompt", "type", "prompt must be a string (batches are not supported)"});
    }
    if (j.contains("echo") && j["echo"] == true)
      v.push_back({"echo", "unsupported", "echo is not supported"});
  }

  // Sampling fields share the /execute rules; null means "not given" in OpenAI clients.
  auto copy = [&](const char* from, const char* to) {
    if (j.contains(from) && !j[from].is_null()) ex[to] = j[from];
  };
  copy("max_tokens", "max_tokens");
  copy("max_completion_tokens", "max_tokens");
  copy("temperature", "temperature");
  copy("top_p", "top_p");
  copy("top_k", "top_k");
  copy("min_p", "min_p");
  copy("repetition_penalty", "repetition_penalty");
  copy("seed", "seed");
  if (j.contains("stop") && !j["stop"].is_null())
    ex["stop"] = j["stop"].is_string() ? json::array({j["stop"]}) : j["stop"];
  // OpenAI's legacy completions default to 16 tokens.
  if (kind == OpenAiKind::Completion && !ex.contains("max_tokens")) ex["max_tokens"] = 16;
  r.execute = std::move(ex);
  if (v.empty()) out = std::move(r);
  return v;
}

const char* openai_finish_reason(const std::string& stop_reason) {
  return stop_reason == "max_tokens" ? "length" : "stop";
}

json openai_usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json OpenAiStream::chunk(const json& delta_or_text, const json& finish_reason) const {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (kind == OpenAiKind::Chat)
    choice["delta"] = delta_or_text;
  else
    choice["text"] = delta_or_text;
  return {{"id", id},
          {"object", kind == OpenAiKind::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

json OpenAiStream::usage_chunk(int64_t prompt_tokens, int64_t completion_tokens) const {
  return {{"id", id},
          {"object", kind == OpenAiKind::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", openai_usage(prompt_tokens, completion_tokens)}};
}

json OpenAiStream::full(const std::string& text, const std::string& finish_reason,
                        int64_t prompt_tokens, int64_t completion_tokens) const {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (kind == OpenAiKind::Chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  return {{"id", id},
          {"object", kind == OpenAiKind::Chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", openai_usage(prompt_tokens, completion_tokens)}};
}

}  // namespace worker::server
