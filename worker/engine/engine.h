#pragma once
// The Engine interface shared by the cpu and cuda backends (M0-W-1213). The generation
// loop, tokenizer, sampler and stop logic are shared; backends own only the forward pass
// and where its memory lives.
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/model_config.h"

namespace worker {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy argmax (lowest id wins ties)
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 = off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // 1 = off
  uint64_t seed = 0;
};

// Per-op checkpoints (layer-by-layer comparison, `worker-orcd trace`): a backend with a sink
// attached calls it after each op it traces, once per token row of the op's output: `name`
// (attn_norm, q, k, v, k_cache, v_cache, attn_out, ffn_inp, ffn_norm, ffn_act, l_out;
// result_norm with layer -1), the layer, the token's position, the row's values on the host.
using CheckpointSink =
    std::function<void(std::string_view name, int layer, int32_t pos, std::span<const float> v)>;

struct VramUsage {
  uint64_t weights = 0;
  uint64_t kv_cache = 0;
  uint64_t scratch = 0;
  uint64_t total() const { return weights + kv_cache + scratch; }
};

struct BackendInfo {
  std::string backend;    // "cpu" | "cuda"
  std::string numerics;   // "exact" (the CPU reference's floats) | "fast" (cuda only)
  std::string kv_cache;   // "f16" | "f32"
  bool resident = false;  // weights verified in device memory (cuda)
  std::string sm;         // "9.0" (cuda)
  std::string cuda_runtime_version;
  std::string device_name;
  std::string decode;  // cuda, exact numerics: "persistent" (one kernel a step) | "per_op";
                       // "" otherwise (/health's "decode")
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const ModelConfig& config() const = 0;
  virtual BackendInfo info() const = 0;
  virtual VramUsage vram() const = 0;
  // Re-checks that every device allocation is still plain VRAM (cudaPointerGetAttributes,
  // M0-W-1012) and updates info().resident; the server may call it periodically from the
  // inference thread. Backends without device memory have nothing to check.
  virtual bool verify_residency() { return true; }

  // Context size of the KV cache (<= the model's training context).
  virtual int32_t n_ctx() const = 0;
  // Number of positions already in the KV cache.
  virtual int32_t n_past() const = 0;
  // Drops the KV cache contents (the next eval starts at position 0).
  virtual void reset() = 0;

  // Evaluates `tokens` at positions n_past..n_past+n-1 and appends them to the KV cache.
  // Afterwards logits() holds the last position's logits; when all_logits is true,
  // logits_at(i) holds position i of this call (parity tooling).
  // Throws WorkerError (VRAM_OOM, CUDA_ERROR, INVALID_REQUEST when the context overflows).
  virtual void eval(std::span<const int32_t> tokens, bool all_logits = false) = 0;
  // eval() calling `meanwhile` once while the work runs: a backend that queues its work on a
  // device (cuda) calls it after queueing the last of it, before waiting, so that the caller's
  // bookkeeping overlaps the computation; by default it is called first. An exception from
  // it propagates (the queued work still completes before the next eval's).
  virtual void eval_overlapped(std::span<const int32_t> tokens, bool all_logits,
                               const std::function<void()>& meanwhile) {
    if (meanwhile) meanwhile();
    eval(tokens, all_logits);
  }
  virtual std::span<const float> logits() const = 0;
  virtual std::span<const float> logits_at(size_t i) const = 0;

  // Picks the next token from the last logits. `history` is the tokens generated so far
  // (repetition penalty); `rng` is the job's seeded generator. The default runs the CPU
  // sampler on logits(); the cuda backend samples on the GPU and copies back one id,
  // drawing from `rng` in the same way so both backends consume the same random stream and
  // pick the same id (WRK-D18). logits_hash, when given, receives the receipt's hash of the
  // logits sampled from (engine/sampler.h logits_hash()).
  virtual int32_t sample(const SamplingParams& params, std::span<const int32_t> history,
                         std::mt19937_64& rng, uint64_t* logits_hash = nullptr);
  // sample() for a caller whose next call, unless it stops, is eval() of the picked token
  // alone (the generation loop): a backend that queues work on a device (cuda) starts that
  // evaluation before returning the id, so the device does not wait for the caller's
  // bookkeeping between tokens. The eval then only takes the started step. Any other next
  // call drops the started step; its logits have then replaced the sampled ones, so logits(),
  // logits_at() and sample() throw until the next eval. The default is sample().
  virtual int32_t sample_and_continue(const SamplingParams& params,
                                      std::span<const int32_t> history, std::mt19937_64& rng,
                                      uint64_t* logits_hash = nullptr) {
    return sample(params, history, rng, logits_hash);
  }
};

// The checks every backend's eval() starts with: a non-empty batch that fits the context and
// ids inside the vocabulary. Throws WorkerError(InvalidRequest) naming the problem.
void check_eval_input(std::span<const int32_t> tokens, int32_t n_past, int32_t n_ctx,
                      int64_t vocab_size);

// Bytes of weights made ready so far (read by the cpu backend, uploaded by the cuda one) of
// the total; called on the loading thread, often (the callee throttles what it shows).
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

// The value of a --kv-cache argument (worker, generate, trace): "f16" or "f32"; anything else
// throws std::invalid_argument naming the flag.
std::string kv_cache_arg(const std::string& value);

// Backend factory. backend = "cpu" | "cuda"; throws WorkerError with a clear message
// (no silent fallback, D4). ctx_size 0 = the model's training context (capped at 32768).
// kv_cache: "f16" | "f32" | "" (the default, f16 on both backends: with exact numerics the two
// then give the same logits bit for bit, WRK-D31).
std::unique_ptr<Engine> make_engine(const std::string& backend, std::shared_ptr<const Model> model,
                                    int32_t ctx_size, int gpu_device = 0,
                                    bool fast_numerics = false, const std::string& kv_cache = "",
                                    const LoadProgress& progress = {});

}  // namespace worker
