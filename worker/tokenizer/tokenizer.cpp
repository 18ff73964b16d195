#include "tokenizer/tokenizer.h"

#include <stdexcept>

#include "common/utf8.h"
#include "gguf/gguf_file.h"
#include "tokenizer/vocab_tokenizers.h"

namespace worker {
namespace {

std::string sanitize_utf8(std::string_view s) {
  if (utf8::is_valid(s)) return std::string(s);
  std::string out;
  for (uint32_t cp : utf8::decode_lossy(s)) utf8::append(out, cp);
  return out;
}

}  // namespace

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, special);
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const GgufFile& file,
                                          const std::string& tokenizer_json_path) {
  if (!tokenizer_json_path.empty()) return load_hf_json_tokenizer(tokenizer_json_path);
  VocabSpec spec = vocab_spec_from_gguf(file);
  if (spec.model == "gpt2") return std::make_unique<BpeTokenizer>(std::move(spec));
  if (spec.model == "llama") return std::make_unique<SpmTokenizer>(std::move(spec));
  throw std::runtime_error("unsupported tokenizer model tokenizer.ggml.model = '" + spec.model +
                           "' (supported: gpt2 -> gguf-bpe, llama -> gguf-spm; or pass "
                           "--tokenizer tokenizer.json for hf-json)");
}

std::string apply_chat_template(const Tokenizer& tok, std::string_view user_message) {
  const std::string tmpl = tok.chat_template();
  if (tmpl.empty()) {
    throw std::runtime_error(
        "the model has no chat template (tokenizer.chat_template); chat requests are not "
        "supported for it");
  }
  if (tmpl.find("<|im_start|>") == std::string::npos) {
    throw std::runtime_error(
        "the model's chat template is not ChatML (no <|im_start|>); only ChatML templates are "
        "supported");
  }
  std::string out = "<|im_start|>user\n";
  out.append(user_message);
  out += "<|im_end|>\n<|im_start|>assistant\n";
  return out;
}

std::string Utf8StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_to_piece(id, false);
  const size_t n = utf8::complete_prefix_len(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string Utf8StreamDecoder::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace worker
