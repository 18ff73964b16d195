#include "engine/receipt.h"

#include <cstdio>
#include <random>
#include <stdexcept>

#include "common/sha256.h"

namespace worker {
using nlohmann::json;

std::string prompt_tokens_hash(const std::vector<int32_t>& ids) {
  std::vector<uint8_t> bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<uint8_t>(u >> (8 * b)));
  }
  return "sha256:" + sha256_hex(bytes);
}

std::string hash_hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

json make_receipt(const ReceiptContext& ctx, const GenerationRequest& req, bool prompt_is_template,
                  const GenerationResult& res) {
  std::string model_hash = "unavailable";
  if (ctx.model_hash.valid()) {
    try {
      model_hash = ctx.model_hash.get();  // computed after ready; waits only for early jobs
    } catch (const std::exception& e) {
      model_hash = std::string("unavailable: ") + e.what();
    }
  }
  json hashes = json::array();
  for (uint64_t h : res.logits_hashes) hashes.push_back(hash_hex64(h));
  const SamplingParams& s = req.sampling;
  return {{"version", kReceiptVersion},
          {"model", {{"name", ctx.model_name}, {"bytes", ctx.model_bytes}, {"hash", model_hash}}},
          {"engine",
           {{"backend", ctx.backend.backend},
            {"numerics", ctx.backend.numerics},
            {"kv_cache", ctx.backend.kv_cache},
            {"tokenizer", ctx.tokenizer_kind},
            {"n_ctx", ctx.n_ctx},
            {"worker_build", ctx.worker_build}}},
          {"request",
           {{"prompt", req.prompt},
            {"chat", req.chat},
            {"prompt_is_template", prompt_is_template},
            {"max_tokens", req.max_tokens},
            {"temperature", s.temperature},
            {"top_p", s.top_p},
            {"top_k", s.top_k},
            {"min_p", s.min_p},
            {"repetition_penalty", s.repetition_penalty},
            {"seed", s.seed},
            {"stop", req.stop}}},
          {"prompt_tokens",
           {{"count", res.prompt_tokens.size()}, {"hash", prompt_tokens_hash(res.prompt_tokens)}}},
          {"tokens", res.tokens},
          {"logits_hashes", std::move(hashes)},
          {"stop_reason", stop_reason_name(res.stop_reason)}};
}

const json& find_receipt(const json& doc) {
  if (!doc.is_object()) throw std::invalid_argument("not a JSON object");
  if (doc.contains("version") && doc.contains("logits_hashes")) return doc;
  if (doc.contains("receipt") && doc["receipt"].is_object()) return doc["receipt"];
  throw std::invalid_argument(
      "no receipt in this document (expected a receipt, an `end` event "
      "or an OpenAI response with a \"receipt\" field)");
}

namespace {

template <typename T>
T field(const json& obj, const char* section, const char* name) {
  const json* o = &obj;
  if (section) {
    if (!obj.contains(section) || !obj[section].is_object())
      throw std::invalid_argument(std::string("receipt: missing object \"") + section + "\"");
    o = &obj[section];
  }
  if (!o->contains(name))
    throw std::invalid_argument(std::string("receipt: missing field \"") +
                                (section ? std::string(section) + "." : "") + name + "\"");
  try {
    return (*o)[name].get<T>();
  } catch (const json::exception&) {
    throw std::invalid_argument(std::string("receipt: field \"") + name + "\" has the wrong type");
  }
}

VerifyOutcome differs(std::string problem, int64_t step, int64_t checked) {
  VerifyOutcome v;
  v.problem = std::move(problem);
  v.step = step;
  v.steps_checked = checked;
  return v;
}

}  // namespace

VerifyOutcome verify_receipt(const json& r, Engine& engine, const Tokenizer& tok,
                             const std::string& model_hash,
                             const std::function<void(int64_t, int64_t)>& progress) {
  if (field<int>(r, nullptr, "version") != kReceiptVersion)
    throw std::invalid_argument("receipt: unsupported version (this verifier reads version " +
                                std::to_string(kReceiptVersion) + ")");
  const auto numerics = field<std::string>(r, "engine", "numerics");
  const auto kv = field<std::string>(r, "engine", "kv_cache");
  const auto tok_kind = field<std::string>(r, "engine", "tokenizer");
  GenerationRequest req;
  req.prompt = field<std::string>(r, "request", "prompt");
  req.chat = field<bool>(r, "request", "chat");
  const bool templated = field<bool>(r, "request", "prompt_is_template");
  req.sampling.temperature = field<float>(r, "request", "temperature");
  req.sampling.top_p = field<float>(r, "request", "top_p");
  req.sampling.top_k = field<int32_t>(r, "request", "top_k");
  req.sampling.min_p = field<float>(r, "request", "min_p");
  req.sampling.repetition_penalty = field<float>(r, "request", "repetition_penalty");
  req.sampling.seed = field<uint64_t>(r, "request", "seed");
  const auto want_prompt_hash = field<std::string>(r, "prompt_tokens", "hash");
  const auto tokens = field<std::vector<int32_t>>(r, nullptr, "tokens");
  const auto hashes = field<std::vector<std::string>>(r, nullptr, "logits_hashes");
  const auto receipt_model_hash = field<std::string>(r, "model", "hash");
  if (tokens.size() != hashes.size())
    throw std::invalid_argument("receipt: " + std::to_string(tokens.size()) + " tokens but " +
                                std::to_string(hashes.size()) + " logits hashes");

  if (numerics != "exact")
    return differs("numerics '" + numerics +
                       "' is not reproducible on the CPU reference (only exact numerics are)",
                   -1, 0);
  const BackendInfo info = engine.info();
  if (kv != info.kv_cache)
    return differs("KV cache: receipt " + kv + ", replay engine " + info.kv_cache, -1, 0);
  if (tok_kind != tok.kind())
    return differs("tokenizer: receipt " + tok_kind + ", this model's " + tok.kind(), -1, 0);

  const std::vector<int32_t> prompt =
      templated ? tok.encode(req.prompt, true, true) : tokenize_prompt(tok, req.prompt, req.chat);
  const std::string prompt_hash = prompt_tokens_hash(prompt);
  if (prompt_hash != want_prompt_hash)
    return differs("prompt tokens: receipt " + want_prompt_hash + ", replay " + prompt_hash, -1, 0);

  engine.reset();
  engine.eval(prompt);
  std::mt19937_64 rng(req.sampling.seed);
  std::vector<int32_t> history;
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = 0;
    const int32_t id = engine.sample(req.sampling, history, rng, &h);
    const auto ui = static_cast<size_t>(i);
    if (hash_hex64(h) != hashes[ui])
      return differs("step " + std::to_string(i) + ": logits hash receipt " + hashes[ui] +
                         ", replay " + hash_hex64(h),
                     i, i);
    if (id != tokens[ui])
      return differs("step " + std::to_string(i) + ": token receipt " + std::to_string(tokens[ui]) +
                         ", replay " + std::to_string(id),
                     i, i);
    history.push_back(tokens[ui]);
    if (i + 1 < n) engine.eval(std::span<const int32_t>(&tokens[ui], 1));
    if (progress) progress(i + 1, n);
  }
  if (receipt_model_hash != model_hash) {
    VerifyOutcome v = differs(
        "model content hash: receipt " + receipt_model_hash + ", this file " + model_hash, -1, n);
    v.model_hash_matches = false;
    return v;
  }
  VerifyOutcome ok;
  ok.identical = true;
  ok.steps_checked = n;
  return ok;
}

}  // namespace worker
