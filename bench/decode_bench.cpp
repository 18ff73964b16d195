// decode_bench: decode tok/s with and without CUDA-graph replay, prefill tok/s, achieved
// GB/s and a hash of the final logits (speed and determinism at one glance), per model.
//
//   decode_bench --model A.gguf [--model B.gguf ...] [--decode 256] [--prefill 512] [--reps 3]
//
// Decode step = eval(1 token) + GPU greedy sample (one id copied back): what the worker's
// generation loop does per token. Times are medians over --reps runs, host clock around
// calls that synchronize the stream.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_engine.h"
#include "gguf/model_config.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t fnv1a(std::span<const float> v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Result {
  double decode_ms = 0, prefill_ms = 0;
  uint64_t hash = 0;
  worker::VramUsage vram;
};

Result run(const std::shared_ptr<const worker::Model>& model, bool exact, bool graph, int n_decode,
           int n_prefill, int reps) {
  worker::CudaEngineOptions opt;
  opt.use_graph = graph;
  opt.exact = exact;
  const int ctx = n_prefill + n_decode + 8;
  auto e = worker::make_cuda_engine(model, ctx, 0, opt);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model->config.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(n_prefill));
  for (auto& t : prompt) t = tok(rng);
  worker::SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<double> pre, dec;
  Result r;
  for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms up (graph capture, cuBLAS)
    e->reset();
    auto t0 = Clock::now();
    e->eval(prompt);
    auto t1 = Clock::now();
    std::vector<int32_t> hist;
    std::mt19937_64 srng(7);
    for (int i = 0; i < n_decode; ++i) {
      const int32_t id = e->sample(greedy, hist, srng);
      hist.push_back(id);
      e->eval(std::span<const int32_t>(&id, 1));
    }
    auto t2 = Clock::now();
    if (rep > 0) {
      pre.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      dec.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count() / n_decode);
    }
    r.hash = fnv1a(e->logits());
  }
  r.prefill_ms = median(pre);
  r.decode_ms = median(dec);
  r.vram = e->vram();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<bool> modes = {true, false};  // exact, fast
  int n_decode = 256, n_prefill = 512, reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      models.push_back(next());
    else if (a == "--decode")
      n_decode = std::stoi(next());
    else if (a == "--prefill")
      n_prefill = std::stoi(next());
    else if (a == "--reps")
      reps = std::stoi(next());
    else if (a == "--numerics") {
      const std::string m = next();
      if (m == "exact")
        modes = {true};
      else if (m == "fast")
        modes = {false};
      else if (m != "both") {
        std::fprintf(stderr, "--numerics exact|fast|both\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: decode_bench --model F.gguf [...] [--decode N] [--prefill N] [--reps N] "
                   "[--numerics exact|fast|both]\n");
      return 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "decode_bench: no --model given\n");
    return 2;
  }
  std::printf("%-28s %-6s %-6s %10s %9s %9s %12s %10s %18s\n", "model", "exact", "graph", "decode",
              "ms/tok", "GB/s", "prefill", "VRAM MiB", "logits hash");
  for (const auto& path : models) {
    auto model = worker::load_model(path);
    const auto& c = model->config;
    for (const bool exact : modes)
      for (bool graph : {true, false}) {
        const Result r = run(model, exact, graph, n_decode, n_prefill, reps);
        // Bytes one decode step must read: every weight except the embedding rows not
        // looked up (the table is read whole only when it is also the LM head), plus the
        // KV cache at the mean position of the timed decode.
        uint64_t w = r.vram.weights;
        if (!c.tied_output) w -= model->weights.token_embd->nbytes;
        const double mean_pos = n_prefill + n_decode / 2.0;
        const double kv = 2.0 * static_cast<double>(c.n_layer) * mean_pos *
                          static_cast<double>(c.n_head_kv * c.head_dim) * (exact ? 4.0 : 2.0);
        const double gbs = (static_cast<double>(w) + kv) / (r.decode_ms * 1e-3) / 1e9;
        const std::string name = path.substr(path.find_last_of('/') + 1);
        std::printf("%-28s %-6s %-6s %7.1f t/s %9.3f %9.0f %8.0f t/s %10.1f %018llx\n",
                    name.c_str(), exact ? "yes" : "no", graph ? "yes" : "no", 1000.0 / r.decode_ms,
                    r.decode_ms, gbs, n_prefill / (r.prefill_ms * 1e-3),
                    static_cast<double>(r.vram.total()) / 1048576.0,
                    static_cast<unsigned long long>(r.hash));
        std::fflush(stdout);
      }
  }
  return 0;
}
