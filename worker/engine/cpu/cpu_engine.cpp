// The CPU reference backend (D4, M0-W-1214): qwen2 and llama in FP32, weights read in
// place from the mapping and dequantized one row at a time (never a full FP32 copy).
// Every op computes the same floats, in the same order, as llama.cpp's CPU backend (the
// AVX-512 ggml-cpu build node-llama-cpp loads on such a CPU): matmul inputs rounded to the
// weight type's vec_dot_type and products summed in the order of the kernel llama.cpp picks
// (act_quant.h), rms_norm, rope, soft_max, SwiGLU as ggml computes them. On the generated
// fixtures, stories260K and the 0.5B-shaped models the logits are bit-identical to llama.cpp's
// (reports/cpu-parity.md).
#include "engine/cpu/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "common/errors.h"
#include "common/fault_injection.h"
#include "engine/cpu/act_quant.h"
#include "engine/cpu/cpu_ops.h"

namespace worker {
namespace {

// A persistent pool: the calling thread plus (n-1) workers. parallel_for splits [0, n)
// into fixed contiguous chunks, one per thread, so every output element is always
// computed by the same code in the same order (deterministic, D15).
class ThreadPool {
 public:
  explicit ThreadPool(int n_threads) : n_(std::max(1, n_threads)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }

  // fn(begin, end, thread_index). Small jobs (`work` below ~32k multiply-adds) run on the
  // caller alone: waking a worker costs more than it saves.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t work) {
    if (n_ == 1 || n < 2 || work < (int64_t{1} << 15)) {
      fn(0, n, 0);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &fn;
      job_n_ = n;
      pending_ = n_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    run_chunk(0);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void run_chunk(int i) {
    const int64_t per = (job_n_ + n_ - 1) / n_;
    const int64_t b = std::min<int64_t>(job_n_, per * i);
    const int64_t e = std::min<int64_t>(job_n_, b + per);
    if (b < e) (*job_)(b, e, i);
  }
  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
      }
      run_chunk(i);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
};

// F16 -> F32 through a table: the software conversion per element dominates otherwise.
const std::vector<float>& f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_to_fp32(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}

#if defined(__x86_64__) && defined(__GNUC__)
// The F16C instruction converts 8 halves at once, exactly (same floats as the table); used
// when the CPU has it, decided once at run time so the build stays portable.
__attribute__((target("avx,f16c"))) void f16_row_f16c(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  const float* t = f16_table().data();
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = t[h];
  }
}
bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}
#endif

void f16_row(const uint8_t* src, float* dst, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_f16c()) {
    f16_row_f16c(src, dst, n);
    return;
  }
#endif
  const float* t = f16_table().data();
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = t[h];
  }
}

// One row of any supported type into FP32. F32 rows are returned in place (no copy).
const float* row_f32(const TensorInfo& w, int64_t r, float* buf) {
  const uint8_t* src = w.row(r);
  const int64_t n = w.row_len();
  if (w.type == GgmlType::F32) {
    if (reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
      return reinterpret_cast<const float*>(static_cast<const void*>(src));
    }
    std::memcpy(buf, src, static_cast<size_t>(n) * sizeof(float));
  } else if (w.type == GgmlType::F16) {
    f16_row(src, buf, n);
  } else {  // BF16 (quantized types never come here)
    dequantize_row(w.type, src, buf, n);
  }
  return buf;
}

std::vector<float> tensor_f32(const TensorInfo* t) {
  if (t == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(t->n_elements()));
  for (int64_t r = 0; r < t->rows(); ++r) {
    dequantize_row(t->type, t->row(r), out.data() + r * t->row_len(), t->row_len());
  }
  return out;
}

