// decode_bench: engine-level speed (no HTTP) per model and numerics: decode tok/s at a context
// depth, prompt tok/s, the same as sweeps over depth and prompt length, achieved GB/s and a hash
// of the final logits (speed and determinism at one glance).
//
//   decode_bench --model A.gguf [--model B.gguf ...] [--backend cuda|cpu] [--decode 256]
//                [--prefill 512] [--reps 3] [--numerics exact|fast|both] [--graph on|off|both]
//                [--ctx-sweep 128,256,...] [--len-sweep 32,64,...] [--sweep-decode 64] [--json]
//
// Decode at depth d: a prompt of d random ids (the --prefill one), then --decode steps of
// eval(1 token) + greedy sample (on the GPU for cuda, one id copied back; sample_and_continue,
// which queues the sampled token's step before the id returns): what the worker's
// generation loop does per token. Times are medians over --reps runs after a warm-up run,
// host clock around calls that synchronize. --json prints one JSON object per line and
// (model, numerics, graph) instead of the table; bench/bench.py reads it. --graph off launches
// the per-op step (past the persistent step's keys) directly instead of from its CUDA graph; the
// persistent step is launched directly either way.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu/cpu_engine.h"
#include "gguf/model_config.h"
#ifdef WORKER_HAVE_CUDA
#include "cuda/cuda_engine.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

uint64_t fnv1a(std::span<const float> v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(std::stoi(s.substr(i, j - i)));
    i = j + 1;
  }
  return out;
}

// Bytes of weights one decode step reads: every tensor once, except the embedding table when
// it is not also the LM head (then only one row of it is read).
uint64_t decode_weight_bytes(const worker::Model& m) {
  const auto& w = m.weights;
  std::set<const worker::TensorInfo*> seen;
  uint64_t total = 0;
  auto add = [&](const worker::TensorInfo* t) {
    if (t != nullptr && seen.insert(t).second) total += t->nbytes;
  };
  add(w.output_norm);
  add(w.output);
  for (const auto& l : w.layers)
    for (const worker::TensorInfo* t : {l.attn_norm, l.wq, l.wk, l.wv, l.bq, l.bk, l.bv, l.wo,
                                        l.ffn_norm, l.w_gate, l.w_up, l.w_down})
      add(t);
  if (seen.count(w.token_embd) == 0) total += w.token_embd->nbytes / w.token_embd->rows();
  return total;
}

struct Mode {
  std::string backend;
  bool exact = true, graph = true;
};

std::unique_ptr<worker::Engine> make(const std::shared_ptr<const worker::Model>& model,
                                     const Mode& m, int ctx) {
  if (m.backend == "cpu") {
    worker::CpuEngineOptions o;
    o.kv_f16 = true;  // the FP16 cache the product (and the cuda exact path) uses
    return worker::make_cpu_engine(model, ctx, nullptr, o);
  }
#ifdef WORKER_HAVE_CUDA
  worker::CudaEngineOptions opt;
  opt.use_graph = m.graph;
  opt.exact = m.exact;
  return worker::make_cuda_engine(model, ctx, 0, opt);
#else
  std::fprintf(stderr, "decode_bench: built without CUDA; use --backend cpu\n");
  std::exit(2);
#endif
}

class Bench {
 public:
  Bench(std::shared_ptr<const worker::Model> model, const Mode& mode, int ctx)
      : model_(std::move(model)), e_(make(model_, mode, ctx)), rng_(1) {}

  std::vector<int32_t> prompt(int n) {
    std::uniform_int_distribution<int32_t> tok(0,
                                               static_cast<int32_t>(model_->config.vocab_size - 1));
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = tok(rng_);
    return p;
  }
  // ms for a prompt of n tokens from an empty cache.
  double prefill_ms(const std::vector<int32_t>& p) {
    e_->reset();
    const auto t0 = Clock::now();
    e_->eval(p);
    return ms_since(t0);
  }
  // ms per token of n greedy decode steps after the prompt p.
  double decode_ms(const std::vector<int32_t>& p, int n) {
    e_->reset();
    e_->eval(p);
    worker::SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::vector<int32_t> hist;
    std::mt19937_64 srng(7);
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      // as the generation loop: the step of the sampled token starts before the id returns
      const int32_t id = e_->sample_and_continue(greedy, hist, srng);
      hist.push_back(id);
      e_->eval(std::span<const int32_t>(&id, 1));
    }
    return ms_since(t0) / n;
  }
  uint64_t hash() const { return fnv1a(e_->logits()); }
  worker::VramUsage vram() const { return e_->vram(); }
  int n_ctx() const { return e_->n_ctx(); }

 private:
  std::shared_ptr<const worker::Model> model_;
  std::unique_ptr<worker::Engine> e_;
  std::mt19937 rng_;
};

