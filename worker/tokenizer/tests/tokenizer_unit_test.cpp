// Unit tests: in-memory vocabularies, specials, BOS/EOS, EOG, chat template, streaming
// decoder, backend selection, CLI.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/utf8.h"
#include "oracle_util.h"
#include "random_text.h"
#include "test_paths.h"
#include "tokenizer/tokenize_cli.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizers.h"

namespace worker {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Truly;

std::string qwen2_path() {
  return test::llama_models_dir() + "/ggml-vocab-qwen2.gguf";
}
std::string spm_path() {
  return test::llama_models_dir() + "/ggml-vocab-llama-spm.gguf";
}
std::string stories_path() {
  return test::shared_fixtures() + "/stories260K.gguf";
}

// Byte-level image of a UTF-8 string (what a GPT-2 style vocabulary stores).
std::string bl(std::string_view s) {
  std::string out;
  for (char c : s) out += unicode::byte_to_unicode(static_cast<uint8_t>(c));
  return out;
}

// A tiny byte-level BPE vocabulary: all 256 byte tokens, a few merges, two specials.
VocabSpec tiny_bpe_spec() {
  VocabSpec s;
  s.model = "gpt2";
  s.pre = "qwen2";
  for (int b = 0; b < 256; ++b)
    s.tokens.push_back(unicode::byte_to_unicode(static_cast<uint8_t>(b)));
  s.token_types.assign(256, 1);
  for (const char* m : {"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"}) s.merges.push_back(m);
  for (const char* t : {"he", "ll", "hell", "hello", "Ġw", "Ġwo"}) {
    s.tokens.push_back(t);
    s.token_types.push_back(1);
  }
  s.tokens.push_back("<|ctl|>");  // 262
  s.token_types.push_back(3);
  s.tokens.push_back("<user>");  // 263
  s.token_types.push_back(4);
  s.eos_id = 262;
  s.bos_id = -1;
  return s;
}

// REQ: M0-W-1362 WRK-D3
TEST(TokenizerUnit, TinyBpeMergesByRank) {
  BpeTokenizer tok(tiny_bpe_spec());
  EXPECT_EQ(tok.kind(), "gguf-bpe");
  EXPECT_EQ(tok.vocab_size(), 264);
  // "hello" merges fully; " wo" via Ġw + o; "x" stays a byte token.
  EXPECT_EQ(tok.encode("hello", false, false), (std::vector<int32_t>{259}));
  EXPECT_EQ(tok.encode(" wox", false, false), (std::vector<int32_t>{261, 'x'}));
  EXPECT_EQ(tok.decode(tok.encode("hello wox", false, false)), "hello wox");
  // Invalid UTF-8 input becomes U+FFFD before byte-level encoding, as in llama.cpp.
  EXPECT_EQ(tok.decode(tok.encode("a\xff", false, false)), "a\xEF\xBF\xBD");
  EXPECT_EQ(bl(" "), "\xC4\xA0");
}

// The word cache (a word's ids merged once, the cache emptied when full) and the special-token
// scan's shortcuts (no special's first byte in the text; a special absent from the text) give
// the ids of a tokenizer that never saw the text.
// REQ: M0-W-1362
TEST(TokenizerUnit, WordCacheAndSpecialScanKeepTheIds) {
  BpeTokenizer seen(tiny_bpe_spec());
  const std::vector<std::string> texts = {"hello hello wo hello", " wox hellox hello",
                                          "hello<user>hello <|ctl|> hello", "a<b hello < user>",
                                          "hello<|ctl|hello"};
  for (const std::string& t : texts) {
    for (const bool special : {false, true}) {
      const auto want = BpeTokenizer(tiny_bpe_spec()).encode(t, false, special);
      EXPECT_EQ(seen.encode(t, false, special), want) << t;
      EXPECT_EQ(seen.encode(t, false, special), want) << t << " (again, from the cache)";
    }
  }
  EXPECT_EQ(seen.encode("hello<user>hello", false, false), (std::vector<int32_t>{259, 263, 259}));
  // More distinct words than the cache holds: it is emptied on the way and refilled.
  std::string many;
  for (int i = 0; i < 20000; ++i) {
    many += ' ';
    for (int k = i; k > 0 || many.back() == ' '; k /= 5) many += "hlowe"[k % 5];
  }
  const auto want = BpeTokenizer(tiny_bpe_spec()).encode(many, false, false);
  EXPECT_EQ(seen.encode(many, false, false), want);
  EXPECT_EQ(seen.encode(many, false, false), want);
  EXPECT_EQ(seen.encode("hello wo", false, false),
            BpeTokenizer(tiny_bpe_spec()).encode("hello wo", false, false));
}

// Control tokens are single ids only when parse_special; user-defined always.
// REQ: M0-W-1362 M0-W-1363 WRK-D3
TEST(TokenizerUnit, SpecialsAreSingleIdsWhenParsed) {
  BpeTokenizer tok(tiny_bpe_spec());
  EXPECT_EQ(tok.encode("<|ctl|>hello", false, true), (std::vector<int32_t>{262, 259}));
  const auto plain = tok.encode("<|ctl|>hello", false, false);
  EXPECT_GT(plain.size(), 2u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 262), 0);
  EXPECT_EQ(tok.encode("<user>", false, false), (std::vector<int32_t>{263}));
  // Control pieces are hidden unless asked for.
  EXPECT_EQ(tok.token_to_piece(262, false), "");
  EXPECT_EQ(tok.token_to_piece(262, true), "<|ctl|>");
  EXPECT_TRUE(tok.is_eog(262));
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_THROW(tok.token_to_piece(264), std::out_of_range);
}

