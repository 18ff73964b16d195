// Committed golden vectors (M0-W-1363 records {text, expected_token_ids, expected_decoded,
// description}) produced from llama.cpp by fixtures/tokenizer/make_golden_vectors.mjs: round
// trip, BOS/EOS, specials, multibyte UTF-8, empty and very long inputs.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace worker {
namespace {

struct GoldenModel {
  std::string vectors;  // file under fixtures/tokenizer/vectors
  std::string model;    // path of the GGUF
};

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

std::string model_for(const std::string& name) {
  if (name == "stories260K") return test::shared_fixtures() + "/stories260K.gguf";
  return test::llama_models_dir() + "/ggml-vocab-" + name + ".gguf";
}

// REQ: M0-W-1363 M0-W-1362 WRK-D3
TEST_P(TokenizerGolden, VectorsMatch) {
  const std::string path =
      test::source_dir() + "/fixtures/tokenizer/vectors/" + GetParam() + ".json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing golden vectors " << path;
  const auto doc = nlohmann::json::parse(in);
  const Tokenizer& tok = test::tokenizer_for(model_for(GetParam()));
  size_t n = 0;
  for (const auto& r : doc.at("records")) {
    const std::string text = r.at("text");
    const bool add_special = r.at("add_special");
    const bool parse_special = r.at("parse_special");
    const auto expected = r.at("expected_token_ids").get<std::vector<int32_t>>();
    const auto ids = tok.encode(text, add_special, parse_special);
    EXPECT_EQ(ids, expected) << GetParam() << ": " << r.at("description").get<std::string>();
    EXPECT_EQ(tok.decode(expected, parse_special), r.at("expected_decoded").get<std::string>())
        << GetParam() << ": " << r.at("description").get<std::string>();
    ++n;
  }
  EXPECT_GE(n, 15u);
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerGolden,
                         ::testing::Values("qwen2", "phi-3", "stories260K"),
                         test::vocab_param_name);

}  // namespace
}  // namespace worker
