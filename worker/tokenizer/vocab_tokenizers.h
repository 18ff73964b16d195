#pragma once
// The concrete tokenizers: byte-level BPE (gguf-bpe, and hf-json on top of it) and
// SentencePiece-style (gguf-spm). All follow llama.cpp's llama_tokenize/llama_detokenize.
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace worker {

// Shared parts: ids, specials, token_to_piece dispatch and llama.cpp's detokenize.
class VocabTokenizer : public Tokenizer {
 public:
  int32_t vocab_size() const override { return vocab_.size(); }
  std::optional<int32_t> bos_id() const override { return vocab_.bos(); }
  std::optional<int32_t> eos_id() const override { return vocab_.eos(); }
  bool is_eog(int32_t id) const override { return vocab_.valid(id) && vocab_.is_eog(id); }
  bool add_bos() const override { return vocab_.add_bos(); }
  std::string chat_template() const override { return vocab_.spec().chat_template; }
  std::string token_to_piece(int32_t id, bool special = false) const override;
  // llama_detokenize(remove_special=false, unparse_special=special): the first piece loses
  // one leading space when the vocabulary adds a space prefix; BPE vocabularies with
  // clean_spaces get llama.cpp's space clean-up.
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const override;

  const Vocab& vocab() const { return vocab_; }

 protected:
  VocabTokenizer(VocabSpec spec, bool spm) : vocab_(std::move(spec), spm) {}
  // Piece of a normal (non-special, non-byte) token.
  virtual std::string normal_piece(int32_t id) const = 0;
  Vocab vocab_;
};

class BpeTokenizer : public VocabTokenizer {
 public:
  // Throws std::runtime_error for an unknown pre-tokenizer name or a vocabulary without merges.
  explicit BpeTokenizer(VocabSpec spec);
  std::string kind() const override { return kind_; }
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  PreTokenizer pre_tokenizer() const { return pre_; }

 protected:
  // For hf-json: a different kind name, a fixed pre-tokenizer and an optional normalizer
  // applied to each raw-text fragment.
  BpeTokenizer(VocabSpec spec, std::string kind, PreTokenizer pre,
               std::function<std::string(std::string_view)> normalizer);
  std::string normal_piece(int32_t id) const override;

 private:
  void init_ranks();
  // One pre-tokenized word's ids appended to `out`: from the word cache, else merged.
  void tokenize_word(const std::string& word, std::vector<int32_t>& out) const;
  void merge_word(const std::string& word, std::vector<int32_t>& out) const;
  // Rank of the merge of pair.substr(0, split) and pair.substr(split), -1 when none.
  int rank(std::string_view pair, size_t split) const;

  // A merge is keyed by its two sides written together and where the left one ends, so a
  // lookup hashes the adjacent symbols' text in place (no copy per candidate pair).
  struct MergeKey {
    std::string_view joined;
    size_t split;
  };
  struct MergeHash {
    using is_transparent = void;
    size_t operator()(const MergeKey& k) const noexcept {
      return std::hash<std::string_view>{}(k.joined) ^ (k.split * 0x9e3779b97f4a7c15ULL);
    }
    size_t operator()(const std::pair<std::string, size_t>& k) const noexcept {
      return (*this)(MergeKey{k.first, k.second});
    }
  };
  struct MergeEq {
    using is_transparent = void;
    static MergeKey view(const MergeKey& k) { return k; }
    static MergeKey view(const std::pair<std::string, size_t>& k) { return {k.first, k.second}; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const noexcept {
      const MergeKey x = view(a), y = view(b);
      return x.split == y.split && x.joined == y.joined;
    }
  };
  std::string kind_ = "gguf-bpe";
  PreTokenizer pre_ = PreTokenizer::kDefault;
  bool ignore_merges_ = false;
  std::function<std::string(std::string_view)> normalizer_;
  std::unordered_map<std::pair<std::string, size_t>, int, MergeHash, MergeEq> ranks_;

  // Words merged before: a word's ids depend on its text alone, and a server's prompts repeat
  // their words, while merging one costs a rank lookup per candidate pair (~1-2 us a word on
  // the Qwen2 vocabulary's 151k merges). Words up to kCacheWordBytes; emptied when it holds
  // kCacheWords (a few MB at most). HTTP threads tokenize concurrently: one mutex.
  static constexpr size_t kCacheWordBytes = 64;
  static constexpr size_t kCacheWords = 16384;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, TextHash, std::equal_to<>> cache_;
};

class SpmTokenizer : public VocabTokenizer {
 public:
  explicit SpmTokenizer(VocabSpec spec);
  std::string kind() const override { return "gguf-spm"; }
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override;

 protected:
  std::string normal_piece(int32_t id) const override;

 private:
  void tokenize_text(const std::string& text, std::vector<int32_t>& out) const;
  void push_bytes(std::string_view s, std::vector<int32_t>& out) const;
};

// hf-json: a Hugging Face tokenizer.json with a byte-level BPE model (see hf_json.cpp).
// tokenizer_config.json next to it, when present, gives BOS/EOS texts and the chat template.
// Throws std::runtime_error naming the file and the unsupported or malformed part.
std::unique_ptr<Tokenizer> load_hf_json_tokenizer(const std::string& path);
// The same from memory (tests, fuzzing); `path` only labels error messages.
std::unique_ptr<Tokenizer> load_hf_json_tokenizer_from_string(std::string_view content,
                                                              std::string_view config_json,
                                                              const std::string& path);

}  // namespace worker
