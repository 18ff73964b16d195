// kernel_bench: the exact kernels' entry points timed at the 0.5B model's shapes (n_embd 896,
// 14 heads of 64, 2 KV heads, n_ff 4864, vocab 151936) for every weight type, each body of
// launches captured N times in a CUDA graph (PDL edges as in the engine's decode step) and
// the graph replayed once after a warm-up. Speed is measured here, not in the kernel tests
// (they check the bits). Weights are random valid blocks (kernels/tests/exact_test_blocks.h).
//
//   kernel_bench [--json] [--reps N] [--filter SUBSTR] [--type NAME] [--n-tok N]
//
// --filter: only ops whose name holds SUBSTR; --type: only that type's entries (a weight type's
// name as the table prints it, e.g. Q8_0; the other weight types are not set up); --n-tok: only
// entries of that many tokens (bench/bench.py: --type Q8_0 --n-tok 512, the prompt's products).
//
// Prints a table (op, type, shape, us per call, GB/s of the weight or KV cache bytes read, %
// of the card's bandwidth (peak_gbs: H100 3350, H200 4800 GB/s), TFLOP/s of the products);
// --json: one JSON object per line instead. linear / qkv / ffn / linear_rows get their input
// already rounded, as the engine calls them after rmsnorm_act or the attention; quantize_act is
// timed on its own. Exit 2 without a CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "act_round.cuh"
#include "attention_exact.cuh"
#include "common/rope.h"
#include "common/test_helpers.h"
#include "exact.cuh"
#include "exact_qgemm_math.cuh"
#include "exact_test_blocks.h"
#include "gguf/ggml_types.h"
#include "gguf/type_traits.h"
#include "linear.cuh"
#include "weights.cuh"