template <typename F>
double median_of(int reps, F f) {
  (void)f();  // warm-up (graph capture, cuBLAS handles, page faults)
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) v.push_back(f());
  return median(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<bool> exacts = {true, false}, graphs = {true, false};
  std::string backend = "cuda";
  int n_decode = 256, n_prefill = 512, reps = 3, sweep_decode = 64;
  std::vector<int> ctx_sweep, len_sweep;
  bool json = false, graph_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") {
      models.push_back(next());
    } else if (a == "--backend") {
      backend = next();
    } else if (a == "--decode") {
      n_decode = std::stoi(next());
    } else if (a == "--prefill") {
      n_prefill = std::stoi(next());
    } else if (a == "--reps") {
      reps = std::stoi(next());
    } else if (a == "--sweep-decode") {
      sweep_decode = std::stoi(next());
    } else if (a == "--ctx-sweep") {
      ctx_sweep = parse_list(next());
    } else if (a == "--len-sweep") {
      len_sweep = parse_list(next());
    } else if (a == "--json") {
      json = true;
    } else if (a == "--numerics" || a == "--graph") {
      const std::string m = next();
      const bool num = a == "--numerics";
      graph_given |= !num;
      if (m == (num ? "exact" : "on"))
        (num ? exacts : graphs) = {true};
      else if (m == (num ? "fast" : "off"))
        (num ? exacts : graphs) = {false};
      else if (m != "both") {
        std::fprintf(stderr, "%s\n", num ? "--numerics exact|fast|both" : "--graph on|off|both");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: decode_bench --model F.gguf [...] [--backend cuda|cpu] [--decode N] "
                   "[--prefill N] [--reps N] [--numerics exact|fast|both] [--graph on|off|both] "
                   "[--ctx-sweep a,b,..] [--len-sweep a,b,..] [--sweep-decode N] [--json]\n");
      return 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "decode_bench: no --model given\n");
    return 2;
  }
  if (backend != "cuda" && backend != "cpu") {
    std::fprintf(stderr, "decode_bench: --backend cuda|cpu\n");
    return 2;
  }
  if (backend == "cpu") exacts = {true}, graphs = {false};  // one cpu path
  if (json && !graph_given) graphs = {graphs.front()};      // the product's setting
  if (!json)
    std::printf("%-28s %-6s %-6s %10s %9s %9s %12s %10s %18s\n", "model", "exact", "graph",
                "decode", "ms/tok", "GB/s", "prefill", "VRAM MiB", "logits hash");
  for (const auto& path : models) {
    auto model = worker::load_model(path);
    const auto& c = model->config;
    const uint64_t wbytes = decode_weight_bytes(*model);
    const std::string name = path.substr(path.find_last_of('/') + 1);
    for (const bool exact : exacts)
      for (const bool graph : graphs) {
        int ctx = n_prefill + n_decode + 8;
        for (int d : ctx_sweep) ctx = std::max(ctx, d + sweep_decode + 8);
        for (int l : len_sweep) ctx = std::max(ctx, l + 8);
        Bench b(model, Mode{backend, exact, graph}, ctx);
        const auto p = b.prompt(n_prefill);
        const double pre = median_of(reps, [&] { return b.prefill_ms(p); });
        const double dec = median_of(reps, [&] { return b.decode_ms(p, n_decode); });
        const uint64_t hash = b.hash();  // after the prompt and n_decode greedy steps
        // Bytes one decode step reads: the weights plus the KV cache at the mean position of
        // the timed decode (FP16 entries; F32 for the cpu reference's copy is not counted).
        const double mean_pos = n_prefill + n_decode / 2.0;
        const double kv = 2.0 * static_cast<double>(c.n_layer) * mean_pos *
                          static_cast<double>(c.n_head_kv * c.head_dim) * 2.0;
        const double gbs = (static_cast<double>(wbytes) + kv) / (dec * 1e-3) / 1e9;
        char hex[24];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
        if (!json) {
          std::printf("%-28s %-6s %-6s %7.1f t/s %9.3f %9.0f %8.0f t/s %10.1f %s\n", name.c_str(),
                      exact ? "yes" : "no", graph ? "yes" : "no", 1000.0 / dec, dec, gbs,
                      n_prefill / (pre * 1e-3), static_cast<double>(b.vram().total()) / 1048576.0,
                      hex);
          std::fflush(stdout);
          continue;
        }
        nlohmann::json dvc = nlohmann::json::array(), pvl = nlohmann::json::array();
        for (int d : ctx_sweep) {
          if (d + sweep_decode > b.n_ctx()) {  // past the model's training context
            std::fprintf(stderr, "  %s: depth %d skipped (context %d)\n", name.c_str(), d,
                         b.n_ctx());
            continue;
          }
          const auto pd = b.prompt(d);
          const double ms =
              median_of(std::max(1, reps / 2), [&] { return b.decode_ms(pd, sweep_decode); });
          dvc.push_back({{"ctx", d}, {"tok_s", 1000.0 / ms}});
          std::fprintf(stderr, "  %s %s decode @ %d: %.1f tok/s\n", name.c_str(),
                       exact ? "exact" : "fast", d, 1000.0 / ms);
        }
        for (int l : len_sweep) {
          const auto pl = b.prompt(l);
          const double ms = median_of(reps, [&] { return b.prefill_ms(pl); });
          pvl.push_back({{"len", l}, {"tok_s", l / (ms * 1e-3)}});
        }
        nlohmann::json j = {{"model", name},
                            {"path", path},
                            {"backend", backend},
                            {"numerics", exact ? "exact" : "fast"},
                            {"graph", graph},
                            {"weight_bytes", wbytes},
                            {"decode_depth", n_prefill},
                            {"decode_tokens", n_decode},
                            {"decode_tok_s", 1000.0 / dec},
                            {"decode_ms_per_tok", dec},
                            {"decode_gbs", gbs},
                            {"prompt_len", n_prefill},
                            {"prompt_tok_s", n_prefill / (pre * 1e-3)},
                            {"logits_hash", hex},
                            {"vram_bytes", b.vram().total()},
                            {"decode_vs_ctx", dvc},
                            {"prompt_vs_len", pvl}};
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
  }
  return 0;
}