class CpuEngine final : public Engine {
 public:
  CpuEngine(std::shared_ptr<const Model> model, int32_t ctx_size, CheckpointSink sink,
            const CpuEngineOptions& options)
      : model_(std::move(model)),
        cfg_(model_->config),
        w_(model_->weights),
        pool_(2),
        sink_(std::move(sink)),
        perturb_(options),
        kv_f16_(options.kv_f16) {
    const int64_t train = cfg_.n_ctx_train > 0 ? cfg_.n_ctx_train : 32768;
    int64_t n = ctx_size > 0 ? std::min<int64_t>(ctx_size, train) : std::min<int64_t>(train, 32768);
    n_ctx_ = static_cast<int32_t>(n);
    if (cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 || cfg_.n_head % cfg_.n_head_kv != 0) {
      throw WorkerError(ErrorCode::ModelLoadFailed,
                        "cpu backend: n_head " + std::to_string(cfg_.n_head) +
                            " is not a multiple of n_head_kv " + std::to_string(cfg_.n_head_kv));
    }
    if (cfg_.n_rot > cfg_.head_dim || cfg_.n_rot % 2 != 0 || cfg_.n_rot > 2048) {
      throw WorkerError(ErrorCode::ModelLoadFailed, "cpu backend: rope dimension " +
                                                        std::to_string(cfg_.n_rot) +
                                                        " must be even, <= 2048 and <= head_dim " +
                                                        std::to_string(cfg_.head_dim));
    }
    // Norm weights and biases are vectors of n_embd floats: converting them once is not a
    // copy of the model.
    out_norm_ = tensor_f32(w_.output_norm);
    for (const auto& l : w_.layers) {
      LayerVecs v;
      v.attn_norm = tensor_f32(l.attn_norm);
      v.ffn_norm = tensor_f32(l.ffn_norm);
      v.bq = tensor_f32(l.bq);
      v.bk = tensor_f32(l.bk);
      v.bv = tensor_f32(l.bv);
      vecs_.push_back(std::move(v));
    }
    k_cache_.resize(w_.layers.size());
    v_cache_.resize(w_.layers.size());
    int64_t max_row = cfg_.n_embd;
    for (const auto& l : w_.layers) {
      for (const TensorInfo* t : {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down}) {
        max_row = std::max(max_row, t->row_len());
      }
    }
    row_bufs_.assign(static_cast<size_t>(pool_.size()),
                     std::vector<float>(static_cast<size_t>(max_row)));
  }

  const ModelConfig& config() const override { return cfg_; }
  BackendInfo info() const override {
    BackendInfo b;
    b.backend = "cpu";
    b.numerics = "exact";
    b.kv_cache = kv_f16_ ? "f16" : "f32";
    b.device_name = "cpu";
    return b;
  }
  VramUsage vram() const override { return {}; }  // the cpu backend holds no device memory
  int32_t n_ctx() const override { return n_ctx_; }
  int32_t n_past() const override { return n_past_; }
  void reset() override {
    n_past_ = 0;
    for (auto& k : k_cache_) std::vector<float>().swap(k);
    for (auto& v : v_cache_) std::vector<float>().swap(v);
  }

  void eval(std::span<const int32_t> tokens, bool all_logits) override;

  std::span<const float> logits() const override {
    if (n_logits_ == 0) throw WorkerError(ErrorCode::Internal, "logits() before any eval");
    const size_t V = static_cast<size_t>(cfg_.vocab_size);
    return {logits_.data() + (n_logits_ - 1) * V, V};
  }
  std::span<const float> logits_at(size_t i) const override {
    if (i >= n_logits_) {
      throw WorkerError(ErrorCode::Internal,
                        "logits_at(" + std::to_string(i) + "): only " + std::to_string(n_logits_) +
                            " positions kept (eval with all_logits for every position)");
    }
    const size_t V = static_cast<size_t>(cfg_.vocab_size);
    return {logits_.data() + i * V, V};
  }

 private:
  struct LayerVecs {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv;
  };

  // out[t*M + r] = dot(W row r, in[t*K ..]) for t < n. As llama.cpp's CPU backend, each
  // activation row is first rounded to the weight type's vec_dot_type (act_quant.h); float
  // weight rows are expanded once per call and reused by every token of the batch. F32/F16
  // products are summed in llama.cpp's order: tinyBLAS for a batch of >= 2 tokens (prompt),
  // vec_dot for one token (decode).
  void matmul(const TensorInfo& W, const float* in, int64_t n, float* out) {
    const int64_t K = W.row_len(), M = W.rows();
    if (acts_.size() < static_cast<size_t>(n)) acts_.resize(static_cast<size_t>(n));
    const bool repack = repacked(W.type, M);
    for (int64_t t = 0; t < n; ++t) {
      cpu::quantize_activation(W.type, in + t * K, K, acts_[static_cast<size_t>(t)]);
      acts_[static_cast<size_t>(t)].repacked = repack;
      acts_[static_cast<size_t>(t)].repack_gemm = repack && t < n - n % 4;
    }
    const bool float_weights = dot_family_of(W.type) == DotFamily::Float;
    const bool tiny = cpu::tinyblas_takes(W.type, M, n, K);
    const bool f16 = W.type == GgmlType::F16, bf16 = W.type == GgmlType::BF16;
    pool_.parallel_for(
        M,
        [&](int64_t b, int64_t e, int th) {
          float* buf = row_bufs_[static_cast<size_t>(th)].data();
          for (int64_t r = b; r < e; ++r) {
            if (float_weights) {
              const float* row = row_f32(W, r, buf);
              for (int64_t t = 0; t < n; ++t) {
                const float* a = acts_[static_cast<size_t>(t)].f.data();
                if (bf16) {
                  out[t * M + r] =
                      tiny ? cpu::dot_bf16_tinyblas(row, a, K) : cpu::dot_bf16_vecdot(row, a, K);
                } else {
                  out[t * M + r] =
                      tiny ? cpu::dot_tinyblas(row, a, K) : cpu::dot_vecdot(row, a, K, f16);
                }
              }
            } else {
              for (int64_t t = 0; t < n; ++t) {
                out[t * M + r] =
                    cpu::dot_quantized(W.type, W.row(r), acts_[static_cast<size_t>(t)], buf);
              }
            }
          }
        },
        M * K * n);
  }

