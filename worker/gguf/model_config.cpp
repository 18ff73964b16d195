#include "gguf/model_config.h"

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace worker {

namespace {

std::string shape_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// Upper bounds far above any real model; they keep products such as n_head * head_dim
// and per-layer allocations from overflowing on a hostile file.
constexpr uint64_t kMaxDim = 1ull << 24;

int64_t positive(const GgufFile& f, const std::string& key, uint64_t v, uint64_t max) {
  if (v == 0 || v > max) {
    throw GgufError(f.path() + ": key " + key + " = " + std::to_string(v) +
                    " is out of range (expected 1 to " + std::to_string(max) + ")");
  }
  return static_cast<int64_t>(v);
}

int64_t required_int(const GgufFile& f, const std::string& key, uint64_t max = kMaxDim) {
  if (!f.find(key)) {
    throw GgufError(f.path() + ": missing required key " + key);
  }
  return positive(f, key, f.get_u64(key), max);
}

int64_t optional_int(const GgufFile& f, const std::string& key, int64_t fallback,
                     uint64_t max = kMaxDim) {
  return f.find(key) ? positive(f, key, f.get_u64(key), max) : fallback;
}

// The type holding the most bytes among 2-D weights, by its ggml name: what a file
// without general.file_type is described by.
std::string dominant_tensor_type(const GgufFile& f) {
  std::map<uint32_t, size_t> bytes_by_type;
  for (const auto& t : f.tensors()) {
    if (t.ne.size() == 2 && t.ne[1] > 1) bytes_by_type[t.type_raw] += t.nbytes;
  }
  std::string kind;
  size_t best = 0;
  for (const auto& [type, bytes] : bytes_by_type) {
    if (bytes > best) {
      best = bytes;
      kind = std::string(ggml_type_name(type));
    }
  }
  return kind;
}

}  // namespace

std::optional<std::string_view> llama_file_type_name(uint64_t file_type) {
  // llama.h's enum llama_ftype, named as llama-quantize names each type (tools/quantize).
  // Values 4..6 and 33..35 were removed from llama.cpp; they stay unknown here.
  switch (file_type) {
    case 0: return "F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K_S";
    case 12: return "Q3_K_M";
    case 13: return "Q3_K_L";
    case 14: return "Q4_K_S";
    case 15: return "Q4_K_M";
    case 16: return "Q5_K_S";
    case 17: return "Q5_K_M";
    case 18: return "Q6_K";
    case 19: return "IQ2_XXS";
    case 20: return "IQ2_XS";
    case 21: return "Q2_K_S";
    case 22: return "IQ3_XS";
    case 23: return "IQ3_XXS";
    case 24: return "IQ1_S";
    case 25: return "IQ4_NL";
    case 26: return "IQ3_S";
    case 27: return "IQ3_M";
    case 28: return "IQ2_S";
    case 29: return "IQ2_M";
    case 30: return "IQ4_XS";
    case 31: return "IQ1_M";
    case 32: return "BF16";
    case 36: return "TQ1_0";
    case 37: return "TQ2_0";
    // llama-quantize says MXFP4_MOE; M0-W-1823 expects /health to say MXFP4.
    case 38: return "MXFP4";
    case 39: return "NVFP4";
    case 40: return "Q1_0";
    case 41: return "Q2_0";
    default: return std::nullopt;
  }
}

std::string quant_kind_of(const GgufFile& f) {
  // general.file_type is what the quantizer meant (a Q4_K_M file is mostly Q4_K, with
  // Q6_K and, on rows not a multiple of 256, Q5_0/Q8_0 fallbacks that can outweigh it).
  // quant_kind is informational, so a missing, mistyped or unknown value falls back to
  // the tensors instead of failing the load.
  if (const GgufValue* v = f.find("general.file_type")) {
    std::optional<uint64_t> value;  // any non-negative integer type (llama.cpp writes u32)
    if (const auto* u = std::get_if<uint64_t>(&v->v)) value = *u;
    if (const auto* i = std::get_if<int64_t>(&v->v); i && *i >= 0) value = *i;
    if (value) {
      if (auto name = llama_file_type_name(*value)) return std::string(*name);
    }
  }
  return dominant_tensor_type(f);
}

ModelConfig read_model_config(const GgufFile& f) {
  ModelConfig c;
  if (!f.find("general.architecture")) {
    throw GgufError(f.path() + ": missing required key general.architecture");
  }
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "qwen2") {
    c.arch = Arch::Qwen2;
    c.rope_neox = true;  // llama.cpp: LLM_ARCH_QWEN2 uses LLAMA_ROPE_TYPE_NEOX
  } else if (c.arch_name == "llama") {
    c.arch = Arch::Llama;
    c.rope_neox = false;
  } else {
    throw GgufError(f.path() + ": unsupported architecture '" + c.arch_name +
                    "' (supported: qwen2, llama)");
  }
  const std::string a = c.arch_name + ".";
  std::string stem = f.path();
  if (auto p = stem.find_last_of('/'); p != std::string::npos) stem = stem.substr(p + 1);
  c.name = f.get_string("general.name", stem);

  c.n_ctx_train = required_int(f, a + "context_length", 1ull << 31);
  c.n_embd = required_int(f, a + "embedding_length");
  c.n_layer = required_int(f, a + "block_count");
  c.n_ff = required_int(f, a + "feed_forward_length");
  c.n_head = required_int(f, a + "attention.head_count");
  c.n_head_kv = optional_int(f, a + "attention.head_count_kv", c.n_head);
  if (c.n_head % c.n_head_kv != 0) {
    throw GgufError(f.path() + ": head_count " + std::to_string(c.n_head) +
                    " is not a multiple of head_count_kv " + std::to_string(c.n_head_kv));
  }
  if (!f.find(a + "attention.key_length") && c.n_embd % c.n_head != 0) {
    throw GgufError(f.path() + ": embedding_length " + std::to_string(c.n_embd) +
                    " is not a multiple of head_count " + std::to_string(c.n_head));
  }
  c.head_dim = optional_int(f, a + "attention.key_length", c.n_embd / c.n_head);
  if (f.find(a + "attention.value_length") &&
      optional_int(f, a + "attention.value_length", c.head_dim) != c.head_dim) {
    throw GgufError(f.path() + ": attention.value_length differs from key_length (unsupported)");
  }
  c.n_rot = optional_int(f, a + "rope.dimension_count", c.head_dim);
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    throw GgufError(f.path() + ": rope.dimension_count " + std::to_string(c.n_rot) +
                    " must be even and at most the head dimension " + std::to_string(c.head_dim));
  }
  c.rope_base = static_cast<float>(f.get_f64(a + "rope.freq_base", 10000.0));
  if (!(c.rope_base > 0.0f) || !std::isfinite(c.rope_base)) {
    throw GgufError(f.path() + ": rope.freq_base must be a positive number");
  }
  const std::string eps_key = a + "attention.layer_norm_rms_epsilon";
  if (!f.find(eps_key)) throw GgufError(f.path() + ": missing required key " + eps_key);
  c.norm_eps = static_cast<float>(f.get_f64(eps_key));
  if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps)) {
    throw GgufError(f.path() + ": " + eps_key + " must be a positive number");
  }

  const TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd && embd->ne.size() == 2) {
    c.vocab_size = embd->ne[1];
  } else if (f.find("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(f.find("tokenizer.ggml.tokens")->as_array().items.size());
  }
  // llama.cpp sizes token_embd from the token list and refuses a mismatch; so do we.
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && embd) {
    const auto n_tokens = static_cast<int64_t>(toks->as_array().items.size());
    if (n_tokens != c.vocab_size) {
      throw GgufError(f.path() + ": token_embd.weight has " + std::to_string(c.vocab_size) +
                      " rows but tokenizer.ggml.tokens has " + std::to_string(n_tokens) +
                      " entries");
    }
  }
  if (c.vocab_size <= 0) {
    throw GgufError(f.path() +
                    ": cannot determine the vocabulary size (no token_embd.weight "
                    "and no tokenizer.ggml.tokens)");
  }
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  c.has_qkv_bias = c.arch == Arch::Qwen2 && f.find_tensor("blk.0.attn_q.bias") != nullptr;

  c.quant_kind = quant_kind_of(f);
  return c;
}

