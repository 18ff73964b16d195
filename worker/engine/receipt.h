#pragma once
// Receipts (WRK-D18): what a finished generation carries so that anyone can replay it on the
// CPU reference and check it token for token. A receipt names the model (content hash), the
// numerics, KV cache type and tokenizer, the full request (seed included), the prompt's
// token-id hash, every generated id and the hash of the logits each id was sampled from.
//
// What it proves: with the same weights (hash) and the same worker code, the CPU reference
// computes exactly these logits and, with this seed, picks exactly these ids. Not proved:
// that another engine (llama.cpp, another version of this worker) would; that the text
// shown to a user was these tokens' text (detokenize them to check).
#include <cstdint>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/generation.h"
#include "tokenizer/tokenizer.h"

namespace worker {

inline constexpr int kReceiptVersion = 1;

// What the worker knows about itself when it writes a receipt.
struct ReceiptContext {
  std::string model_name;
  uint64_t model_bytes = 0;
  std::shared_future<std::string> model_hash;  // file_content_hash(), computed after ready
  BackendInfo backend;                         // backend, numerics, kv_cache
  std::string tokenizer_kind;
  int32_t n_ctx = 0;
  std::string worker_build;  // the build's commit (or "unknown")
};

// "sha256:" + hex of the prompt ids as little-endian int32s.
std::string prompt_tokens_hash(const std::vector<int32_t>& ids);
std::string hash_hex64(uint64_t h);  // 16 lowercase hex digits

// The receipt of a finished generation. prompt_is_template: the prompt holds chat markup
// and was tokenized with special tokens parsed (the OpenAI chat route).
nlohmann::json make_receipt(const ReceiptContext& ctx, const GenerationRequest& req,
                            bool prompt_is_template, const GenerationResult& res);

// Replay of a receipt on an engine (the CPU reference): the first difference, if any.
struct VerifyOutcome {
  bool identical = false;
  std::string problem;  // what differs, with both values (empty when identical)
  int64_t step = -1;    // generated-token index of the first difference (-1: not a step)
  int64_t steps_checked = 0;
  bool model_hash_matches = true;
};

// Checks the receipt's shape and what the engine must match (numerics exact, the KV cache
// type, tokenizer kind), then replays: tokenizes the prompt (hash compared), evaluates it,
// and for each step compares the logits hash and the sampled id with the receipt's, feeding
// the receipt's id forward. model_hash: the replaying model's content hash, compared at the
// end (a different model is still replayed, to name the first step it changes). progress
// (may be empty) is called after each step. Throws std::invalid_argument for a malformed
// receipt.
VerifyOutcome verify_receipt(const nlohmann::json& receipt, Engine& engine, const Tokenizer& tok,
                             const std::string& model_hash,
                             const std::function<void(int64_t step, int64_t total)>& progress = {});

// The receipt inside a JSON document: the receipt itself, an SSE `end` event, or an OpenAI
// response / final chunk (all carry it under "receipt"). Throws std::invalid_argument.
const nlohmann::json& find_receipt(const nlohmann::json& doc);

}  // namespace worker