// REQ: M0-W-1362 M0-W-1363 WRK-D3
TEST(TokenizerUnit, Qwen2SpecialsEogAndNoBos) {
  const Tokenizer& tok = test::tokenizer_for(qwen2_path());
  EXPECT_EQ(tok.kind(), "gguf-bpe");
  EXPECT_EQ(tok.vocab_size(), 151936);
  EXPECT_FALSE(tok.add_bos());
  const auto ids = tok.encode("<|im_start|>user\nHi<|im_end|>", true, true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151644), 1);
  EXPECT_TRUE(tok.is_eog(151645));  // <|im_end|>
  EXPECT_TRUE(tok.is_eog(151643));  // <|endoftext|>
  EXPECT_FALSE(tok.is_eog(151644));
  EXPECT_FALSE(tok.is_eog(9707));
  EXPECT_EQ(tok.decode(ids, true), "<|im_start|>user\nHi<|im_end|>");
  EXPECT_EQ(tok.decode(ids, false), "user\nHi");
}

// REQ: M0-W-1363 WRK-D3
TEST(TokenizerUnit, SpmAddsBosAndSpacePrefix) {
  const Tokenizer& tok = test::tokenizer_for(spm_path());
  EXPECT_EQ(tok.kind(), "gguf-spm");
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  const auto ids = tok.encode("Hello world", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(tok.encode("", true, false), (std::vector<int32_t>{1}));
  EXPECT_TRUE(tok.encode("", false, false).empty());
  // The escaped space prefix is removed again by decode.
  EXPECT_EQ(tok.decode(tok.encode("Hello world", false, false)), "Hello world");
  EXPECT_TRUE(tok.is_eog(2));
}

// REQ: M0-W-1360 M0-W-1364
TEST(TokenizerUnit, BackendSelectedFromMetadata) {
  EXPECT_EQ(test::tokenizer_for(qwen2_path()).kind(), "gguf-bpe");
  EXPECT_EQ(test::tokenizer_for(stories_path()).kind(), "gguf-spm");
  EXPECT_EQ(test::tokenizer_for(stories_path()).vocab_size(), 512);
}

// A GGUF with only metadata, built in memory.
class GgufBytes {
 public:
  void str(const std::string& key, const std::string& v) {
    kv_key(key);
    u32(8);
    s(v);
    ++n_;
  }
  void str_array(const std::string& key, const std::vector<std::string>& v) {
    kv_key(key);
    u32(9);
    u32(8);
    u64(v.size());
    for (const auto& x : v) s(x);
    ++n_;
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    put("GGUF", 4);
    const uint32_t version = 3;
    put(&version, 4);
    const uint64_t zero = 0;
    put(&zero, 8);
    put(&n_, 8);
    out.insert(out.end(), body_.begin(), body_.end());
    return out;
  }

 private:
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void s(const std::string& v) {
    u64(v.size());
    raw(v.data(), v.size());
  }
  void kv_key(const std::string& k) { s(k); }
  void raw(const void* p, size_t n) {
    body_.insert(body_.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  }
  std::vector<uint8_t> body_;
  uint64_t n_ = 0;
};

// make_tokenizer's error for a metadata-only GGUF; "" when it loads.
std::string make_tokenizer_error(const GgufBytes& g) {
  const auto bytes = g.bytes();
  const auto file = GgufFile::from_memory(bytes.data(), bytes.size());
  try {
    make_tokenizer(*file);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// REQ: M0-W-1360
TEST(TokenizerUnit, UnsupportedVocabulariesGiveClearErrors) {
  GgufBytes bert;
  bert.str("tokenizer.ggml.model", "bert");
  bert.str_array("tokenizer.ggml.tokens", {"a", "b"});
  EXPECT_THAT(make_tokenizer_error(bert), HasSubstr("bert"));

  GgufBytes no_model;
  no_model.str("general.architecture", "llama");
  EXPECT_THAT(make_tokenizer_error(no_model), HasSubstr("tokenizer.ggml.model"));

  GgufBytes unknown_pre;
  unknown_pre.str("tokenizer.ggml.model", "gpt2");
  unknown_pre.str("tokenizer.ggml.pre", "klingon");
  unknown_pre.str_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
  unknown_pre.str_array("tokenizer.ggml.merges", {"a b"});
  EXPECT_THAT(make_tokenizer_error(unknown_pre), HasSubstr("klingon"));

  EXPECT_THROW(load_hf_json_tokenizer("/nonexistent/tokenizer.json"), std::runtime_error);
}

// REQ: WRK-D3
TEST(TokenizerUnit, ChatMlTemplateAndRefusals) {
  const Tokenizer& qwen = test::tokenizer_for(qwen2_path());
  EXPECT_EQ(apply_chat_template(qwen, "Write a haiku"),
            "<|im_start|>user\nWrite a haiku<|im_end|>\n<|im_start|>assistant\n");
  const auto ids = qwen.encode(apply_chat_template(qwen, "Hi"), true, true);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 1);
  // stories260K carries no template.
  EXPECT_THROW(apply_chat_template(test::tokenizer_for(stories_path()), "x"), std::runtime_error);
  // A non-ChatML template is refused.
  VocabSpec spec = tiny_bpe_spec();
  spec.chat_template = "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}";
  BpeTokenizer other(spec);
  EXPECT_THROW(apply_chat_template(other, "x"), std::runtime_error);
}

// What a Utf8StreamDecoder emits for `ids`: one chunk per pushed id, then the flush.
std::vector<std::string> stream_chunks(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  Utf8StreamDecoder dec(tok);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(dec.push(id));
  chunks.push_back(dec.flush());
  return chunks;
}

std::string concat(const std::vector<std::string>& chunks) {
  std::string all;
  for (const auto& c : chunks) all += c;
  return all;
}

bool whole_utf8(const std::string& s) {
  return utf8::is_valid(s);
}

// D7: a streaming decoder never emits a partial UTF-8 sequence.
// REQ: WRK-D7 M0-W-1362
TEST(TokenizerUnit, StreamDecoderEmitsOnlyWholeUtf8) {
  const Tokenizer& tok = test::tokenizer_for(qwen2_path());
  const std::string text =
      "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦀🧬 中文ꙮ ok 👨‍👩‍👧 𓀀𓀁";
  const auto ids = tok.encode(text, false, false);
  size_t partial_pieces = 0;
  for (int32_t id : ids) partial_pieces += !utf8::is_valid(tok.token_to_piece(id));
  ASSERT_GT(partial_pieces, 0u) << "the text must contain tokens that split UTF-8 sequences";
  const auto chunks = stream_chunks(tok, ids);
  EXPECT_THAT(chunks, Each(Truly(whole_utf8)));
  EXPECT_EQ(concat(chunks), text);
}

// Random texts through both byte-level and SPM vocabularies: every chunk is whole UTF-8 and
// the chunks add up to the full decode.
// REQ: WRK-D7 M0-W-1362
TEST(TokenizerUnit, StreamDecoderRandomTextsConcatenateToDecode) {
  test::RandomText gen(test::test_seed());
  for (const std::string& path : {qwen2_path(), stories_path()}) {
    const Tokenizer& tok = test::tokenizer_for(path);
    for (int i = 0; i < 300; ++i) {
      const std::string text = gen.next();
      const auto ids = tok.encode(text, false, false);
      const auto chunks = stream_chunks(tok, ids);
      SCOPED_TRACE(path + ": " + nlohmann::json(text).dump());
      ASSERT_THAT(chunks, Each(Truly(whole_utf8)));
      std::string pieces;
      for (int32_t id : ids) pieces += tok.token_to_piece(id);
      EXPECT_EQ(concat(chunks), pieces);
    }
  }
}

// REQ: WRK-D7 M0-W-1362
TEST(TokenizerUnit, StreamDecoderReplacesInvalidBytes) {
  const Tokenizer& tok = test::tokenizer_for(qwen2_path());
  // Byte tokens: 0xE4 alone (an incomplete 3-byte lead), 0xFF (never valid), then 'A'.
  // Byte-level vocabularies hold one token per byte (its GPT-2 image).
  const auto& vocab = dynamic_cast<const VocabTokenizer&>(tok).vocab();
  const auto id_of_byte = [&](uint8_t b) {
    const int32_t id = vocab.find(unicode::byte_to_unicode(b));
    EXPECT_GE(id, 0);
    EXPECT_EQ(tok.token_to_piece(id), std::string(1, static_cast<char>(b)));
    return id;
  };
  Utf8StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(id_of_byte(0xE4)), "");  // held: may still complete
  EXPECT_EQ(dec.push(id_of_byte(0xFF)), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(dec.push(id_of_byte('A')), "A");
  EXPECT_EQ(dec.push(id_of_byte(0xE4)), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.flush(), "");
}

struct CliRun {
  int status;
  std::string out, err;
};

// tokenizer_cli_main as the worker-orcd binary would run it, capturing what it prints.
CliRun run_cli(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int status = tokenizer_cli_main(static_cast<int>(argv.size()), argv.data());
  std::string out = testing::internal::GetCapturedStdout();
  return {status, std::move(out), testing::internal::GetCapturedStderr()};
}

// REQ: M0-W-1363
TEST(TokenizerUnit, CliTokenizeAndDetokenize) {
  const std::string model = qwen2_path();
  test::tokenizer_for(model);  // fails loudly when missing
  CliRun r = run_cli({"tokenize", "--model", model, "--specials", "<|im_start|>Hello world"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[151644, 9707, 1879]\n");

  r = run_cli({"detokenize", "--model", model, "9707", "1879"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "Hello world\n");

  r = run_cli({"detokenize", "--model", model, "999999"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("999999"));

  r = run_cli({"tokenize", "--model", "/nonexistent.gguf", "x"});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent.gguf"));
}

}  // namespace
}  // namespace worker
