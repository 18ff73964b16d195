// libFuzzer target for the GGUF reader: any input must either parse or throw GgufError;
// a crash, hang, sanitizer report or another exception type is a bug. When it parses, the
// config reader and weight binder run too, and every tensor's bytes are touched so a wrong
// bounds check shows up as an ASan report.
#include <cstddef>
#include <cstdint>

#include "gguf/gguf_file.h"
#include "gguf/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = worker::GgufFile::from_memory(data, size, "<fuzz>");
    volatile uint8_t sink = 0;
    for (const auto& t : f->tensors()) {
      if (t.nbytes) sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
    }
    try {
      auto cfg = worker::read_model_config(*f);
      (void)worker::bind_model_weights(*f, cfg);
    } catch (const worker::GgufError&) {
    }
  } catch (const worker::GgufError&) {
  }
  return 0;
}
