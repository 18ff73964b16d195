#pragma once
// Vocabulary data shared by the gguf-bpe, gguf-spm and hf-json tokenizers: token texts,
// attributes, special ids and llama.cpp's partitioning of text around special tokens.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace worker {

class GgufFile;

// Hash and equality for string-keyed maps looked up by std::string_view without a copy.
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Token types as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Token attributes (llama.cpp's llama_token_attr bits).
enum TokenAttr : uint32_t {
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
};

// Plain description of a vocabulary, from a GGUF file or built in memory (tests, tokenizer.json).
struct VocabSpec {
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SPM)
  std::string pre;    // tokenizer.ggml.pre (BPE pre-tokenizer name)
  std::vector<std::string> tokens;
  std::vector<float> scores;          // empty: all 0
  std::vector<int32_t> token_types;   // empty: all normal
  std::vector<std::string> merges;    // "left right", rank = index
  std::vector<uint32_t> extra_attrs;  // optional per-token TokenAttr bits ORed in (lstrip/rstrip)
  std::optional<int64_t> bos_id, eos_id, eot_id, eom_id, unk_id, sep_id, pad_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string name;           // general.name (llama.cpp keys a phi-3 quirk on it)
  std::string chat_template;  // tokenizer.chat_template
};

// Reads the tokenizer.* keys. Throws std::runtime_error naming the missing or bad key.
VocabSpec vocab_spec_from_gguf(const GgufFile& file);

// A piece of input text after special-token partitioning: either a special token id or a
// byte range of raw text.
struct Fragment {
  int32_t token = -1;  // >= 0: a special token
  size_t offset = 0;
  size_t length = 0;
};

class Vocab {
 public:
  // `spm` selects SentencePiece defaults (BOS 1, EOS 2, UNK 0, add BOS, space prefix) versus
  // byte-level BPE defaults, as llama.cpp's loader does.
  Vocab(VocabSpec spec, bool spm);

  int32_t size() const { return static_cast<int32_t>(text_.size()); }
  const std::string& text(int32_t id) const { return text_[static_cast<size_t>(id)]; }
  uint32_t attr(int32_t id) const { return attr_[static_cast<size_t>(id)]; }
  float score(int32_t id) const { return score_[static_cast<size_t>(id)]; }
  bool valid(int32_t id) const { return id >= 0 && id < size(); }
  // Id of the token with exactly this text (the last one if repeated), or -1.
  int32_t find(std::string_view text) const;

  std::optional<int32_t> bos() const { return bos_; }
  std::optional<int32_t> eos() const { return eos_; }
  std::optional<int32_t> unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  const VocabSpec& spec() const { return spec_; }

  // llama.cpp's tokenizer_st_partition: splits `text` around special tokens (control and
  // unknown tokens only when parse_special; user-defined tokens always), longest first.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

  void set_clean_spaces(bool v) { clean_spaces_ = v; }
  bool clean_spaces() const { return clean_spaces_; }
  void set_add_bos(bool v) { add_bos_ = v; }

 private:
  VocabSpec spec_;
  std::vector<std::string> text_;
  std::vector<uint32_t> attr_;
  std::vector<float> score_;
  std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> index_;
  std::vector<int32_t> specials_;  // partition order: longest text first
  // Bytes some special token's text starts with (every byte when one is empty): a text
  // without any of them holds no special token, and partition() returns it whole.
  std::array<bool, 256> special_first_byte_{};
  std::vector<int32_t> eog_;
  std::optional<int32_t> bos_, eos_, unk_;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false, clean_spaces_ = false;
};

}  // namespace worker
