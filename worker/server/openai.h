#pragma once
// OpenAI-compatible front end (D5): /v1/chat/completions and /v1/completions map onto the
// same job runner as /execute. Request fields OpenAI clients send but this worker does not
// use are ignored (clients send many); the ones it uses are type- and range-checked by the
// /execute validator, so both APIs obey the same rules.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/validation.h"

namespace worker::server {

enum class OpenAiKind { Chat, Completion };

struct OpenAiRequest {
  OpenAiKind kind = OpenAiKind::Chat;
  bool stream = false;
  bool include_usage = false;
  std::string model;       // echoed back (empty: the worker's model name)
  nlohmann::json execute;  // the equivalent /execute body, for validate_execute_json
  // Multi-turn/system chat: the ChatML text built here (must be tokenized with specials).
  bool prebuilt_template = false;
};

// Builds ChatML for all messages and opens the assistant turn.
std::string chatml(const std::vector<std::pair<std::string, std::string>>& messages);

// Maps the OpenAI body; violations use OpenAI parameter names where they differ.
std::vector<FieldViolation> parse_openai_body(const std::string& body, OpenAiKind kind,
                                              OpenAiRequest& out);

// {"error":{"message","type","param","code"}}
nlohmann::json openai_error(const std::string& message, const std::string& type,
                            const std::string& code, const std::string& param = {});
nlohmann::json openai_invalid(const std::vector<FieldViolation>& v);

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
