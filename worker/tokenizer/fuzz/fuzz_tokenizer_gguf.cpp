// libFuzzer target: arbitrary bytes as text through the gguf-bpe (qwen2 vocabulary) and
// gguf-spm (stories260K) tokenizers. The first byte picks tokenizer and flags.
#include <cstdint>
#include <cstdio>
#include <memory>

#include "fuzz_common.h"
#include "gguf/gguf_file.h"

namespace {

struct Loaded {
  std::shared_ptr<worker::GgufFile> file;
  std::unique_ptr<worker::Tokenizer> tok;
};

Loaded load(const std::string& path) {
  Loaded l;
  l.file = worker::GgufFile::open(path);
  l.tok = worker::make_tokenizer(*l.file);
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string src = WORKER_SOURCE_DIR;
  static const Loaded bpe =
      load(worker::fuzz::env_or("WORKER_LLAMA_SRC", src + "/.deps/llama.cpp") +
           "/models/ggml-vocab-qwen2.gguf");
  static const Loaded spm =
      load(worker::fuzz::env_or("WORKER_SHARED_FIXTURES", src + "/../shared/fixtures") +
           "/stories260K.gguf");
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const worker::Tokenizer& tok = (mode & 1) ? *spm.tok : *bpe.tok;
  worker::fuzz::exercise(tok, text, mode & 2, mode & 4);
  return 0;
}
