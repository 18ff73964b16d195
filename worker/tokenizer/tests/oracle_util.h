#pragma once
// Runs fixtures/tokenizer/oracle_tokenize.mjs (llama.cpp through node-llama-cpp) over a batch
// of texts. Throws (so the test fails loudly) when node or the oracle is missing.
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_paths.h"

namespace worker::test {

struct OracleResult {
  std::vector<int32_t> ids;
  std::string detok;
};

inline std::string run_capture(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  return out;
}

// The lines of `text` that are not empty, without their '\n'.
inline std::vector<std::string> nonempty_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    if (nl > pos) lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

// Runs the shell command `cmd` with `texts` on its stdin, one {"text": ...} JSON object a
// line (the input format of the node oracle scripts), and returns its stdout.
inline std::string run_over_texts(const std::string& cmd, const std::vector<std::string>& texts) {
  const auto tmp = std::filesystem::temp_directory_path() /
                   ("tok_texts_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream f(tmp, std::ios::binary);
    for (const auto& t : texts) f << nlohmann::json{{"text", t}}.dump() << "\n";
  }
  const std::string out = run_capture(cmd + " < '" + tmp.string() + "'");
  std::filesystem::remove(tmp);
  return out;
}

inline std::vector<OracleResult> llama_oracle(const std::string& model,
                                              const std::vector<std::string>& texts,
                                              bool specials) {
  if (run_capture("node --version 2>/dev/null").rfind("v", 0) != 0) {
    throw std::runtime_error(
        "node is not installed: the llama.cpp oracle (node-llama-cpp) needs it");
  }
  const std::string dir = source_dir() + "/fixtures/tokenizer";
  const std::string oracle_pkg = source_dir() + "/fixtures/oracle/node_modules/node-llama-cpp";
  if (!std::filesystem::exists(oracle_pkg)) {
    throw std::runtime_error("node-llama-cpp missing at " + oracle_pkg + " (run ci/setup.sh)");
  }
  const std::string cmd = "cd '" + dir + "' && node oracle_tokenize.mjs '" + model + "'" +
                          (specials ? " --specials" : "") + " 2>/dev/null";
  std::vector<OracleResult> res;
  for (const std::string& line : nonempty_lines(run_over_texts(cmd, texts))) {
    const auto j = nlohmann::json::parse(line);
    res.push_back(
        OracleResult{j["ids"].get<std::vector<int32_t>>(), j["detok"].get<std::string>()});
  }
  if (res.size() != texts.size()) {
    throw std::runtime_error("oracle returned " + std::to_string(res.size()) + " results for " +
                             std::to_string(texts.size()) + " texts: " + cmd);
  }
  return res;
}

inline uint64_t test_seed() {
  const char* s = std::getenv("WORKER_TOKENIZER_SEED");
  const uint64_t seed =
      s && *s ? std::stoull(s)
              : static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
  std::printf("tokenizer random-text seed: %llu (set WORKER_TOKENIZER_SEED to replay)\n",
              static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace worker::test
