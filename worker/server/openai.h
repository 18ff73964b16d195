#pragma once
// OpenAI-compatible front end (D5): /v1/chat/completions and /v1/completions run through the
// same request table (request.h) and job runner as /execute; this file holds what only the
// OpenAI shapes need: ChatML for several messages, error bodies, response chunks.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/request.h"

namespace worker::server {

enum class OpenAiKind { Chat, Completion };

// Builds ChatML for all messages and opens the assistant turn.
std::string chatml(const std::vector<std::pair<std::string, std::string>>& messages);

// {"error":{"message","type","param","code"}}
nlohmann::json openai_error(const std::string& message, const std::string& type,
                            const std::string& code, const std::string& param = {});
nlohmann::json openai_invalid(const Violations& v);

// "stop" for eos/stop_sequence, "length" for max_tokens.
const char* openai_finish_reason(const std::string& stop_reason);

// Streaming chunk builders.
struct OpenAiStream {
  OpenAiKind kind;
  std::string id;  // chatcmpl-<job> | cmpl-<job>
  std::string model;
  int64_t created;
  nlohmann::json chunk(const nlohmann::json& delta_or_text,
                       const nlohmann::json& finish_reason) const;
  nlohmann::json usage_chunk(int64_t prompt_tokens, int64_t completion_tokens) const;
  nlohmann::json full(const std::string& text, const std::string& finish_reason,
                      int64_t prompt_tokens, int64_t completion_tokens) const;
};

nlohmann::json openai_usage(int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace worker::server
