#pragma once
// Tokenizers (D3, M0-W-1360..1365): ids must equal llama.cpp's for the same file and text.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace worker {

class GgufFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "gguf-bpe" | "gguf-spm" | "hf-json"
  virtual std::string kind() const = 0;
  virtual int32_t vocab_size() const = 0;

  // Tokenize like llama.cpp's llama_tokenize(text, add_special, parse_special):
  // add_special adds BOS (and EOS) as the vocabulary's add_bos/add_eos flags ask;
  // parse_special turns control/user-defined token texts (<|im_start|>...) into single ids.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;
  // The bytes one token stands for (byte-level mapping / SPM escapes undone). Control
  // tokens give "" unless `special` is true.
  virtual std::string token_to_piece(int32_t id, bool special = false) const = 0;
  // Concatenated pieces (llama.cpp's detokenize with remove_special=false, unparse_special=special)
  virtual std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // End-of-generation ids: EOS, EOT (<|im_end|>, <|endoftext|>, ...).
  virtual bool is_eog(int32_t id) const = 0;
  virtual bool add_bos() const = 0;
  // Chat template text from the model (tokenizer.chat_template), empty when none.
  virtual std::string chat_template() const { return {}; }
};

// Picks the backend from model metadata (M0-W-1360): `tokenizer.ggml.model` gpt2 ->
// gguf-bpe, llama -> gguf-spm; a non-empty tokenizer_json path -> hf-json.
// Throws std::runtime_error with a clear message for unsupported vocabularies.
std::unique_ptr<Tokenizer> make_tokenizer(const GgufFile& file,
                                          const std::string& tokenizer_json_path = {});

// Applies the model's chat template to one user turn and opens the assistant turn.
// Supported: ChatML (Qwen). Throws std::runtime_error when the model has no template this
// worker supports.
std::string apply_chat_template(const Tokenizer& tok, std::string_view user_message);

// Streaming detokenizer (D7): feed token ids one by one; returns only text ending on a
// complete UTF-8 sequence, holding incomplete bytes until the next token completes them.
class Utf8StreamDecoder {
 public:
  explicit Utf8StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // Invalid bytes in a token's piece are emitted as U+FFFD, so the output is always valid
  // UTF-8.
  std::string push(int32_t id);
  std::string flush();  // whatever is left, invalid bytes replaced by U+FFFD

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

}  // namespace worker