namespace {

using namespace worker;  // NOLINT(google-build-using-namespace)
namespace ex = kern::exact;

// The card's memory bandwidth (GB/s, vendor figures; bench.py's table): 0 when unknown (no %bw).
double peak_gbs(const std::string& card) {
  const std::pair<const char*, double> table[] = {
      {"H200", 4800.0}, {"H100 NVL", 3900.0}, {"H100 PCIe", 2000.0}, {"H100", 3350.0}};
  for (const auto& [name, gbs] : table) {
    if (card.find(name) != std::string::npos) return gbs;
  }
  return 0.0;
}
constexpr int kE = 896, kHeads = 14, kKvHeads = 2, kHd = 64, kF = 4864, kVocab = 151936;
constexpr int kQd = kHeads * kHd, kKd = kKvHeads * kHd, kMaxTok = 512, kCtx = 4096;
const GgmlType kTypes[] = {GgmlType::F16,  GgmlType::BF16, GgmlType::F32,  GgmlType::Q8_0,
                           GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K};
const int kPromptToks[] = {8, 16, 32, 64, 128, 512};

void ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "kernel_bench: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
#define CUDA_OK(x) ok((x), #x)

template <class T>
class Dev {
 public:
  explicit Dev(size_t n) {
    CUDA_OK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    CUDA_OK(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    CUDA_OK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  test::XorShift r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}

struct Weight {
  Dev<uint8_t> mem;
  kern::WeightView v;
  Weight(GgmlType t, int64_t rows, int64_t cols, uint64_t seed)
      : mem(exacttest::random_weights(t, rows, cols, seed)) {
    v = {mem.get(), static_cast<uint32_t>(t), rows, cols, ggml_row_bytes(t, cols)};
  }
  double bytes() const { return static_cast<double>(v.row_bytes) * static_cast<double>(v.rows); }
};

bool fits(GgmlType t, int cols) {
  return cols % static_cast<int>(ggml_block_size(static_cast<uint32_t>(t)).value_or(1)) == 0;
}

std::string tname(GgmlType t) {
  return std::string(ggml_type_name(static_cast<uint32_t>(t)));
}

const char* act_name(ActType a) {
  static const char* const names[] = {"F32", "F16", "BF16", "Q8_0", "Q8_K"};
  return names[static_cast<int>(a)];
}

std::string dims(int64_t rows, int64_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

struct Opts {
  bool json = false;
  int reps = 50;
  std::string filter, type;
  int n_tok = 0;  // 0: every token count
};

class Bench {
 public:
  Bench(const Opts& o, std::string card)
      : o_(o), card_(std::move(card)), peak_gbs_(peak_gbs(card_)) {
    CUDA_OK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    if (!o_.json) {
      std::printf(
          "kernel_bench on %s; GB/s of the weight (attention: KV cache) bytes read, %% of "
          "%.0f GB/s (0: card not in the table, no %%bw)\n",
          card_.c_str(), peak_gbs_);
      std::printf("%-22s %-10s %-20s %5s %10s %8s %6s %8s\n", "op", "type", "shape", "n_tok",
                  "us/call", "GB/s", "%bw", "TFLOP/s");
    }
  }
  ~Bench() { cudaStreamDestroy(st_); }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  // Times body(stream); bytes: weight / cache bytes read per call (0: none); flops per call.
  template <class F>
  void time(const std::string& op, const std::string& type, const std::string& shape, int n_tok,
            double bytes, double flops, F&& body) {
    if (!o_.filter.empty() && op.find(o_.filter) == std::string::npos) return;
    if (!o_.type.empty() && type != o_.type) return;
    if (o_.n_tok != 0 && n_tok != o_.n_tok) return;
    // about 20 ms of work per graph, between 3 and --reps calls
    const double one = graph_us(body, 1);
    const int reps = std::clamp(static_cast<int>(20000.0 / std::max(one, 1.0)), 3, o_.reps);
    const double us = graph_us(body, reps);
    const double gbs = bytes > 0 ? bytes / (us * 1e3) : 0.0;
    const bool pct = bytes > 0 && peak_gbs_ > 0;
    const double tfl = flops > 0 ? flops / (us * 1e6) : 0.0;
    if (o_.json) {
      std::printf(
          "{\"bench\": \"kernel\", \"card\": \"%s\", \"op\": \"%s\", \"type\": \"%s\", "
          "\"shape\": \"%s\", \"n_tok\": %d, \"us\": %.3f, \"bytes\": %.0f, \"gbs\": %s, "
          "\"pct_of_bw\": %s, \"tflops\": %s, \"reps\": %d}\n",
          card_.c_str(), op.c_str(), type.c_str(), shape.c_str(), n_tok, us, bytes,
          bytes > 0 ? fmt("%.1f", gbs).c_str() : "null",
          pct ? fmt("%.1f", 100.0 * gbs / peak_gbs_).c_str() : "null",
          flops > 0 ? fmt("%.3f", tfl).c_str() : "null", reps);
    } else {
      std::printf("%-22s %-10s %-20s %5d %10.2f %8s %6s %8s\n", op.c_str(), type.c_str(),
                  shape.c_str(), n_tok, us, bytes > 0 ? fmt("%.0f", gbs).c_str() : "-",
                  pct ? fmt("%.1f", 100.0 * gbs / peak_gbs_).c_str() : "-",
                  flops > 0 ? fmt("%.2f", tfl).c_str() : "-");
    }
    std::fflush(stdout);
  }

 private:
  static std::string fmt(const char* f, double v) {
    char b[32];
    std::snprintf(b, sizeof b, f, v);
    return b;
  }
  template <class F>
  double graph_us(F& body, int reps) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    CUDA_OK(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; ++i) body(st_);
    CUDA_OK(cudaStreamEndCapture(st_, &g));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaGraphLaunch(ge, st_));  // warm-up
    CUDA_OK(cudaEventRecord(e0, st_));
    CUDA_OK(cudaGraphLaunch(ge, st_));
    CUDA_OK(cudaEventRecord(e1, st_));
    CUDA_OK(cudaStreamSynchronize(st_));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return 1000.0 * static_cast<double>(ms) / reps;
  }

  Opts o_;
  std::string card_;
  double peak_gbs_;  // after card_
  cudaStream_t st_ = nullptr;
};

// Device buffers shared by every op, sized for the largest (kMaxTok tokens, the LM head).
struct Buffers {
  Dev<float> x{static_cast<size_t>(kMaxTok) * kF};
  Dev<float> y{std::max(static_cast<size_t>(kMaxTok) * kF, static_cast<size_t>(kVocab) * 64)};
  Dev<float> y2{static_cast<size_t>(kMaxTok) * kF}, y3{static_cast<size_t>(kMaxTok) * kF};
  Dev<float> g{static_cast<size_t>(kMaxTok) * kF}, u{static_cast<size_t>(kMaxTok) * kF};
  Dev<float> spare{static_cast<size_t>(kF)};
  Dev<float> norm_w{static_cast<size_t>(kE)};
  // with the tensor-core tile's scratch for the largest launch (gate + up), as the engine sizes it
  size_t mma_bytes = ex::qgemm_scratch_bytes(kMaxTok, kF, 2 * ex::qgemm_weight_elems(kF, kE));
  Dev<uint8_t> act_mem{ex::act_buffer_bytes(kMaxTok, kF, mma_bytes)};
  ex::ActBuf act = ex::act_buffer_at(act_mem.get(), kMaxTok, kF, mma_bytes);
  Buffers() {
    const auto xs = uniform(static_cast<size_t>(kMaxTok) * kF, 1, -1.0f, 1.0f);
    CUDA_OK(cudaMemcpy(x.get(), xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(g.get(), xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(u.get(), xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
    const auto ws = uniform(static_cast<size_t>(kE), 2, 0.5f, 1.5f);
    CUDA_OK(cudaMemcpy(norm_w.get(), ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  }
  // act holding x [n][cols] rounded for weight type t (what the engine's producers leave).
  ex::ActBuf rounded(GgmlType t, int n, int cols) {
    ex::quantize_act(static_cast<uint32_t>(t), x.get(), n, cols, act, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    ex::ActBuf a = act;
    a.holds(act_type_of(t), x.get());
    return a;
  }
};

// Activation rounding alone and fused into rmsnorm / SwiGLU, per rounding type.
void bench_act(Bench& b, Buffers& m) {
  for (GgmlType t :
       {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K}) {
    const auto wt = static_cast<uint32_t>(t);
    const char* an = act_name(act_type_of(t));
    struct Rows {
      int n, cols;
    };
    for (const Rows r : {Rows{1, kE}, Rows{1, kF}, Rows{kMaxTok, kE}}) {
      if (!fits(t, r.cols)) continue;
      b.time("quantize_act", an, std::to_string(r.cols), r.n, 0, 0,
             [&](cudaStream_t s) { ex::quantize_act(wt, m.x.get(), r.n, r.cols, m.act, s); });
    }
    if (fits(t, kE)) {  // Q8_K: 896 is not a whole number of 256-blocks
      b.time("rmsnorm_act", an, std::to_string(kE), 1, 0, 0, [&](cudaStream_t s) {
        ex::ActBuf a = m.act;
        ex::rmsnorm_act(m.x.get(), m.norm_w.get(), m.y.get(), 1, kE, 1e-6f, wt, a, s);
      });
      b.time("rmsnorm+quantize_act", an, std::to_string(kE), 1, 0, 0, [&](cudaStream_t s) {
        ex::rmsnorm(m.x.get(), m.norm_w.get(), m.y.get(), 1, kE, 1e-6f, s);
        ex::quantize_act(wt, m.y.get(), 1, kE, m.act, s);
      });
    }
    // in place on g: the values change from call to call, the work does not
    b.time("swiglu_act", an, std::to_string(kF), 1, 0, 0, [&](cudaStream_t s) {
      ex::ActBuf a = m.act;
      ex::swiglu_act(m.g.get(), m.u.get(), 1, kF, wt, a, s);
    });
    b.time("swiglu+quantize_act", an, std::to_string(kF), 1, 0, 0, [&](cudaStream_t s) {
      ex::swiglu(m.g.get(), m.u.get(), 1, kF, s);
      ex::quantize_act(wt, m.g.get(), 1, kF, m.act, s);
    });
    // a prompt's: kMaxTok rows (bytes: g read and written, u read, the rounded copy written)
    const double pb = static_cast<double>(kMaxTok) * kF * 13.0;
    b.time("swiglu_act", an, std::to_string(kF), kMaxTok, pb, 0, [&](cudaStream_t s) {
      ex::ActBuf a = m.act;
      ex::swiglu_act(m.g.get(), m.u.get(), kMaxTok, kF, wt, a, s);
    });
  }
}

// One token: the entry points, and for each single product the kernel linear() picks
// (matvec1_*) next to matmul's one-token path.
void bench_decode(Bench& b, Buffers& m, GgmlType t) {
  const std::string tn = tname(t);
  const double fl1 = 2.0;  // flops per weight element and token
  struct Shape {
    int rows, cols;
  };
  for (const Shape sh : {Shape{kE, kE}, Shape{kKd, kE}, Shape{kF, kE}, Shape{kE, kF}}) {
    if (!fits(t, sh.cols)) continue;
    const Weight w(t, sh.rows, sh.cols, 10 + static_cast<uint64_t>(sh.rows));
    const ex::ActBuf a = m.rounded(t, 1, sh.cols);
    const std::string shape = dims(sh.rows, sh.cols);
    const double fl = fl1 * sh.rows * sh.cols;
    b.time("linear", tn, shape, 1, w.bytes(), fl, [&](cudaStream_t s) {
      ex::ActBuf ac = a;
      ex::linear(w.v, m.x.get(), 1, ac, m.y.get(), false, s);
    });
    b.time("matmul", tn, shape, 1, w.bytes(), fl, [&](cudaStream_t s) {
      ex::matmul(w.v, a, 1, ex::BatchOrder{1, 0}, m.y.get(), false, s);
    });
  }
  if (fits(t, kE)) {
    const Weight wq(t, kQd, kE, 20), wk(t, kKd, kE, 21), wv(t, kKd, kE, 22);
    const ex::ActBuf a = m.rounded(t, 1, kE);
    const double bytes = wq.bytes() + wk.bytes() + wv.bytes();
    const double fl = fl1 * (kQd + 2 * kKd) * kE;
    const std::string shape = "(896+128+128)x896";
    b.time("qkv", tn, shape, 1, bytes, fl, [&](cudaStream_t s) {
      ex::ActBuf ac = a;
      ex::qkv(wq.v, wk.v, wv.v, m.x.get(), 1, ac, m.y.get(), m.y2.get(), m.y3.get(), s);
    });
    b.time("qkv as 3 linear", tn, shape, 1, bytes, fl, [&](cudaStream_t s) {
      ex::ActBuf ac = a;
      ex::linear(wq.v, m.x.get(), 1, ac, m.y.get(), false, s);
      ex::linear(wk.v, m.x.get(), 1, ac, m.y2.get(), false, s);
      ex::linear(wv.v, m.x.get(), 1, ac, m.y3.get(), false, s);
    });
  }
  if (fits(t, kF)) {
    // K-quant gate / up have 896-element rows: Q5_0 there, as the Q4_K_M model has
    const GgmlType tg = fits(t, kE) ? t : GgmlType::Q5_0;
    const Weight wg(tg, kF, kE, 30), wu(tg, kF, kE, 31), wd(t, kE, kF, 32);
    const ex::ActBuf a = m.rounded(tg, 1, kE);
    const double bytes = wg.bytes() + wu.bytes() + wd.bytes();
    const double fl = fl1 * 3.0 * kF * kE;
    const std::string type = tg == t ? tn : tname(tg) + "/" + tn;
    // ffn rounds g into the act buffer for down: the next call's input bytes change, not
    // the work
    b.time("ffn", type, "2x4864x896+896x4864", 1, bytes, fl, [&](cudaStream_t s) {
      ex::ActBuf ac = a;
      ex::ffn(wg.v, wu.v, wd.v, m.x.get(), 1, ac, m.g.get(), m.u.get(), m.spare.get(), m.y.get(),
              s);
    });
  }
  if (fits(t, kE)) {
    const Weight wo(t, kVocab, kE, 40);
    const ex::ActBuf a = m.rounded(t, 1, kE);
    b.time("linear_rows (LM head)", tn, dims(kVocab, kE), 1, wo.bytes(), fl1 * kVocab * kE,
           [&](cudaStream_t s) { ex::linear_rows(wo.v, a, 0, 1, 1, m.y.get(), s); });
  }
}

// A product timed as one launch must have been one.
void multi_or_die(bool launched) {
  if (!launched) {
    std::fprintf(stderr, "kernel_bench: qgemm_multi declined its weights\n");
    std::exit(1);
  }
}

// Prompt batches: linear() (qgemm for quantized weights, matmul for float ones), and for
// quantized weights qgemm next to matmul.
void bench_prompt(Bench& b, Buffers& m, GgmlType t) {
  const std::string tn = tname(t);
  const bool quant = t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16;
  struct Shape {
    int rows, cols;
  };
  // gate / up, down, q / o, k / v of the 0.5B shape
  for (const Shape sh : {Shape{kF, kE}, Shape{kE, kF}, Shape{kQd, kE}, Shape{kKd, kE}}) {
    if (!fits(t, sh.cols)) continue;
    const Weight w(t, sh.rows, sh.cols, 50 + static_cast<uint64_t>(sh.rows));
    const std::string shape = dims(sh.rows, sh.cols);
    for (int n : kPromptToks) {
      const ex::ActBuf a = m.rounded(t, n, sh.cols);
      const double fl = 2.0 * sh.rows * sh.cols * n;
      b.time("linear", tn, shape, n, w.bytes(), fl, [&](cudaStream_t s) {
        ex::ActBuf ac = a;
        ex::linear(w.v, m.x.get(), n, ac, m.y.get(), false, s);
      });
      if (!quant) continue;
      // at every token count, also below qgemm_takes()'s limit (to set it from these times)
      b.time(ex::qgemm_takes(w.v.type, n, w.v.rows) ? "qgemm" : "qgemm-untaken", tn, shape, n,
             w.bytes(), fl, [&](cudaStream_t s) {
               ex::qg::qgemm_variant(w.v, a, n, ex::BatchOrder{n, 0}, m.y.get(), false, s, -1);
             });
      b.time("matmul", tn, shape, n, w.bytes(), fl, [&](cudaStream_t s) {
        ex::matmul(w.v, a, n, ex::BatchOrder{n, 0}, m.y.get(), false, s);
      });
    }
  }
  // Q / K / V and gate + up in one qgemm launch each (linear.cu's qkv and ffn)
  if (!quant || !fits(t, kE)) return;
  const Weight wq(t, kQd, kE, 70), wk(t, kKd, kE, 71), wv(t, kKd, kE, 72);
  const Weight wg(t, kF, kE, 73), wu(t, kF, kE, 74);
  const kern::WeightView* qkv[3] = {&wq.v, &wk.v, &wv.v};
  const kern::WeightView* gu[2] = {&wg.v, &wu.v};
  float* ys[3] = {m.y.get(), m.y2.get(), m.y3.get()};
  for (int n : kPromptToks) {
    if (!ex::qgemm_takes(static_cast<uint32_t>(t), n, kQd + 2 * kKd)) continue;
    const ex::ActBuf a = m.rounded(t, n, kE);
    const ex::BatchOrder o{n, 0};
    b.time("qgemm qkv", tn, dims(kQd + 2 * kKd, kE), n, wq.bytes() + wk.bytes() + wv.bytes(),
           2.0 * (kQd + 2 * kKd) * kE * n,
           [&](cudaStream_t s) { multi_or_die(ex::qgemm_multi(qkv, ys, 3, a, n, o, s)); });
    b.time("qgemm gate+up", tn, dims(2 * kF, kE), n, wg.bytes() + wu.bytes(), 4.0 * kF * kE * n,
           [&](cudaStream_t s) { multi_or_die(ex::qgemm_multi(gu, ys, 2, a, n, o, s)); });
  }
}

// Attention at decode, both cache types: the entry point (one launch), the pieces it fuses,
// and attend alone per decode cluster size (0: the kernel's own choice).
template <class T>
void bench_attention(Bench& b, Buffers& m) {
  const bool f32 = std::is_same_v<T, float>;
  const char* kvn = f32 ? "KV F32" : "KV F16";
  Dev<T> kc(static_cast<size_t>(kCtx) * kKd), vc(static_cast<size_t>(kCtx) * kKd);
  {
    const auto c = uniform(static_cast<size_t>(kCtx) * kKd, 60, -1.0f, 1.0f);
    std::vector<T> h(c.size());
    for (size_t i = 0; i < c.size(); ++i) {
      if constexpr (std::is_same_v<T, float>) {
        h[i] = c[i];
      } else {
        h[i] = fp32_to_fp16(c[i]);
      }
    }
    CUDA_OK(cudaMemcpy(kc.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(vc.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<float> table(static_cast<size_t>(kCtx) * kHd);
  rope_table(kCtx, kHd, rope_theta_scale(1000000.0f, kHd), table.data());
  Dev<float> tab(table), q(uniform(kQd, 61, -2.0f, 2.0f)), bias(uniform(kQd, 62, -0.5f, 0.5f));
  Dev<float> out(kQd), scratch(ex::attention_scratch_floats(kCtx, 1, kHeads));
  const ex::AttnShape sh{kHeads, kKvHeads, kHd, kHd, true};  // Qwen2: neox RoPE on all dims
  // q is rotated in place call after call: a rotation, the work stays the same
  const ex::QkvIn x{q.get(), m.x.get(), m.x.get() + kKd, bias.get(), bias.get(), bias.get()};
  const ex::KvCache kv{kc.get(), vc.get(), f32 ? ex::KvType::F32 : ex::KvType::F16};
  for (int n_past : {100, 500, 1000, 4000}) {
    const Dev<int32_t> np(std::vector<int32_t>{n_past});
    const double bytes = 2.0 * (n_past + 1) * kKd * sizeof(T);
    const double fl = 4.0 * kHeads * kHd * (n_past + 1);
    const std::string shape = std::string(kvn) + " n_past " + std::to_string(n_past);
    for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0}) {
      const auto at = static_cast<uint32_t>(t);
      const std::string type = std::string("act ") + act_name(act_type_of(t));
      b.time("attention", type, shape, 1, bytes, fl, [&](cudaStream_t s) {
        ex::attention(x, sh, tab.get(), 1, np.get(), kv, out.get(), kCtx, scratch.get(), at, m.act,
                      s);
      });
      b.time("attention pieces", type, shape, 1, bytes, fl, [&](cudaStream_t s) {
        ex::bias_rope_store(x, sh, tab.get(), 1, np.get(), kc.get(), vc.get(), s);
        ex::attend(q.get(), kc.get(), vc.get(), out.get(), 1, sh, kCtx, np.get(), scratch.get(), s);
        ex::quantize_act(at, out.get(), 1, kQd, m.act, s);
      });
    }
    for (int c : {0, 1, 2, 4, 8}) {
      ex::set_decode_cluster_for_tests(c);
      b.time("attend cluster " + std::to_string(c), "-", shape, 1, bytes, fl, [&](cudaStream_t s) {
        ex::attend(q.get(), kc.get(), vc.get(), out.get(), 1, sh, kCtx, np.get(), scratch.get(), s);
      });
    }
    ex::set_decode_cluster_for_tests(0);
    ex::set_decode_local_keys_for_tests(0);  // the cluster exchange even where local mode applies
    b.time("attend no local mode", "-", shape, 1, bytes, fl, [&](cudaStream_t s) {
      ex::attend(q.get(), kc.get(), vc.get(), out.get(), 1, sh, kCtx, np.get(), scratch.get(), s);
    });
    ex::set_decode_local_keys_for_tests(-1);
  }
}

int usage() {
  std::fprintf(stderr,
               "usage: kernel_bench [--json] [--reps N] [--filter SUBSTR] [--type NAME] "
               "[--n-tok N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o.json = true;
    } else if (a == "--reps" && i + 1 < argc) {
      o.reps = std::max(3, std::atoi(argv[++i]));
    } else if (a == "--filter" && i + 1 < argc) {
      o.filter = argv[++i];
    } else if (a == "--type" && i + 1 < argc) {
      o.type = argv[++i];
    } else if (a == "--n-tok" && i + 1 < argc) {
      o.n_tok = std::atoi(argv[++i]);
      if (o.n_tok < 1) return usage();
    } else {
      return usage();
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "kernel_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp p{};
  CUDA_OK(cudaGetDeviceProperties(&p, 0));
  try {
    Bench b(o, p.name);
    Buffers m;
    bench_act(b, m);
    // a type's weights are set up only when its entries can be timed
    const auto wanted = [&](GgmlType t) { return o.type.empty() || tname(t) == o.type; };
    for (GgmlType t : kTypes) {
      if (wanted(t)) bench_decode(b, m, t);
    }
    bench_attention<float>(b, m);
    bench_attention<uint16_t>(b, m);
    for (GgmlType t : kTypes) {
      if (wanted(t)) bench_prompt(b, m, t);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
