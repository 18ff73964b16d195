// The generated fixture models (fixtures/generate_all.sh) load with the config their name
// promises, and every quantized file decodes close to the F32 file of the same seed: the
// C++ decoder agrees with the Python encoder on every block layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "gguf/model_config.h"
#include "test_util.h"

namespace worker {
namespace {

struct Shape {
  const char* name;
  int64_t n_embd, n_head, n_head_kv, n_ff;
};
constexpr Shape kShapes[] = {
    {"g1", 256, 4, 4, 512}, {"g2", 768, 12, 6, 512}, {"g7", 896, 14, 2, 1024}};
constexpr const char* kTypes[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_0", "q6_k"};

std::string fixture(const std::string& arch, const Shape& s, const std::string& type) {
  const std::string p =
      test::generated_fixtures() + "/" + arch + "-" + s.name + "-" + type + ".gguf";
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "missing generated fixture " << p << " (run fixtures/generate_all.sh)";
  }
  return p;
}

std::string upper(const std::string& s) {
  std::string up;
  for (char ch : s) up += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return up;
}

// llama-quantize's name for the general.file_type gen_model.py writes: the all-Q4_K files
// say LLAMA_FTYPE_MOSTLY_Q4_K_M (15), as `llama-quantize --pure ... Q4_K_M` would.
std::string file_type_kind(const std::string& type) {
  return type == "q4_k" ? "Q4_K_M" : upper(type);
}

// The stored type of the dominant weights: K types fall back on 896-wide rows.
std::string dominant_kind(const Shape& s, const std::string& type) {
  if (s.n_embd % 256 != 0 && type == "q4_k") return "Q5_0";
  if (s.n_embd % 256 != 0 && type == "q6_k") return "Q8_0";
  return upper(type);
}

// REQ: M0-W-1211 M0-W-1212 M0-W-1214 WRK-D1 WRK-D2
TEST(GgufGenerated, EveryFixtureLoadsWithItsConfig) {
  for (const char* arch : {"qwen2", "llama"}) {
    for (const Shape& s : kShapes) {
      for (const char* type : kTypes) {
        const std::string path = fixture(arch, s, type);
        SCOPED_TRACE(path);
        std::shared_ptr<const Model> m;
        ASSERT_NO_THROW(m = load_model(path));
        const ModelConfig& c = m->config;
        EXPECT_EQ(c.arch_name, arch);
        EXPECT_EQ(c.n_embd, s.n_embd);
        EXPECT_EQ(c.n_head, s.n_head);
        EXPECT_EQ(c.n_head_kv, s.n_head_kv);
        EXPECT_EQ(c.n_ff, s.n_ff);
        EXPECT_EQ(c.n_layer, 2);
        EXPECT_EQ(c.head_dim, s.n_embd / s.n_head);
        EXPECT_EQ(c.n_rot, c.head_dim);
        const bool qwen = std::string(arch) == "qwen2";
        EXPECT_EQ(c.vocab_size, qwen ? 2051 : 512);  // qwen2: 2048 + 3 control tokens
        EXPECT_EQ(c.rope_neox, qwen);
        EXPECT_EQ(c.has_qkv_bias, qwen);
        EXPECT_FLOAT_EQ(c.rope_base, qwen ? 1e6f : 1e4f);
        EXPECT_FLOAT_EQ(c.norm_eps, qwen ? 1e-6f : 1e-5f);
        EXPECT_FALSE(c.tied_output);
        EXPECT_EQ(c.quant_kind, file_type_kind(type));
        if (qwen) {
          const auto toks = m->file->get_string_array("tokenizer.ggml.tokens");
          EXPECT_EQ(toks[2048], "<|endoftext|>");
          EXPECT_EQ(toks[2050], "<|im_end|>");
          EXPECT_EQ(m->file->get_u64("tokenizer.ggml.eos_token_id"), 2048u);
          EXPECT_EQ(m->file->get_string("tokenizer.ggml.pre"), "qwen2");
          EXPECT_NE(m->file->get_string("tokenizer.chat_template").find("<|im_start|>"),
                    std::string::npos);
        }
      }
    }
  }
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// The same fixture bytes with the key general.file_type renamed (same length), so the
// fallback is checked on real files whose dominant type differs from their file type.
// REQ: M0-W-1320 WRK-D12 M0-W-1201
TEST(GgufGenerated, QuantKindFallsBackToTheDominantTypeWithoutFileType) {
  const std::string key = "general.file_type", renamed = "general.file_tyqe";
  for (const char* arch : {"qwen2", "llama"}) {
    for (const Shape& s : {kShapes[0], kShapes[2]}) {  // 256 wide (no fallback) and 896
      for (const char* type : kTypes) {
        const std::string path = fixture(arch, s, type);
        SCOPED_TRACE(path);
        std::vector<uint8_t> bytes = read_file(path);
        ASSERT_FALSE(bytes.empty());
        const auto hit = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
        ASSERT_NE(hit, bytes.end()) << "no " << key << " key";
        EXPECT_EQ(read_model_config(*GgufFile::from_memory(bytes.data(), bytes.size())).quant_kind,
                  file_type_kind(type));
        std::copy(renamed.begin(), renamed.end(), hit);
        auto f = GgufFile::from_memory(bytes.data(), bytes.size());
        ASSERT_EQ(f->find(key), nullptr);
        EXPECT_EQ(read_model_config(*f).quant_kind, dominant_kind(s, type));
      }
    }
  }
}

double rel_rmse(const TensorInfo& a, const TensorInfo& ref) {
  std::vector<float> x(static_cast<size_t>(a.row_len())), y(x.size());
  double err = 0, norm = 0;
  for (int64_t r = 0; r < a.rows(); ++r) {
    dequantize_row(a.type, a.row(r), x.data(), a.row_len());
    dequantize_row(ref.type, ref.row(r), y.data(), ref.row_len());
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = static_cast<double>(x[i]) - static_cast<double>(y[i]);
      err += d * d;
      norm += static_cast<double>(y[i]) * static_cast<double>(y[i]);
    }
  }
  return std::sqrt(err / norm);
}

// REQ: WRK-D2 M0-W-1201
TEST(GgufGenerated, QuantizedWeightsDecodeCloseToF32) {
  // Quantization error bounds for normal data (rel. RMSE); a wrong layout gives ~1.0+.
  const std::map<std::string, double> tol = {{"f16", 1e-3},  {"bf16", 8e-3}, {"q8_0", 0.01},
                                             {"q6_k", 0.03}, {"q5_0", 0.05}, {"q4_k", 0.1},
                                             {"q4_0", 0.15}};
  for (const char* arch : {"qwen2", "llama"}) {
    for (const Shape& s : kShapes) {
      auto ref = GgufFile::open(fixture(arch, s, "f32"));
      for (const auto& [type, bound] : tol) {
        auto q = GgufFile::open(fixture(arch, s, type));
        for (const auto& t : q->tensors()) {
          SCOPED_TRACE(q->path() + " " + t.name + " " + std::string(ggml_type_name(t.type_raw)));
          const TensorInfo& r = ref->tensor(t.name);
          ASSERT_EQ(t.ne, r.ne);
          const double e = rel_rmse(t, r);
          // A K type that fell back to Q5_0/Q8_0 must meet that type's (tighter) bound.
          EXPECT_LE(e, bound * 1.5);
          if (t.ne.size() == 2) {
            EXPECT_GT(e, type == std::string("f16") ? 0.0 : 1e-5);  // really quantized
          }
        }
      }
    }
  }
}

// The on-disk broken files (fixtures/corrupt/make_corrupt.py) that process-level tests use
// give the error expected.json promises, through the same load_model the worker calls.
// REQ: M0-W-1210 M0-W-1200 WRK-D2
TEST(GgufGenerated, OnDiskCorruptFilesGiveTheirErrors) {
  const std::string dir = test::generated_fixtures() + "/corrupt";
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in) << "missing " << dir << "/expected.json (run fixtures/generate_all.sh)";
  const auto expected = nlohmann::json::parse(in);
  ASSERT_GE(expected.size(), 10u);
  EXPECT_NO_THROW(load_model(dir + "/base-valid.gguf"));
  for (const auto& [file, message] : expected.items()) {
    try {
      load_model(dir + "/" + file);
      ADD_FAILURE() << file << " loaded without error";
    } catch (const GgufError& e) {
      EXPECT_NE(std::string(e.what()).find(message.get<std::string>()), std::string::npos)
          << file << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace worker
