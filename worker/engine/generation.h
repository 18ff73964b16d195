#pragma once
// The generation loop shared by both backends and by every front end (SSE, OpenAI, CLI):
// tokenize -> eval prompt -> (sample -> stream text -> stop checks -> eval) until EOS,
// max_tokens, a stop sequence or cancellation.
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace worker {

struct GenerationRequest {
  std::string prompt;
  bool chat = false;          // wrap the prompt with the model's chat template
  int32_t max_tokens = 2048;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop sequences matched on decoded text (D7)
};

enum class StopReason { MaxTokens, Eos, StopSequence, Cancelled };
const char* stop_reason_name(StopReason r);  // "max_tokens" | "eos" | "stop_sequence" | "cancelled"

struct GenerationResult {
  StopReason stop_reason = StopReason::MaxTokens;
  std::string stop_sequence_matched;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;  // generated ids
  std::string text;             // concatenated text sent to the client
  double first_token_ms = 0;
  double decode_time_ms = 0;
};

struct GenerationCallbacks {
  // Called once per emitted text chunk (never a partial UTF-8 sequence, never text that
  // may still turn into a stop sequence). index counts emitted token events from 0.
  std::function<void(const std::string& text, int32_t index, int32_t token_id)> on_text;
  // Polled before every forward pass; true stops the job (StopReason::Cancelled).
  std::function<bool()> should_stop;
  // Called after each eval with the logits of every evaluated position (parity logging).
  std::function<void(const Engine& engine, size_t n_positions, int32_t first_token_idx)> on_logits;
};

// Tokenizes the prompt (applying the chat template when asked) the way the worker does:
// BOS per the vocabulary, specials parsed only inside the template.
std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const std::string& prompt, bool chat);

GenerationResult generate(Engine& engine, const Tokenizer& tok, const GenerationRequest& req,
                          const GenerationCallbacks& cb);

}  // namespace worker
