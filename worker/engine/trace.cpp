#include "engine/trace.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "common/errors.h"
#include "engine/generation.h"
#include "tokenizer/tokenizer.h"
#ifdef WORKER_HAVE_CUDA
#include "cuda/cuda_engine.h"
#endif

namespace worker {
namespace {

using Key = std::pair<int, std::string>;  // (layer, op)

// One engine's checkpoints of one eval: rows by position, ops in the order first reported.
struct Recording {
  std::vector<Key> order;
  std::map<Key, std::map<int32_t, std::vector<float>>> rows;
  void add(std::string_view name, int layer, int32_t pos, std::span<const float> v) {
    Key k{layer, std::string(name)};
    auto it = rows.find(k);
    if (it == rows.end()) {
      order.push_back(k);
      it = rows.emplace(k, std::map<int32_t, std::vector<float>>{}).first;
    }
    it->second[pos].assign(v.begin(), v.end());
  }
  void clear() {
    order.clear();
    rows.clear();
  }
};

std::unique_ptr<Engine> make_side(const std::string& spec, const std::shared_ptr<const Model>& m,
                                  int32_t ctx, const TraceOptions& o, bool is_b,
                                  CheckpointSink sink) {
  if (spec == "cpu") {
    CpuEngineOptions c = is_b ? o.perturb_b : CpuEngineOptions{};
    c.kv_f16 = o.kv_f16;
    return make_cpu_engine(m, ctx, std::move(sink), c);
  }
  if (spec != "cuda" && spec != "cuda:exact" && spec != "cuda:fast")
    throw std::invalid_argument("unknown engine '" + spec +
                                "' (cpu | cuda | cuda:exact | cuda:fast)");
#ifdef WORKER_HAVE_CUDA
  CudaEngineOptions c;
  c.exact = spec != "cuda:fast";
  c.kv_cache_f32 = !o.kv_f16;
  return make_cuda_engine(m, ctx, o.gpu, c, std::move(sink));
#else
  (void)m, (void)ctx, (void)o, (void)is_b, (void)sink;
  throw WorkerError(ErrorCode::CudaError,
                    "this worker was built without the CUDA backend: trace only cpu against cpu");
#endif
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Compares one op's rows (positions both sides report); fills `d` with the first difference.
bool compare_op(const std::map<int32_t, std::vector<float>>& a,
                const std::map<int32_t, std::vector<float>>& b, const Key& key, int step,
                TraceDiff& d) {
  bool found = false;
  int64_t row = 0;
  for (const auto& [pos, va] : a) {
    const auto it = b.find(pos);
    if (it == b.end()) {
      ++row;
      continue;
    }
    const auto& vb = it->second;
    if (va.size() != vb.size())
      throw std::runtime_error("op " + key.second + " of layer " + std::to_string(key.first) +
                               ": widths differ (" + std::to_string(va.size()) + " vs " +
                               std::to_string(vb.size()) + ")");
    for (size_t i = 0; i < va.size(); ++i) {
      if (bits(va[i]) == bits(vb[i])) continue;
      ++d.n_diff;
      const double ad = std::fabs(static_cast<double>(va[i]) - static_cast<double>(vb[i]));
      if (!(ad <= d.max_abs_diff)) d.max_abs_diff = ad;  // NaN and inf stay visible
      if (!found) {
        found = true;
        d.step = step;
        d.layer = key.first;
        d.op = key.second;
        d.pos = pos;
        d.index = static_cast<int64_t>(i);
        d.flat_index = row * static_cast<int64_t>(va.size()) + static_cast<int64_t>(i);
        d.a = va[i];
        d.b = vb[i];
      }
    }
    ++row;
  }
  return found;
}

int32_t argmax(std::span<const float> v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<int32_t>(best);
}

std::string fmt_value(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(f), bits(f));
  return buf;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) ids.push_back(static_cast<int32_t>(std::stol(s.substr(i, j - i))));
    i = j + 1;
  }
  return ids;
}

const char* kUsage =
    "usage: worker-orcd trace --model F (--prompt TEXT | --tokens 1,2,3) [--a cpu|cuda|cuda:exact|"
    "cuda:fast] [--b ...] [--kv-cache f16|f32] [--steps N] [--gpu N] [--perturb-b LAYER:OP:INDEX]\n"
    "  defaults: --a cpu --b cuda --kv-cache f16 --steps 2; --perturb-b (test only, b = cpu) "
    "moves\n"
    "  one value of B's op one ulp up to check the tracer itself\n";

}  // namespace