  // ggml_rms_norm (sum of squares in double) followed by the weight multiply, per row.
  void rms_norm(const float* x, const std::vector<float>& w, float* y, int64_t n_tok) const {
    const int64_t D = cfg_.n_embd;
    for (int64_t t = 0; t < n_tok; ++t)
      cpu::rms_norm_row(x + t * D, w.data(), y + t * D, D, cfg_.norm_eps);
  }

  // ggml_rope: theta_i = pos * base^(-2i/n_rot), built by repeated multiplication in float
  // exactly as ggml_rope_cache_init does. NEOX rotates (i, i + n_rot/2), normal (2i, 2i+1).
  void rope(float* v, int64_t n_heads, int32_t pos) const {
    cpu::rope_row(v, n_heads, cfg_.head_dim, cfg_.n_rot, cfg_.rope_neox,
                  cpu::rope_theta_scale(cfg_.rope_base, cfg_.n_rot), pos);
  }

  // Reports rows of `data` (one per token, `width` floats each) to the checkpoint sink, after
  // the test-only perturbation (CpuEngineOptions::perturb_op) when this is its op.
  void checkpoint(std::string_view name, int layer, float* data, int64_t n, int64_t width,
                  int32_t pos0) const {
    if (!perturb_.perturb_op.empty() && name == perturb_.perturb_op &&
        layer == perturb_.perturb_layer && perturb_.perturb_index >= 0 &&
        perturb_.perturb_index < n * width) {
      float& x = data[perturb_.perturb_index];
      x = std::nextafter(x, INFINITY);
    }
    if (!sink_) return;
    for (int64_t t = 0; t < n; ++t) {
      sink_(name, layer, pos0 + static_cast<int32_t>(t),
            std::span<const float>(data + t * width, static_cast<size_t>(width)));
    }
  }

  std::shared_ptr<const Model> model_;
  const ModelConfig& cfg_;
  const ModelWeights& w_;
  ThreadPool pool_;
  CheckpointSink sink_;
  CpuEngineOptions perturb_;  // only its perturb_* fields are read
  bool kv_f16_ = false;       // K and V cached as fp16 values (held as the floats they convert to)
  int32_t n_ctx_ = 0;
  int32_t n_past_ = 0;
  std::vector<float> out_norm_;
  std::vector<LayerVecs> vecs_;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // [layer][pos * n_kv_dim]
  std::vector<std::vector<float>> row_bufs_;           // one dequantization row per thread
  std::vector<cpu::QuantizedActivation> acts_;         // matmul inputs, per token
  std::vector<float> logits_;
  size_t n_logits_ = 0;
};

