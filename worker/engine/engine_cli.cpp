#include "engine/engine_cli.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/engine.h"
#include "engine/generation.h"
#include "engine/parity/logits_record.h"
#include "tokenizer/tokenizer.h"

namespace worker {
namespace {

struct CliArgs {
  std::string model, backend = "cpu", prompt, log_logits, dump_checkpoints, job_id = "cli";
  std::vector<int32_t> tokens;
  bool have_tokens = false, have_prompt = false, chat = false, all_logits = false;
  bool ignore_eos = false;
  std::string kv_cache = "f16";  // both backends' default (--kv-cache)
  int32_t n = 64, ctx = 0, gpu = 0;
  size_t log_values = std::numeric_limits<size_t>::max();
  SamplingParams sampling;
};

const char* kUsage =
    "usage: worker-orcd generate --model F [--backend cpu|cuda] [--tokens 1,2,3 | --prompt "
    "TEXT [--chat]] [--n 64] [--temp 0] [--seed S] [--top-k K] [--top-p P] [--min-p P] "
    "[--repeat-penalty R] [--ctx N] [--gpu N] [--ignore-eos] [--log-logits FILE "
    "[--log-values N] [--all-logits]] [--dump-checkpoints FILE] [--kv-cache f16|f32] [--job-id "
    "ID]\n";

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string part = s.substr(i, j - i);
    if (!part.empty()) ids.push_back(static_cast<int32_t>(std::stol(part)));
    i = j + 1;
  }
  return ids;
}

CliArgs parse(int argc, char** argv) {
  CliArgs a;
  a.sampling.temperature = 0.0f;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--model")
      a.model = val();
    else if (k == "--backend")
      a.backend = val();
    else if (k == "--tokens")
      a.tokens = parse_ids(val()), a.have_tokens = true;
    else if (k == "--prompt")
      a.prompt = val(), a.have_prompt = true;
    else if (k == "--chat")
      a.chat = true;
    else if (k == "--n")
      a.n = std::stoi(val());
    else if (k == "--temp")
      a.sampling.temperature = std::stof(val());
    else if (k == "--seed")
      a.sampling.seed = std::stoull(val());
    else if (k == "--top-k")
      a.sampling.top_k = std::stoi(val());
    else if (k == "--top-p")
      a.sampling.top_p = std::stof(val());
    else if (k == "--min-p")
      a.sampling.min_p = std::stof(val());
    else if (k == "--repeat-penalty")
      a.sampling.repetition_penalty = std::stof(val());
    else if (k == "--ctx")
      a.ctx = std::stoi(val());
    else if (k == "--gpu")
      a.gpu = std::stoi(val());
    else if (k == "--ignore-eos")
      a.ignore_eos = true;
    else if (k == "--log-logits")
      a.log_logits = val();
    else if (k == "--log-values")
      a.log_values = std::stoull(val());
    else if (k == "--all-logits")
      a.all_logits = true;
    else if (k == "--dump-checkpoints")
      a.dump_checkpoints = val();
    else if (k == "--kv-cache")
      a.kv_cache = kv_cache_arg(val());
    else if (k == "--job-id")
      a.job_id = val();
    else
      throw std::invalid_argument("unknown argument '" + k + "'");
  }
  if (a.model.empty()) throw std::invalid_argument("--model is required");
  if (a.have_tokens == a.have_prompt)
    throw std::invalid_argument("give exactly one of --tokens and --prompt");
  if (a.have_tokens && a.tokens.empty()) throw std::invalid_argument("--tokens is empty");
  if (a.n < 0) throw std::invalid_argument("--n must be >= 0");
  if (!a.dump_checkpoints.empty() && a.backend != "cpu")
    throw std::invalid_argument("--dump-checkpoints is implemented by the cpu backend only");
  return a;
}

double ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int engine_cli_main(int argc, char** argv) {
  CliArgs a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "generate: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    auto model = load_model(a.model);
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = make_tokenizer(*model->file);
    } catch (const std::exception& e) {
      if (a.have_prompt) throw;
      std::cerr << "generate: no tokenizer (" << e.what() << "); ids only\n";
    }
    const std::vector<int32_t> prompt =
        a.have_prompt ? tokenize_prompt(*tok, a.prompt, a.chat) : a.tokens;
    if (prompt.empty()) throw WorkerError(ErrorCode::InvalidRequest, "empty prompt");
    const int32_t ctx = a.ctx > 0 ? a.ctx : static_cast<int32_t>(prompt.size()) + a.n + 1;
    std::ofstream ckpt;
    std::unique_ptr<Engine> engine;
    CpuEngineOptions cpu_options;
    cpu_options.kv_f16 = a.kv_cache == "f16";
    if (!a.dump_checkpoints.empty()) {
      ckpt.open(a.dump_checkpoints);
      if (!ckpt) throw WorkerError(ErrorCode::Internal, "cannot open " + a.dump_checkpoints);
      // One D16-shaped record per layer checkpoint and token (every value).
      engine = make_cpu_engine(
          model, ctx,
          [&](std::string_view name, int layer, int32_t pos, std::span<const float> v) {
            const std::string cp = layer < 0
                                       ? std::string(name)
                                       : "blk." + std::to_string(layer) + "." + std::string(name);
            ckpt << nlohmann::json{{"checkpoint", cp},
                                   {"job_id", a.job_id},
                                   {"token_idx", pos},
                                   {"dtype", "f32"},
                                   {"shape", {v.size()}},
                                   {"values", std::vector<float>(v.begin(), v.end())}}
                        .dump()
                 << '\n';
          },
          cpu_options);
    } else {
      engine = make_engine(a.backend, model, ctx, a.gpu, false, a.kv_cache);
    }

    std::ofstream log;
    if (!a.log_logits.empty()) {
      log.open(a.log_logits);
      if (!log) throw WorkerError(ErrorCode::Internal, "cannot open " + a.log_logits);
    }
    auto log_pos = [&](std::span<const float> l, int64_t idx) {
      if (log.is_open())
        log << parity::logits_record(l, "logits", a.job_id, idx, a.log_values).dump() << '\n';
    };

    const auto t0 = std::chrono::steady_clock::now();
    const bool all = a.all_logits && log.is_open();
    engine->eval(prompt, all);
    if (all) {
      for (size_t i = 0; i < prompt.size(); ++i)
        log_pos(engine->logits_at(i), static_cast<int64_t>(i));
    } else {
      log_pos(engine->logits(), static_cast<int64_t>(prompt.size()) - 1);
    }
    const auto t1 = std::chrono::steady_clock::now();
    std::mt19937_64 rng(a.sampling.seed);
    std::vector<int32_t> out;
    std::string stop_reason = "max_tokens";
    int decode_evals = 0;
    for (int32_t i = 0; i < a.n; ++i) {
      const int32_t id = engine->sample(a.sampling, out, rng);
      out.push_back(id);
      if (!a.ignore_eos && tok && tok->is_eog(id)) {
        stop_reason = "eos";
        break;
      }
      if (i + 1 == a.n) break;
      engine->eval(std::span<const int32_t>(&out.back(), 1));
      ++decode_evals;
      log_pos(engine->logits(), static_cast<int64_t>(prompt.size()) + i);
    }
    const auto t2 = std::chrono::steady_clock::now();

    nlohmann::json j = {
        {"backend", a.backend},
        {"model", a.model},
        {"prompt_tokens", prompt},
        {"tokens", out},
        {"stop_reason", stop_reason},
        {"prefill_ms", ms(t1 - t0)},
        {"decode_ms", ms(t2 - t1)},
        {"decode_tok_per_s", decode_evals > 0 ? decode_evals / (ms(t2 - t1) / 1000.0) : 0.0}};
    if (tok) j["text"] = tok->decode(out);
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    return 0;
  } catch (const WorkerError& e) {
    std::cerr << "generate: " << error_code_name(e.code()) << ": " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "generate: " << e.what() << "\n";
  }
  return 1;
}

}  // namespace worker
