#include "engine/generation.h"

#include <algorithm>

#include "common/errors.h"

namespace worker {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::MaxTokens: return "max_tokens";
    case StopReason::Eos: return "eos";
    case StopReason::StopSequence: return "stop_sequence";
    case StopReason::Cancelled: return "cancelled";
  }
  return "unknown";
}

std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const std::string& prompt, bool chat) {
  // As llama.cpp's server: BOS as the vocabulary asks; special-token texts are parsed only
  // inside the chat template, so a user typing "<|im_start|>" gets plain text tokens.
  if (chat) {
    std::string text;
    try {
      text = apply_chat_template(tok, prompt);
    } catch (const std::runtime_error& e) {
      // A model without a supported template is the request's problem (chat: true).
      throw WorkerError(ErrorCode::InvalidRequest, std::string("chat: ") + e.what());
    }
    return tok.encode(text, true, true);
  }
  return tok.encode(prompt, true, false);
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

const std::string& StopMatcher::matched_stop() const {
  static const std::string none;
  return matched_ >= 0 ? stops_[static_cast<size_t>(matched_)] : none;
}

std::string StopMatcher::push(const std::string& text) {
  if (matched()) return {};
  held_ += text;
  // The earliest complete occurrence of any stop sequence ends the text.
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t p = held_.find(stops_[i]);
    if (p != std::string::npos && (best == std::string::npos || p < best)) {
      best = p;
      matched_ = static_cast<int>(i);
    }
  }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop sequence. A stop sequence
  // starts with a UTF-8 lead byte, so the cut never splits a character.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_len = std::min(held_.size(), s.size() - 1);
    for (size_t len = max_len; len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::release() {
  std::string out;
  out.swap(held_);
  return out;
}

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerationResult generate(Engine& engine, const Tokenizer& tok, const GenerationRequest& req,
                          const GenerationCallbacks& cb) {
  const auto t0 = std::chrono::steady_clock::now();
  GenerationResult res;
  if (req.max_tokens < 1) {
    throw WorkerError(ErrorCode::InvalidRequest, "max_tokens must be >= 1");
  }
  if (req.prompt_tokens.empty()) {
    throw WorkerError(ErrorCode::InvalidRequest, "the prompt tokenizes to zero tokens");
  }
  res.prompt_tokens = req.prompt_tokens;
  const int64_t n_prompt = static_cast<int64_t>(res.prompt_tokens.size());
  if (n_prompt >= engine.n_ctx()) {
    throw WorkerError(ErrorCode::InvalidRequest, "prompt of " + std::to_string(n_prompt) +
                                                     " tokens leaves no room in the context of " +
                                                     std::to_string(engine.n_ctx()) + " tokens");
  }
  const int64_t max_new = std::min<int64_t>(req.max_tokens, engine.n_ctx() - n_prompt);

  std::mt19937_64 rng(req.sampling.seed);
  Utf8StreamDecoder decoder(tok);
  StopMatcher stops(req.stop);
  int32_t n_events = 0;
  auto emit = [&](const std::string& text, int32_t id) {
    if (text.empty()) return;
    res.text += text;
    if (cb.on_text) cb.on_text(text, n_events, id);
    ++n_events;
  };
  const bool want_all = static_cast<bool>(cb.on_logits);
  auto forward = [&](std::span<const int32_t> toks, int32_t first_idx) -> bool {
    if (cb.should_stop && cb.should_stop()) return false;
    if (first_idx == 0) {
      engine.eval_overlapped(toks, want_all, cb.on_prompt_running);
    } else {
      engine.eval(toks, want_all);
    }
    if (want_all) cb.on_logits(engine, toks.size(), first_idx);
    return true;
  };

  engine.reset();
  res.stop_reason = StopReason::MaxTokens;
  bool cancelled = false;
  try {
    cancelled = !forward(res.prompt_tokens, 0);
    for (int64_t i = 0; !cancelled && i < max_new; ++i) {
      uint64_t hash = 0;
      // Unless this is the last token, the engine starts evaluating the picked one while the
      // id is handled here (Engine::sample_and_continue).
      const int32_t id = i + 1 < max_new
                             ? engine.sample_and_continue(req.sampling, res.tokens, rng, &hash)
                             : engine.sample(req.sampling, res.tokens, rng, &hash);
      if (i == 0) res.first_token_ms = ms_since(t0);
      res.tokens.push_back(id);
      res.logits_hashes.push_back(hash);
      if (tok.is_eog(id)) {
        res.stop_reason = StopReason::Eos;
        break;
      }
      std::string text = stops.push(decoder.push(id));
      if (!stops.matched() && i + 1 == max_new) {
        // The last token: text held as a possible stop-sequence prefix goes out with it (an
        // event after it would make more token events than tokens_out).
        text += stops.release();
        text += decoder.flush();
      }
      emit(text, id);
      if (stops.matched()) {
        res.stop_reason = StopReason::StopSequence;
        res.stop_sequence_matched = stops.matched_stop();
        break;
      }
      if (i + 1 == max_new) break;  // the last token needs no forward pass
      cancelled = !forward(std::span<const int32_t>(&res.tokens.back(), 1),
                           static_cast<int32_t>(n_prompt + i));
    }
  } catch (...) {
    engine.reset();  // a failed job leaves no KV cache behind
    throw;
  }
  if (cancelled) {
    res.stop_reason = StopReason::Cancelled;
    engine.reset();  // D10: every cancelled job frees its KV cache
  } else if (res.stop_reason != StopReason::StopSequence) {
    // Held text turned out not to be a stop sequence; incomplete UTF-8 at the very end is
    // flushed as U+FFFD by the decoder.
    const int32_t last = res.tokens.empty() ? -1 : res.tokens.back();
    std::string rest = stops.release();
    rest += decoder.flush();
    emit(rest, last);
  }
  res.decode_time_ms = ms_since(t0);
  return res;
}

}  // namespace worker
