#include "engine/verify_cli.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/sha256.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/receipt.h"
#include "gguf/model_config.h"
#include "tokenizer/tokenizer.h"

namespace worker {
namespace {
using nlohmann::json;

const char* kUsage = "usage: worker-orcd verify RECEIPT.json|STREAM.txt|- --model FILE.gguf\n";

std::string read_all(const std::string& path) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::invalid_argument("cannot read '" + path + "'");
    ss << f.rdbuf();
  }
  return ss.str();
}

// A JSON document, or the last `data:` line of an SSE capture that holds a receipt.
json parse_document(const std::string& text) {
  json doc = json::parse(text, nullptr, false);
  if (!doc.is_discarded()) return doc;
  std::istringstream in(text);
  json found;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data:", 0) != 0) continue;
    json j = json::parse(line.substr(5), nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("receipt")) found = std::move(j);
  }
  if (found.is_null())
    throw std::invalid_argument("neither a JSON document nor an SSE stream with a receipt");
  return found;
}

}  // namespace

int verify_cli_main(int argc, char** argv) {
  std::string receipt_path, model_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model_path = argv[++i];
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (receipt_path.empty() && (a == "-" || a.rfind("--", 0) != 0)) {
      receipt_path = a;
    } else {
      std::fprintf(stderr, "verify: unexpected argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (receipt_path.empty() || model_path.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  try {
    const json doc = parse_document(read_all(receipt_path));
    const json& receipt = find_receipt(doc);
    // The model's hash runs beside the replay (it reads the whole file once).
    auto model_hash = std::async(std::launch::async, [&] { return file_content_hash(model_path); });
    auto model = load_model(model_path);
    auto tok = make_tokenizer(*model->file);
    const json& eng = receipt.at("engine");
    CpuEngineOptions opt;
    opt.kv_f16 = eng.value("kv_cache", "") == "f16";
    const int32_t n_ctx = eng.value("n_ctx", 0);
    auto engine = make_cpu_engine(model, n_ctx, nullptr, opt);
    const auto t0 = std::chrono::steady_clock::now();
    const VerifyOutcome v =
        verify_receipt(receipt, *engine, *tok, model_hash.get(), [&](int64_t step, int64_t total) {
          if (!tty) return;
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const double rate = step / std::max(s, 1e-9);
          std::fprintf(stderr, "\rverify: step %lld/%lld  %.1f tok/s  ETA %.0f s   ",
                       static_cast<long long>(step), static_cast<long long>(total), rate,
                       static_cast<double>(total - step) / std::max(rate, 1e-9));
        });
    if (tty) std::fputs("\n", stderr);
    if (v.identical) {
      std::printf("identical: %lld steps replayed on the CPU reference (model %s)\n",
                  static_cast<long long>(v.steps_checked),
                  receipt.at("model").value("hash", "").c_str());
      return 0;
    }
    std::printf("DIFFERS: %s\n", v.problem.c_str());
    return 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "verify: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verify: %s\n", e.what());
  }
  return 2;
}

}  // namespace worker
