#include "server/openai.h"

namespace worker::server {
using nlohmann::json;

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

json openai_invalid(const Violations& v) {
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
