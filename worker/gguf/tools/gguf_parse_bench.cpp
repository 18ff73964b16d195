// Measures how long opening a GGUF file takes (mmap + header/metadata/tensor-info parse +
// config + shape-checked binding) and prints the model summary.
//
//   gguf_parse_bench FILE [REPEATS]
// Tensor bytes are never read: the mapping is parsed in place (M0-W-1221), so the time
// depends on the metadata (the 151k-token vocabulary), not the 1 GB of weights.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gguf/model_config.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gguf_parse_bench FILE [REPEATS]\n");
    return 2;
  }
  const int repeats = argc > 2 ? std::max(1, std::stoi(argv[2])) : 10;
  std::vector<double> ms;
  std::shared_ptr<const worker::Model> m;
  try {
    for (int i = 0; i < repeats; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      m = worker::load_model(argv[1]);
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  } catch (const worker::GgufError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  const double first = ms.front();
  std::sort(ms.begin(), ms.end());
  const auto& c = m->config;
  std::printf(
      "{\"file\":\"%s\",\"bytes\":%zu,\"tensors\":%zu,\"metadata_keys\":%zu,\"arch\":\"%s\","
      "\"n_embd\":%lld,\"n_layer\":%lld,\"vocab\":%lld,\"quant_kind\":\"%s\",\"repeats\":%d,"
      "\"first_ms\":%.3f,\"median_ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%.3f}\n",
      argv[1], m->file->file_size(), m->file->tensors().size(), m->file->metadata().size(),
      c.arch_name.c_str(), static_cast<long long>(c.n_embd), static_cast<long long>(c.n_layer),
      static_cast<long long>(c.vocab_size), c.quant_kind.c_str(), repeats, first, ms[ms.size() / 2],
      ms.front(), ms.back());
  return 0;
}