TraceResult run_trace(const TraceOptions& o) {
  if (o.tokens.empty()) throw std::invalid_argument("empty prompt");
  if (o.steps < 0) throw std::invalid_argument("--steps must be >= 0");
  if (!o.perturb_b.perturb_op.empty() && o.b != "cpu")
    throw std::invalid_argument("--perturb-b needs --b cpu");
  auto model = load_model(o.model);
  const int32_t ctx = static_cast<int32_t>(o.tokens.size()) + o.steps + 1;
  Recording ra, rb;
  auto ea = make_side(
      o.a, model, ctx, o, false,
      [&](std::string_view n, int l, int32_t p, std::span<const float> v) { ra.add(n, l, p, v); });
  auto eb = make_side(
      o.b, model, ctx, o, true,
      [&](std::string_view n, int l, int32_t p, std::span<const float> v) { rb.add(n, l, p, v); });
  TraceResult r;
  r.n_layers = static_cast<int>(model->config.n_layer);
  std::set<std::string> skipped;
  std::vector<int32_t> toks = o.tokens;
  for (int step = 0; step <= o.steps; ++step) {
    ra.clear();
    rb.clear();
    ea->eval(toks);
    eb->eval(toks);
    ++r.steps_run;
    for (const Key& k : ra.order) {
      const auto it = rb.rows.find(k);
      if (it == rb.rows.end()) {
        skipped.insert(k.second);
        continue;
      }
      ++r.ops_compared;
      TraceDiff d;
      if (compare_op(ra.rows.at(k), it->second, k, step, d)) {
        r.diff = d;
        break;
      }
    }
    for (const Key& k : rb.order)
      if (ra.rows.count(k) == 0) skipped.insert(k.second);
    if (r.diff) break;
    const auto la = ea->logits(), lb = eb->logits();
    std::map<int32_t, std::vector<float>> ma, mb;
    const int32_t pos = ea->n_past() - 1;
    ma[pos].assign(la.begin(), la.end());
    mb[pos].assign(lb.begin(), lb.end());
    ++r.ops_compared;
    TraceDiff d;
    if (compare_op(ma, mb, Key{-1, "logits"}, step, d)) {
      r.diff = d;
      break;
    }
    toks = {argmax(la)};
  }
  r.skipped.assign(skipped.begin(), skipped.end());
  return r;
}

std::string describe(const TraceResult& r, const TraceOptions& o) {
  std::string s = "trace: a = " + o.a + ", b = " + o.b + ", KV cache " +
                  (o.kv_f16 ? "f16" : "f32") + ", prompt of " + std::to_string(o.tokens.size()) +
                  " tokens + " + std::to_string(o.steps) + " decode steps\n";
  if (r.diff) {
    const TraceDiff& d = *r.diff;
    const std::string where =
        d.layer < 0 ? std::string("output") : "layer " + std::to_string(d.layer);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.6g", d.max_abs_diff);
    s += "first difference: " +
         (d.step == 0 ? std::string("prompt") : "decode step " + std::to_string(d.step)) + ", " +
         where + ", op " + d.op + ", pos " + std::to_string(d.pos) + ", index " +
         std::to_string(d.index) + " (flat " + std::to_string(d.flat_index) +
         "): a = " + fmt_value(d.a) + ", b = " + fmt_value(d.b) + "; max |diff| of the op " + buf +
         " (" + std::to_string(d.n_diff) + " values differ)\n";
  } else {
    s += "identical through " + std::to_string(r.n_layers) + " layers and logits (" +
         std::to_string(r.steps_run) + " evals, " + std::to_string(r.ops_compared) +
         " op outputs compared)\n";
  }
  if (!r.skipped.empty()) {
    s += "not compared (reported by one side only):";
    for (const auto& n : r.skipped) s += " " + n;
    s += "\n";
  }
  return s;
}

int trace_cli_main(int argc, char** argv) {
  TraceOptions o;
  std::string prompt;
  bool have_prompt = false, have_tokens = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      auto val = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
        return argv[++i];
      };
      if (k == "--model") {
        o.model = val();
      } else if (k == "--prompt") {
        prompt = val(), have_prompt = true;
      } else if (k == "--tokens") {
        o.tokens = parse_ids(val()), have_tokens = true;
      } else if (k == "--a") {
        o.a = val();
      } else if (k == "--b") {
        o.b = val();
      } else if (k == "--kv-cache") {
        o.kv_f16 = kv_cache_arg(val()) == "f16";
      } else if (k == "--steps") {
        o.steps = std::stoi(val());
      } else if (k == "--gpu") {
        o.gpu = std::stoi(val());
      } else if (k == "--perturb-b") {
        const std::string v = val();
        const size_t c1 = v.find(':'), c2 = v.rfind(':');
        if (c1 == std::string::npos || c2 == c1)
          throw std::invalid_argument("--perturb-b LAYER:OP:INDEX");
        o.perturb_b.perturb_layer = std::stoi(v.substr(0, c1));
        o.perturb_b.perturb_op = v.substr(c1 + 1, c2 - c1 - 1);
        o.perturb_b.perturb_index = std::stoll(v.substr(c2 + 1));
      } else {
        throw std::invalid_argument("unknown argument '" + k + "'");
      }
    }
    if (o.model.empty()) throw std::invalid_argument("--model is required");
    if (have_prompt == have_tokens)
      throw std::invalid_argument("give exactly one of --prompt and --tokens");
  } catch (const std::exception& e) {
    std::cerr << "trace: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    if (have_prompt) {
      auto model = load_model(o.model);
      o.tokens = tokenize_prompt(*make_tokenizer(*model->file), prompt, false);
    }
    const TraceResult r = run_trace(o);
    std::cout << describe(r, o) << std::flush;
    return r.diff ? 1 : 0;
  } catch (const WorkerError& e) {
    std::cerr << "trace: " << error_code_name(e.code()) << ": " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "trace: " << e.what() << "\n";
  }
  return 2;
}

}  // namespace worker
