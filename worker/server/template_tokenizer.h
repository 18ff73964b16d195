#pragma once
// A prompt that already holds chat markup (the ChatML that /v1/chat/completions builds for
// system + multi-turn conversations) must be tokenized with special tokens parsed, as the
// single-turn template is. generate() tokenizes `chat: false` prompts without parsing
// specials, so such jobs run with this view of the tokenizer, which parses them.
#include "tokenizer/tokenizer.h"

namespace worker::server {

class TemplatedPromptTokenizer final : public Tokenizer {
 public:
  explicit TemplatedPromptTokenizer(const Tokenizer& inner) : inner_(inner) {}
  std::string kind() const override { return inner_.kind(); }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool) const override {
    return inner_.encode(text, add_special, true);
  }
  std::string token_to_piece(int32_t id, bool special) const override {
    return inner_.token_to_piece(id, special);
  }
  std::string decode(const std::vector<int32_t>& ids, bool special) const override {
    return inner_.decode(ids, special);
  }
  std::optional<int32_t> bos_id() const override { return inner_.bos_id(); }
  std::optional<int32_t> eos_id() const override { return inner_.eos_id(); }
  bool is_eog(int32_t id) const override { return inner_.is_eog(id); }
  bool add_bos() const override { return inner_.add_bos(); }
  std::string chat_template() const override { return inner_.chat_template(); }

 private:
  const Tokenizer& inner_;
};

}  // namespace worker::server