void CpuEngine::eval(std::span<const int32_t> tokens, bool all_logits) {
  check_eval_input(tokens, n_past_, n_ctx_, cfg_.vocab_size);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t D = cfg_.n_embd, hd = cfg_.head_dim, nh = cfg_.n_head, nkv = cfg_.n_head_kv;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd, F = cfg_.n_ff;
  // WRK-D28: the activation scratch below stands in for the device scratch of the CUDA
  // engine; an injected failure leaves the engine's state untouched, as a real one would.
  if (fault::inject_alloc_failure()) {
    const size_t floats = static_cast<size_t>(n * (4 * D + 2 * q_dim + 2 * kv_dim + 2 * F));
    throw WorkerError(ErrorCode::VramOom,
                      fault::injected_alloc_message(floats * sizeof(float), "activation scratch"));
  }
  const int64_t group = nh / nkv;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto& te = *w_.token_embd;

  std::vector<float> x(static_cast<size_t>(n * D)), xn(static_cast<size_t>(n * D));
  std::vector<float> q(static_cast<size_t>(n * q_dim)), k(static_cast<size_t>(n * kv_dim)),
      v(static_cast<size_t>(n * kv_dim)), att(static_cast<size_t>(n * q_dim));
  std::vector<float> tmp(static_cast<size_t>(n * D));
  std::vector<float> gate(static_cast<size_t>(n * F)), up(static_cast<size_t>(n * F));

  for (int64_t t = 0; t < n; ++t) {
    dequantize_row(te.type, te.row(tokens[static_cast<size_t>(t)]), x.data() + t * D, D);
  }
  const int64_t n_kv_total = n_past_ + n;
  for (size_t il = 0; il < w_.layers.size(); ++il) {
    const LayerWeights& L = w_.layers[il];
    const LayerVecs& LV = vecs_[il];
    const int li = static_cast<int>(il);
    rms_norm(x.data(), LV.attn_norm, xn.data(), n);
    checkpoint("attn_norm", li, xn.data(), n, D, n_past_);
    matmul(*L.wq, xn.data(), n, q.data());
    matmul(*L.wk, xn.data(), n, k.data());
    matmul(*L.wv, xn.data(), n, v.data());
    for (int64_t t = 0; t < n; ++t) {
      if (!LV.bq.empty()) {
        for (int64_t i = 0; i < q_dim; ++i) q[t * q_dim + i] += LV.bq[i];
        for (int64_t i = 0; i < kv_dim; ++i) k[t * kv_dim + i] += LV.bk[i];
        for (int64_t i = 0; i < kv_dim; ++i) v[t * kv_dim + i] += LV.bv[i];
      }
      const int32_t pos = n_past_ + static_cast<int32_t>(t);
      rope(q.data() + t * q_dim, nh, pos);
      rope(k.data() + t * kv_dim, nkv, pos);
    }
    checkpoint("q", li, q.data(), n, q_dim, n_past_);
    checkpoint("k", li, k.data(), n, kv_dim, n_past_);
    checkpoint("v", li, v.data(), n, kv_dim, n_past_);
    auto& kc = k_cache_[il];
    auto& vc = v_cache_[il];
    if (kc.size() < static_cast<size_t>(n_kv_total * kv_dim)) {
      kc.resize(static_cast<size_t>(n_kv_total * kv_dim));
      vc.resize(static_cast<size_t>(n_kv_total * kv_dim));
    }
    if (kv_f16_) {
      // ggml_set_rows into an F16 cache: each value rounded to nearest even fp16
      // (_mm512_cvtps_ph with _MM_FROUND_TO_NEAREST_INT), kept here as its exact float.
      std::transform(k.begin(), k.end(), kc.begin() + n_past_ * kv_dim,
                     [](float f) { return fp16_to_fp32(fp32_to_fp16(f)); });
      std::transform(v.begin(), v.end(), vc.begin() + n_past_ * kv_dim,
                     [](float f) { return fp16_to_fp32(fp32_to_fp16(f)); });
    } else {
      std::copy(k.begin(), k.end(), kc.begin() + n_past_ * kv_dim);
      std::copy(v.begin(), v.end(), vc.begin() + n_past_ * kv_dim);
    }
    checkpoint("k_cache", li, kc.data() + n_past_ * kv_dim, n, kv_dim, n_past_);
    checkpoint("v_cache", li, vc.data() + n_past_ * kv_dim, n, kv_dim, n_past_);

    // Causal GQA attention, one (token, head) pair per task, in llama.cpp's order (F32 KV
    // cache, no flash attention): KQ = ggml_vec_dot_f32 per key, soft_max_ext (scale, then
    // ggml_v_expf 16 lanes at a time, block sums added in double), KQV = mul_mat(V^T, KQ):
    // vec_dot over the keys for one token, tinyBLAS for a prompt batch. llama.cpp's KV
    // window is padded (256 cells); the padding holds zero weights and adds nothing, so
    // padding to 64 here gives the same lanes.
    const int64_t cap = (n_kv_total + 63) & ~int64_t{63};
    // F16 cache: q and the probabilities rounded to fp16 before their products, which take
    // tinyBLAS F16 x F16 or ggml_vec_dot_f16 (cpu::attention_head_f16).
    const bool kqv_tiny =
        kv_f16_ ? cpu::kqv16_tiny(hd, n) : cpu::tinyblas_takes(GgmlType::F32, hd, n, 256);
    const bool kq_tiny = kv_f16_ && cpu::kq16_tiny(hd, n);
    pool_.parallel_for(
        n * nh,
        [&](int64_t b, int64_t e, int) {
          std::vector<float> sc(static_cast<size_t>(cap)), col(static_cast<size_t>(cap));
          std::vector<float> q16(static_cast<size_t>(hd));
          for (int64_t job = b; job < e; ++job) {
            const int64_t t = job / nh, h = job % nh, g = h / group;
            const int64_t n_att = n_past_ + t + 1;
            if (kv_f16_) {
              cpu::attention_head_f16(q.data() + t * q_dim + h * hd, kc.data() + g * hd,
                                      vc.data() + g * hd, kv_dim, hd, n_att, cap, kq_tiny, kqv_tiny,
                                      kq_scale, q16.data(), sc.data(), col.data(),
                                      att.data() + t * q_dim + h * hd);
            } else {
              cpu::attention_head(q.data() + t * q_dim + h * hd, kc.data() + g * hd,
                                  vc.data() + g * hd, kv_dim, hd, n_att, cap, kqv_tiny, kq_scale,
                                  sc.data(), col.data(), att.data() + t * q_dim + h * hd);
            }
          }
        },
        n * nh * n_kv_total * hd);
    checkpoint("attn_out", li, att.data(), n, q_dim, n_past_);
    matmul(*L.wo, att.data(), n, tmp.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    checkpoint("ffn_inp", li, x.data(), n, D, n_past_);

    // In the last layer llama.cpp keeps only the output rows (ggml_get_rows on inp_out_ids)
    // before the FFN; with one output its matmuls take the one-token (vec_dot) order, so do
    // the same: rows r0..n-1 only.
    const int64_t r0 = (!all_logits && il + 1 == w_.layers.size()) ? n - 1 : 0;
    const int64_t nr = n - r0;
    float* xr = x.data() + r0 * D;
    const int32_t p0 = n_past_ + static_cast<int32_t>(r0);
    rms_norm(xr, LV.ffn_norm, xn.data(), nr);
    checkpoint("ffn_norm", li, xn.data(), nr, D, p0);
    matmul(*L.w_gate, xn.data(), nr, gate.data());
    matmul(*L.w_up, xn.data(), nr, up.data());
    // ggml_vec_swiglu_f32 per row: 16 lanes at a time with ggml_v_silu, the last F % 16 with
    // the scalar ggml_silu_f32 (x / (1 + expf(-x)), libm's expf).
    for (int64_t t = 0; t < nr; ++t) cpu::swiglu_row(gate.data() + t * F, up.data() + t * F, F);
    checkpoint("ffn_act", li, gate.data(), nr, F, p0);
    matmul(*L.w_down, gate.data(), nr, tmp.data());
    for (size_t i = 0; i < static_cast<size_t>(nr * D); ++i) xr[i] += tmp[i];
    checkpoint("l_out", li, xr, nr, D, p0);
  }

  // Only the positions asked for go through the final norm and the LM head.
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t n_out = n - first;
  rms_norm(x.data() + first * D, out_norm_, xn.data(), n_out);
  checkpoint("result_norm", -1, xn.data(), n_out, D, n_past_ + static_cast<int32_t>(first));
  logits_.resize(static_cast<size_t>(n_out * cfg_.vocab_size));
  matmul(*w_.output, xn.data(), n_out, logits_.data());
  n_logits_ = static_cast<size_t>(n_out);
  n_past_ += static_cast<int32_t>(n);
}

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size) {
  return make_cpu_engine(std::move(model), ctx_size, nullptr);
}

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                        CheckpointSink sink) {
  return make_cpu_engine(std::move(model), ctx_size, std::move(sink), CpuEngineOptions{});
}

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                        CheckpointSink sink, const CpuEngineOptions& options) {
  if (!model) throw WorkerError(ErrorCode::Internal, "make_cpu_engine: no model");
  return std::make_unique<CpuEngine>(std::move(model), ctx_size, std::move(sink), options);
}

}  // namespace worker
