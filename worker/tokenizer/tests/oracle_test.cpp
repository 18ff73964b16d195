// Random strings, ids compared with llama.cpp (node-llama-cpp) for the qwen2 vocabulary and
// stories260K, plus detokenize round trips.
#include <gtest/gtest.h>

#include <random>

#include "oracle_util.h"
#include "random_text.h"
#include "test_paths.h"
#include "tokenizer/vocab_tokenizers.h"

namespace worker {
namespace {

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

std::string escaped(const std::string& s) {
  return nlohmann::json(s).dump();
}

void compare_with_oracle(const std::string& model, const std::vector<std::string>& texts,
                         bool specials) {
  const Tokenizer& tok = test::tokenizer_for(model);
  const auto oracle = test::llama_oracle(model, texts, specials);
  size_t id_mismatch = 0, detok_mismatch = 0, roundtrips = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tok.encode(texts[i], false, specials);
    if (ids != oracle[i].ids) {
      if (++id_mismatch <= 10) {
        ADD_FAILURE() << "ids differ for " << escaped(texts[i]) << "\n  llama.cpp "
                      << show(oracle[i].ids) << "\n  ours      " << show(ids);
      }
      continue;
    }
    const std::string detok = tok.decode(ids, specials);
    if (detok != oracle[i].detok) {
      if (++detok_mismatch <= 10) {
        ADD_FAILURE() << "detokenize differs for " << escaped(texts[i]) << "\n  llama.cpp "
                      << escaped(oracle[i].detok) << "\n  ours      " << escaped(detok);
      }
    }
    // Where llama.cpp round-trips, so must we.
    if (oracle[i].detok == texts[i]) {
      ++roundtrips;
      EXPECT_EQ(detok, texts[i]) << "round trip broken for " << escaped(texts[i]);
    }
  }
  std::printf("%s: %zu texts, %zu id mismatches, %zu detokenize mismatches, %zu round trips\n",
              model.c_str(), texts.size(), id_mismatch, detok_mismatch, roundtrips);
  EXPECT_EQ(id_mismatch, 0u);
  EXPECT_EQ(detok_mismatch, 0u);
}

// REQ: M0-W-1362 M0-W-1363 M0-W-1365 WRK-D3
TEST(TokenizerOracle, Qwen2VocabRandomStringsMatchLlamaCpp) {
  test::RandomText gen(test::test_seed());
  std::vector<std::string> texts;
  for (int i = 0; i < 1000; ++i) texts.push_back(gen.next());
  compare_with_oracle(test::llama_models_dir() + "/ggml-vocab-qwen2.gguf", texts, false);
}

// REQ: M0-W-1362 M0-W-1363 M0-W-1365 WRK-D3
TEST(TokenizerOracle, Stories260kRandomStringsMatchLlamaCpp) {
  test::RandomText gen(test::test_seed());
  std::vector<std::string> texts;
  for (int i = 0; i < 1000; ++i) texts.push_back(gen.next());
  compare_with_oracle(test::shared_fixtures() + "/stories260K.gguf", texts, false);
}

// Special tokens spliced into random text, parsed as specials (single ids) by both.
// REQ: M0-W-1362 M0-W-1363 WRK-D3
TEST(TokenizerOracle, Qwen2SpecialsMatchLlamaCpp) {
  test::RandomText gen(test::test_seed());
  const std::vector<std::string> specials = {
      "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\n", "<|fim_prefix|>", "<|"};
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) texts.push_back(gen.next_with_specials(specials));
  compare_with_oracle(test::llama_models_dir() + "/ggml-vocab-qwen2.gguf", texts, true);
}

// REQ: M0-W-1363 WRK-D3
TEST(TokenizerOracle, LlamaSpmSpecialsMatchLlamaCpp) {
  test::RandomText gen(test::test_seed());
  const std::vector<std::string> specials = {"<s>", "</s>", "<unk>", " <s> "};
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) texts.push_back(gen.next_with_specials(specials));
  compare_with_oracle(test::llama_models_dir() + "/ggml-vocab-phi-3.gguf", texts, true);
}

// The project's haiku model (fixtures/haiku, used by the M0 acceptance test) has its own small
// byte-level BPE vocabulary with ChatML control tokens.
// REQ: M0-W-1362 M0-W-1363 WRK-D3
TEST(TokenizerOracle, HaikuModelMatchesLlamaCpp) {
  const std::string model = test::source_dir() + "/fixtures/haiku/haiku-qwen2.gguf";
  test::RandomText gen(test::test_seed());
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) texts.push_back(gen.next());
  compare_with_oracle(model, texts, false);
  texts.clear();
  for (int i = 0; i < 200; ++i) {
    texts.push_back(gen.next_with_specials({"<|im_start|>", "<|im_end|>", "<|endoftext|>"}));
  }
  compare_with_oracle(model, texts, true);
  EXPECT_EQ(apply_chat_template(test::tokenizer_for(model), "Write a haiku"),
            "<|im_start|>user\nWrite a haiku<|im_end|>\n<|im_start|>assistant\n");
}

// The other byte-level pre-tokenizers (llama3, gpt2) on llama.cpp's vocabularies.
// REQ: M0-W-1362 WRK-D3
TEST(TokenizerOracle, LlamaBpeAndGpt2RandomStringsMatchLlamaCpp) {
  test::RandomText gen(test::test_seed());
  std::vector<std::string> texts;
  for (int i = 0; i < 500; ++i) texts.push_back(gen.next());
  compare_with_oracle(test::llama_models_dir() + "/ggml-vocab-llama-bpe.gguf", texts, false);
  compare_with_oracle(test::llama_models_dir() + "/ggml-vocab-gpt-2.gguf", texts, false);
}

// llama.cpp's `default` pre-tokenizer (four regexes in sequence) on the gpt-2 vocabulary,
// re-labelled by fixtures/tokenizer/make_vocab_variant.py.
// REQ: M0-W-1362 WRK-D3
TEST(TokenizerOracle, DefaultPreTokenizerMatchesLlamaCpp) {
  const std::string out_dir = std::string(WORKER_BINARY_DIR) + "/tokenizer-fixtures";
  std::filesystem::create_directories(out_dir);
  const std::string out = out_dir + "/vocab-gpt2-default-pre.gguf";
  const std::string cmd =
      "python3 '" + test::source_dir() + "/fixtures/tokenizer/make_vocab_variant.py' '" +
      test::llama_models_dir() + "/ggml-vocab-gpt-2.gguf' '" + out + "' default 2>&1";
  const std::string log = test::run_capture(cmd);
  ASSERT_TRUE(std::filesystem::exists(out)) << cmd << "\n" << log;
  const auto& tok = test::tokenizer_for(out);
  ASSERT_EQ(dynamic_cast<const BpeTokenizer&>(tok).pre_tokenizer(), PreTokenizer::kDefault);
  test::RandomText gen(test::test_seed());
  std::vector<std::string> texts = {"Hello world 12345 $$$ +++ <=> x|y, 1234567",
                                    "a...b!!!c???  d\n\n e'll 'S 99 9999"};
  for (int i = 0; i < 500; ++i) texts.push_back(gen.next());
  compare_with_oracle(out, texts, false);
}

}  // namespace
}  // namespace worker
