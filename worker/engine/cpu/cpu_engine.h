#pragma once
// The CPU reference backend: FP32 math, weights read in place from the mapping.
#include <functional>
#include <span>
#include <string_view>

#include "engine/engine.h"

namespace worker {

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size);

// Per-layer checkpoints for layer-by-layer comparison with another backend or llama.cpp:
// called during eval for every evaluated token with `name` one of attn_norm, q, k, v
// (q and k after RoPE, biases added), attn_out (before the output projection), ffn_inp
// (residual after attention), ffn_norm, ffn_act (silu(gate) * up), l_out (layer output),
// result_norm (layer -1); `pos` is the token's position in the sequence.
using CheckpointSink =
    std::function<void(std::string_view name, int layer, int32_t pos, std::span<const float> v)>;
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                        CheckpointSink sink);

struct CpuEngineOptions {
  // K and V cached as fp16 (llama.cpp's default cache type, M0-W-1201) instead of F32: the
  // attention then computes llama.cpp's floats for type_k = type_v = F16 (no flash
  // attention), see cpu::attention_head_f16. Off: llama.cpp with an F32 cache (the oracle's
  // setting).
  bool kv_f16 = false;
};
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                        CheckpointSink sink, const CpuEngineOptions& options);

}  // namespace worker
