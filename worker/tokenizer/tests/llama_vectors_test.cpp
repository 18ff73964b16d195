// llama.cpp's own tokenizer test vectors (tests/test-tokenizer-0.cpp format): every id equal.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "test_paths.h"

namespace worker {
namespace {

struct VectorCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Inputs are separated by "\n__ggml_vocab_test__\n"; outputs are one line of ids each.
std::vector<VectorCase> read_vectors(const std::string& base) {
  const std::string inp = slurp(base + ".inp");
  std::vector<std::string> texts;
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream out(base + ".out");
  std::vector<VectorCase> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    if (i >= texts.size()) throw std::runtime_error("more outputs than inputs in " + base);
    VectorCase c{texts[i], {}};
    std::istringstream ls(line);
    int64_t id = 0;
    while (ls >> id) c.ids.push_back(static_cast<int32_t>(id));
    cases.push_back(std::move(c));
  }
  if (cases.size() != texts.size()) throw std::runtime_error("inputs/outputs differ in " + base);
  return cases;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

class TokenizerLlamaVectors : public ::testing::TestWithParam<std::string> {};

// REQ: M0-W-1362 M0-W-1363 M0-W-1365 WRK-D3
TEST_P(TokenizerLlamaVectors, EveryIdEqualsLlamaCpp) {
  const std::string base = test::llama_models_dir() + "/ggml-vocab-" + GetParam() + ".gguf";
  const Tokenizer& tok = test::tokenizer_for(base);
  const auto cases = read_vectors(base);
  ASSERT_GT(cases.size(), 10u) << base;
  size_t failures = 0;
  for (const auto& c : cases) {
    const auto got = tok.encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    if (got != c.ids) {
      ++failures;
      ADD_FAILURE() << GetParam() << ": text '" << c.text << "'\n  expected " << show(c.ids)
                    << "\n  got      " << show(got);
      if (failures > 10) break;
    }
  }
  std::printf("[%s] %zu vectors, %zu mismatches, tokenizer %s\n", GetParam().c_str(), cases.size(),
              failures, tok.kind().c_str());
}

INSTANTIATE_TEST_SUITE_P(Vocabs, TokenizerLlamaVectors,
                         ::testing::Values("qwen2", "llama-spm", "llama-bpe", "gpt-2", "phi-3"),
                         test::vocab_param_name);

}  // namespace
}  // namespace worker