namespace {

class Binder {
 public:
  Binder(const GgufFile& f) : f_(f) {}

  const TensorInfo* get(const std::string& name, std::vector<int64_t> shape, bool required = true) {
    const TensorInfo* t = f_.find_tensor(name);
    if (!t) {
      if (required) throw GgufError(f_.path() + ": missing tensor '" + name + "'");
      return nullptr;
    }
    // A trailing dimension of 1 is the same shape (ggml drops it).
    std::vector<int64_t> ne = t->ne;
    while (ne.size() > shape.size() && ne.back() == 1) ne.pop_back();
    if (ne != shape) {
      throw GgufError(f_.path() + ": tensor '" + name + "' has shape " + shape_str(t->ne) +
                      ", expected " + shape_str(shape));
    }
    if (!ggml_type_supported(t->type_raw)) {
      throw GgufError(f_.path() + ": tensor '" + name + "' has type " +
                      std::string(ggml_type_name(t->type_raw)) +
                      ", which this worker does not support (supported: F32 F16 BF16 Q8_0 "
                      "Q4_0 Q5_0 Q4_K Q6_K)");
    }
    return t;
  }

 private:
  const GgufFile& f_;
};

}  // namespace

ModelWeights bind_model_weights(const GgufFile& f, const ModelConfig& c) {
  Binder b(f);
  ModelWeights w;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  w.token_embd = b.get("token_embd.weight", {c.n_embd, c.vocab_size});
  w.output_norm = b.get("output_norm.weight", {c.n_embd});
  w.output = c.tied_output ? w.token_embd : b.get("output.weight", {c.n_embd, c.vocab_size});
  // Each layer has at least 9 tensors: refuse a block_count the file cannot back before
  // allocating per-layer state.
  if (static_cast<uint64_t>(c.n_layer) > f.tensors().size() / 9) {
    throw GgufError(f.path() + ": block_count " + std::to_string(c.n_layer) + " needs at least " +
                    std::to_string(9 * c.n_layer) + " tensors, the file has " +
                    std::to_string(f.tensors().size()));
  }
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.attn_norm = b.get(p + "attn_norm.weight", {c.n_embd});
    l.wq = b.get(p + "attn_q.weight", {c.n_embd, q_dim});
    l.wk = b.get(p + "attn_k.weight", {c.n_embd, kv_dim});
    l.wv = b.get(p + "attn_v.weight", {c.n_embd, kv_dim});
    if (c.has_qkv_bias) {
      l.bq = b.get(p + "attn_q.bias", {q_dim});
      l.bk = b.get(p + "attn_k.bias", {kv_dim});
      l.bv = b.get(p + "attn_v.bias", {kv_dim});
    }
    l.wo = b.get(p + "attn_output.weight", {q_dim, c.n_embd});
    l.ffn_norm = b.get(p + "ffn_norm.weight", {c.n_embd});
    l.w_gate = b.get(p + "ffn_gate.weight", {c.n_embd, c.n_ff});
    l.w_up = b.get(p + "ffn_up.weight", {c.n_embd, c.n_ff});
    l.w_down = b.get(p + "ffn_down.weight", {c.n_ff, c.n_embd});
  }
  return w;
}

std::shared_ptr<const Model> load_model(const std::string& path) {
  auto m = std::make_shared<Model>();
  m->file = GgufFile::open(path);
  m->config = read_model_config(*m->file);
  m->weights = bind_model_weights(*m->file, m->config);
  return m;
}

}  // namespace worker
