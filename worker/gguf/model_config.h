#pragma once
// Model hyper-parameters from `<arch>.*` keys and the bound weight tensors (M0-W-1212,
// 1214, D1). Shapes are checked here once, so backends can trust them.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.h"

namespace worker {

enum class Arch { Qwen2, Llama };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;    // "qwen2" | "llama"
  std::string name;         // general.name (or file stem)
  int64_t n_ctx_train = 0;  // <arch>.context_length
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // <arch>.attention.key_length or n_embd / n_head
  int64_t n_rot = 0;     // <arch>.rope.dimension_count or head_dim
  float rope_base = 10000.0f;
  bool rope_neox = false;  // qwen2: NEOX (halves); llama: normal (adjacent pairs)
  float norm_eps = 1e-5f;
  int64_t vocab_size = 0;
  bool tied_output = false;  // no output.weight: the LM head is token_embd.weight
  bool has_qkv_bias = false;
  std::string quant_kind;  // the file's type, e.g. "Q4_K_M", "F16" (see quant_kind_of)
};

struct LayerWeights {
  const TensorInfo* attn_norm = nullptr;
  const TensorInfo* wq = nullptr;
  const TensorInfo* wk = nullptr;
  const TensorInfo* wv = nullptr;
  const TensorInfo* bq = nullptr;  // qwen2 only
  const TensorInfo* bk = nullptr;
  const TensorInfo* bv = nullptr;
  const TensorInfo* wo = nullptr;
  const TensorInfo* ffn_norm = nullptr;
  const TensorInfo* w_gate = nullptr;
  const TensorInfo* w_up = nullptr;
  const TensorInfo* w_down = nullptr;
};

struct ModelWeights {
  const TensorInfo* token_embd = nullptr;
  const TensorInfo* output_norm = nullptr;
  const TensorInfo* output = nullptr;  // == token_embd when tied
  std::vector<LayerWeights> layers;
};

// A loaded model file: the mapping, its config and its bound weights. Shared by the
// tokenizer and both backends; immutable after construction (M0-W-1001, 1002).
struct Model {
  std::shared_ptr<GgufFile> file;
  ModelConfig config;
  ModelWeights weights;
};

// llama.cpp's name for a general.file_type value (enum llama_ftype), as llama-quantize
// spells it: 15 -> "Q4_K_M", 1 -> "F16". nullopt for a value llama.cpp does not define.
std::optional<std::string_view> llama_file_type_name(uint64_t file_type);
// The /health quant_kind: general.file_type's name when the key holds a known value, else
// the ggml type holding the most bytes among the 2-D weights (e.g. "F32", "Q8_0").
std::string quant_kind_of(const GgufFile& file);

// Reads the config; throws GgufError for an unsupported architecture or a missing key.
ModelConfig read_model_config(const GgufFile& file);
// Binds and shape-checks every tensor; an unsupported tensor type is an error naming the
// tensor and type (D2).
ModelWeights bind_model_weights(const GgufFile& file, const ModelConfig& config);
// open + read_model_config + bind_model_weights.
std::shared_ptr<const Model> load_model(const std::string& path);

}  // namespace worker
