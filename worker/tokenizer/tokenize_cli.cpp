#include "tokenizer/tokenize_cli.h"

#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace worker {
namespace {

int usage() {
  std::fputs(
      "usage: worker-orcd tokenize --model FILE [--tokenizer tokenizer.json] [--specials] "
      "[--no-bos] TEXT\n"
      "       worker-orcd detokenize --model FILE [--tokenizer tokenizer.json] [--specials] "
      "ID...\n",
      stderr);
  return 2;
}

}  // namespace

int tokenizer_cli_main(int argc, char** argv) {
  if (argc < 1) return usage();
  const bool tokenize = std::strcmp(argv[0], "tokenize") == 0;
  if (!tokenize && std::strcmp(argv[0], "detokenize") != 0) return usage();
  std::string model, tokenizer_json;
  bool specials = false, no_bos = false;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--model" || a == "-m") && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--tokenizer" && i + 1 < argc) {
      tokenizer_json = argv[++i];
    } else if (a == "--specials") {
      specials = true;
    } else if (a == "--no-bos") {
      no_bos = true;
    } else if (a == "--") {
      for (++i; i < argc; ++i) rest.emplace_back(argv[i]);
    } else if (a.size() > 1 && a[0] == '-' && a[1] == '-') {
      std::fprintf(stderr, "worker-orcd %s: unknown option %s\n", argv[0], a.c_str());
      return usage();
    } else {
      rest.push_back(a);
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "worker-orcd %s: --model is required\n", argv[0]);
    return usage();
  }
  try {
    const auto file = GgufFile::open(model);
    const auto tok = make_tokenizer(*file, tokenizer_json);
    if (tokenize) {
      if (rest.size() != 1) {
        std::fputs("worker-orcd tokenize: give exactly one TEXT argument\n", stderr);
        return usage();
      }
      const std::vector<int32_t> ids = tok->encode(rest[0], !no_bos, specials);
      std::string out = "[";
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(ids[i]);
      }
      out += "]\n";
      std::fputs(out.c_str(), stdout);
    } else {
      std::vector<int32_t> ids;
      for (const std::string& s : rest) {
        int32_t v = 0;
        const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size() || v < 0 || v >= tok->vocab_size()) {
          std::fprintf(stderr, "worker-orcd detokenize: bad token id '%s' (vocabulary size %d)\n",
                       s.c_str(), tok->vocab_size());
          return 2;
        }
        ids.push_back(v);
      }
      const std::string text = tok->decode(ids, specials);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker-orcd %s: %s\n", argv[0], e.what());
    return 1;
  }
  return 0;
}

}  // namespace worker
