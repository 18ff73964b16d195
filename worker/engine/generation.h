#pragma once
// The generation loop shared by both backends and by every front end (SSE, OpenAI, CLI):
// eval prompt ids -> (sample -> stream text -> stop checks -> eval) until EOS, max_tokens, a
// stop sequence or cancellation. The caller tokenizes the prompt (tokenize_prompt), once.
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
  std::vector<int32_t> prompt_tokens;  // what the engine evaluates
  std::string prompt;                  // the text the ids came from (for the receipt)
  bool chat = false;                   // the ids hold the model's chat template
  int32_t max_tokens = 2048;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop sequences matched on decoded text (D7)
};

enum class StopReason { MaxTokens, Eos, StopSequence, Cancelled };
const char* stop_reason_name(StopReason r);  // "max_tokens" | "eos" | "stop_sequence" | "cancelled"

struct GenerationResult {
  StopReason stop_reason = StopReason::MaxTokens;
  std::string stop_sequence_matched;
  std::vector<int32_t> prompt_tokens;   // the request's, as evaluated
  std::vector<int32_t> tokens;          // generated ids
  std::vector<uint64_t> logits_hashes;  // per generated id: hash of the logits it came from
  std::string text;                     // concatenated text sent to the client
  double first_token_ms = 0;            // generate() entry -> first token sampled (prefill)
  double decode_time_ms = 0;            // generate() entry -> generation ended (the whole job)
};

struct GenerationCallbacks {
  // Called once per emitted text chunk (never a partial UTF-8 sequence, never text that
  // may still turn into a stop sequence). index counts emitted token events from 0.
  std::function<void(const std::string& text, int32_t index, int32_t token_id)> on_text;
  // Polled before every forward pass; true stops the job (StopReason::Cancelled).
  std::function<bool()> should_stop;
  // Called after each eval with the logits of every evaluated position (parity logging).
  std::function<void(const Engine& engine, size_t n_positions, int32_t first_token_idx)> on_logits;
  // Called once while the prompt is evaluated (Engine::eval_overlapped: on a GPU after its
  // work is queued), before any on_text; not called when the job ends before its prompt.
  std::function<void()> on_prompt_running;
};

// Tokenizes the prompt (applying the chat template when asked) the way the worker does:
// BOS per the vocabulary, specials parsed only inside the template.
std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const std::string& prompt, bool chat);

// Runs one job from an empty KV cache (engine.reset() first) on req.prompt_tokens; `tok`
// only decodes and spots end-of-generation ids. max_tokens is capped by the context left
// after the prompt. No prompt ids, a prompt that fills the context, or max_tokens < 1 is
// WorkerError(InvalidRequest); engine errors propagate unchanged.
GenerationResult generate(Engine& engine, const Tokenizer& tok, const GenerationRequest& req,
                          const GenerationCallbacks& cb);

// Stop-sequence hold-back on decoded text (D7), apart from the loop so it can be tested
// alone. push() takes the next complete-UTF-8 text and returns what may be sent now: text
// that cannot be the start of a stop sequence. After a match, matched() names the stop
// sequence; the text before it has been returned and the stop text itself never is.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(const std::string& text);
  // Whatever is still held (generation ended for another reason: it is not a stop).
  std::string release();
  bool matched() const { return matched_ >= 0; }
  const std::string& matched_stop() const;

 private:
  std::vector<std::string> stops_;
  std::string held_;
  int matched_ = -1;
};

}  // namespace worker
