#pragma once
// The CPU reference backend: FP32 math, weights read in place from the mapping.
#include <string>

#include "engine/engine.h"

namespace worker {

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size);

// Per-layer checkpoints (engine.h's CheckpointSink) for layer-by-layer comparison with another
// backend or llama.cpp: called during eval for every evaluated token with `name` one of
// attn_norm, q, k, v (q and k after RoPE, biases added), k_cache, v_cache (the rows stored in
// the KV cache), attn_out (before the output projection), ffn_inp (residual after attention),
// ffn_norm, ffn_act (silu(gate) * up), l_out (layer output), result_norm (layer -1); `pos` is
// the token's position in the sequence.
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                        CheckpointSink sink);

struct CpuEngineOptions {
  // K and V cached as fp16 (llama.cpp's default cache type, M0-W-1201) instead of F32: the
  // attention then computes llama.cpp's floats for type_k = type_v = F16 (no flash
  // attention), see cpu::attention_head_f16. Off: llama.cpp with an F32 cache (the oracle's
  // setting).
  bool kv_f16 = false;
  // Test only (the tracer's tests): in every eval, the output of op `perturb_op` (a checkpoint
  // name) at layer `perturb_layer` gets element `perturb_index` (flat over the eval's rows)
  // moved one ulp up before the next op reads it. Empty: off.
  std::string perturb_op;
  int perturb_layer = 0;
  int64_t perturb_index = 0;
};
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                        CheckpointSink sink, const CpuEngineOptions& options);

}  // namespace worker
