// The CUDA engine (D4, M0-W-1214, 1420): the same math as the CPU reference
// (worker/engine/cpu/cpu_engine.cpp) with the weights resident in VRAM in their stored
// format, an FP16 KV cache, FP32 activations, and sampling on the GPU.
//
// Memory: four fixed regions allocated at load (weights, KV cache for the whole context,
// the one-token decode scratch, the sampling scratch) plus a prefill scratch that grows
// on demand; growth that fails is a VRAM_OOM error for that job only (M0-W-1021). The
// decode step reads the token and position from device memory and writes into fixed
// buffers, so it is captured once as a CUDA graph and replayed per token.
#include "cuda/cuda_engine.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attention.cuh"
#include "attention_exact.cuh"
#include "common/errors.h"
#include "common/fault_injection.h"
#include "common/log.h"
#include "common/rope.h"
#include "cuda/cuda_context.h"
#include "cuda/device_buffer.h"
#include "cuda_check.h"
#include "decode_step.cuh"
#include "embed.cuh"
#include "engine/sampler.h"
#include "exact.cuh"
#include "linear.cuh"
#include "sampling.cuh"

namespace worker {
namespace {

using cuda::align_up;
using cuda::Arena;
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

constexpr size_t kVramMargin = 64ull << 20;  // cuBLAS workspace, graph, context growth
constexpr int kLogitRows = 32;               // prefill logits computed this many rows at a time

int32_t resolve_ctx(const ModelConfig& cfg, int32_t ctx_size) {
  const int64_t train = cfg.n_ctx_train > 0 ? cfg.n_ctx_train : 32768;
  const int64_t n =
      ctx_size > 0 ? std::min<int64_t>(ctx_size, train) : std::min<int64_t>(train, 32768);
  return static_cast<int32_t>(n);
}

// Carves (or, with base == nullptr, just measures) a region of 256-byte aligned pieces.
class Layout {
 public:
  explicit Layout(uint8_t* base) : base_(base) {}
  template <typename T>
  T* take(size_t n) {
    const size_t off = align_up(used_);
    used_ = off + n * sizeof(T);
    return base_ ? reinterpret_cast<T*>(base_ + off) : nullptr;
  }
  size_t used() const { return align_up(used_); }

 private:
  uint8_t* base_;
  size_t used_ = 0;
};

// Scratch of the exact kernels: the rounded / quantized matmul input (also used by the fast
// mode's quantized prompt GEMM) and, in exact mode, the attention's probabilities.
struct ExactSizes {
  size_t act_bytes = 0, attn_floats = 0;
  size_t mma_bytes = 0;   // of act_bytes: qgemm's tensor-core scratch (prompt batches)
  size_t step_bytes = 0;  // the persistent decode step's tables (decode scratch only)
};

// qgemm's Q8_0 / Q5_0 / Q4_0 tensor-core tile converts each launch's operands into scratch
// first: for batches that reach it, of files with quantized layer weights, the largest launch
// (Q / K / V, Wo, gate + up, down; linear.cu's groups).
size_t qgemm_mma_bytes(const ModelConfig& c, int B, int widest) {
  const std::string& k = c.quant_kind;
  if (B < kern::exact::kQgemmMmaMinTokens || k == "F32" || k == "F16" || k == "BF16") return 0;
  using kern::exact::qgemm_weight_elems;
  const int64_t E = c.n_embd, QD = c.n_head * c.head_dim, KD = c.n_head_kv * c.head_dim, F = c.n_ff;
  const int64_t elems =
      std::max({qgemm_weight_elems(QD, E) + 2 * qgemm_weight_elems(KD, E),
                qgemm_weight_elems(E, QD), 2 * qgemm_weight_elems(F, E), qgemm_weight_elems(E, F)});
  return kern::exact::qgemm_scratch_bytes(B, widest, elems);
}

ExactSizes exact_sizes(const ModelConfig& c, int B, int32_t n_ctx, bool exact) {
  ExactSizes e;
  // the rounded matmul input: both modes (the fast one for its quantized prompt GEMM)
  const int widest = static_cast<int>(std::max({c.n_embd, c.n_head * c.head_dim, c.n_ff}));
  e.mma_bytes = qgemm_mma_bytes(c, B, widest);
  e.act_bytes = kern::exact::act_buffer_bytes(B, widest, e.mma_bytes);
  if (!exact) return e;
  const int nh = static_cast<int>(c.n_head);
  e.attn_floats = kern::exact::attention_scratch_floats(n_ctx, B, nh);
  if (B == 1) {
    e.step_bytes = kern::exact::DecodeStep::device_bytes(
        static_cast<int>(c.n_layer), nh, static_cast<int>(c.n_embd), static_cast<int>(c.n_ff),
        static_cast<int>(c.n_head * c.head_dim), static_cast<int>(c.n_head_kv * c.head_dim));
  }
  return e;
}

// Activations for a batch of up to B tokens.
struct Scratch {
  DeviceBuffer buf;
  int B = 0, logit_rows = 0;
  float *x = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr,
        *g = nullptr, *u = nullptr, *logits = nullptr;
  void* lowp = nullptr;
  float* attn_part = nullptr;  // split-KV attention partials (few-token batches)
  int32_t* io = nullptr;       // [0] = n_past, [1..B] = token ids
  kern::exact::ActBuf act;     // exact kernels: the current matmul input, rounded
  float* attn_scr = nullptr;   // exact attention's probabilities
  void* step_mem = nullptr;    // the persistent decode step's tables (decode scratch)

  static void lay(Layout& L, const ModelConfig& c, int B, int rows, const ExactSizes& ex,
                  Scratch* s) {
    const size_t E = static_cast<size_t>(c.n_embd), QD = static_cast<size_t>(c.n_head * c.head_dim),
                 KD = static_cast<size_t>(c.n_head_kv * c.head_dim),
                 F = static_cast<size_t>(c.n_ff), V = static_cast<size_t>(c.vocab_size),
                 b = static_cast<size_t>(B);
    float* x = L.take<float>(b * E);
    float* xn = L.take<float>(b * E);
    float* q = L.take<float>(b * QD);
    float* k = L.take<float>(b * KD);
    float* v = L.take<float>(b * KD);
    float* att = L.take<float>(b * QD);
    float* g = L.take<float>(b * F);
    float* u = L.take<float>(b * F);
    float* logits = L.take<float>(static_cast<size_t>(rows) * V);
    void* lowp = L.take<float>(b * std::max({E, QD, F}));  // 16-bit or rounded FP32 activations
    size_t part = 0;
    for (int n = 1; n <= std::min(B, 256); ++n) {
      part = std::max(part, kern::attention_partial_floats(n, static_cast<int>(c.n_head),
                                                           static_cast<int>(c.head_dim)));
    }
    float* attn_part = L.take<float>(std::max<size_t>(part, 1));
    int32_t* io = L.take<int32_t>(b + 1);
    void* act = ex.act_bytes ? L.take<uint8_t>(ex.act_bytes) : nullptr;
    float* attn_scr = ex.attn_floats ? L.take<float>(ex.attn_floats) : nullptr;
    void* step_mem = ex.step_bytes ? L.take<uint8_t>(ex.step_bytes) : nullptr;
    if (s) {
      s->step_mem = step_mem;
      if (act) {
        const int widest = static_cast<int>(std::max({E, QD, F}));
        s->act = kern::exact::act_buffer_at(act, B, widest, ex.mma_bytes);
      }
      s->attn_scr = attn_scr;
      s->attn_part = attn_part;
      s->B = B;
      s->logit_rows = rows;
      s->x = x;
      s->xn = xn;
      s->q = q;
      s->k = k;
      s->v = v;
      s->att = att;
      s->g = g;
      s->u = u;
      s->logits = logits;
      s->lowp = lowp;
      s->io = io;
    }
  }
  static size_t bytes(const ModelConfig& c, int B, int rows, const ExactSizes& ex) {
    Layout L(nullptr);
    lay(L, c, B, rows, ex, nullptr);
    return L.used();
  }
  void allocate(const ModelConfig& c, int B_, int rows, const ExactSizes& ex, const char* what) {
    buf = DeviceBuffer(bytes(c, B_, rows, ex), what);
    Layout L(static_cast<uint8_t*>(buf.data()));
    lay(L, c, B_, rows, ex, this);
  }
};

struct SampleRegion {
  DeviceBuffer buf;
  kern::SampleScratch s;
  kern::SampleParams* params = nullptr;  // followed by the history
  int32_t* history = nullptr;
  kern::SampleOut* out = nullptr;

  static void lay(Layout& L, int V, int n_ctx, size_t sort_bytes, SampleRegion* r) {
    const size_t v = static_cast<size_t>(V);
    kern::SampleScratch s;
    s.work = L.take<float>(v);
    s.keys_sorted = L.take<float>(v);
    s.ids = L.take<int32_t>(v);
    s.ids_sorted = L.take<int32_t>(v);
    s.weights = L.take<uint64_t>(v);
    s.seen = L.take<int32_t>(v);
    s.part_v = L.take<float>(kern::kArgmaxBlocks);
    s.part_i = L.take<int32_t>(kern::kArgmaxBlocks);
    s.part_h = L.take<uint64_t>(kern::kArgmaxBlocks);
    s.sort_temp = L.take<uint8_t>(sort_bytes);
    s.sort_temp_bytes = sort_bytes;
    // params and history adjacent: one host->device copy per sampled token
    auto* params =
        L.take<uint8_t>(sizeof(kern::SampleParams) + sizeof(int32_t) * static_cast<size_t>(n_ctx));
    auto* out = L.take<kern::SampleOut>(1);
    if (r) {
      r->s = s;
      r->params = reinterpret_cast<kern::SampleParams*>(params);
      r->history = reinterpret_cast<int32_t*>(params + sizeof(kern::SampleParams));
      r->out = out;
    }
  }
  static size_t bytes(int V, int n_ctx, size_t sort_bytes) {
    Layout L(nullptr);
    lay(L, V, n_ctx, sort_bytes, nullptr);
    return L.used();
  }
};

std::vector<const TensorInfo*> unique_weights(const ModelWeights& w) {
  std::vector<const TensorInfo*> out;
  std::set<const TensorInfo*> seen;
  auto add = [&](const TensorInfo* t) {
    if (t != nullptr && seen.insert(t).second) out.push_back(t);
  };
  add(w.token_embd);
  add(w.output_norm);
  add(w.output);
  for (const auto& l : w.layers) {
    for (const TensorInfo* t : {l.attn_norm, l.wq, l.wk, l.wv, l.bq, l.bk, l.bv, l.wo, l.ffn_norm,
                                l.w_gate, l.w_up, l.w_down}) {
      add(t);
    }
  }
  return out;
}

size_t weights_bytes(const ModelWeights& w) {
  size_t total = 0;
  for (const TensorInfo* t : unique_weights(w)) total += align_up(t->nbytes);
  return total;
}

// Exact mode: the norm weights and biases converted to F32 once (the vectors the CPU
// reference multiplies), followed by the RoPE cos/sin table for every position.
std::vector<const TensorInfo*> exact_vector_tensors(const ModelWeights& w) {
  std::vector<const TensorInfo*> out{w.output_norm};
  for (const auto& l : w.layers) {
    for (const TensorInfo* t : {l.attn_norm, l.ffn_norm, l.bq, l.bk, l.bv}) out.push_back(t);
  }
  return out;
}

size_t exact_vector_bytes(const ModelWeights& w, const ModelConfig& c, int32_t n_ctx) {
  size_t total = 0;
  for (const TensorInfo* t : exact_vector_tensors(w)) {
    if (t != nullptr) total += align_up(static_cast<size_t>(t->n_elements()) * sizeof(float));
  }
  return total +
         align_up(static_cast<size_t>(n_ctx) * static_cast<size_t>(c.n_rot) * sizeof(float));
}

size_t kv_bytes(const ModelConfig& c, int32_t n_ctx, bool f32) {
  return align_up(2 * static_cast<size_t>(c.n_layer) * static_cast<size_t>(n_ctx) *
                  static_cast<size_t>(c.n_head_kv * c.head_dim) * (f32 ? 4 : 2));
}

struct LayerDev {
  kern::WeightView wq, wk, wv, wo, gate, up, down;
};

class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~Event() { (void)cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class CudaEngine final : public Engine {
 public:
  CudaEngine(std::shared_ptr<const Model> model, int32_t ctx_size, int device,
             const CudaEngineOptions& opt, CheckpointSink sink);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  BackendInfo info() const override {
    BackendInfo b;
    b.backend = "cuda";
    b.numerics = opt_.exact ? "exact" : "fast";
    b.kv_cache = opt_.kv_cache_f32 ? "f32" : "f16";
    b.resident = resident_.load();
    b.sm = ctx_->sm();
    b.cuda_runtime_version = ctx_->runtime_version();
    b.device_name = ctx_->props().name;
    b.decode = step_ ? "persistent" : "per_op";
    return b;
  }
  VramUsage vram() const override {
    VramUsage u;
    u.weights = weights_.size();
    u.kv_cache = kv_.size();
    u.scratch = dec_.buf.size() + batch_.buf.size() + samp_.buf.size() + exact_vecs_.size();
    return u;
  }
  bool verify_residency() override;
  int32_t n_ctx() const override { return n_ctx_; }
  int32_t n_past() const override { return n_past_; }
  void reset() override {
    settle();
    n_past_ = 0;
  }
  void eval(std::span<const int32_t> tokens, bool all_logits) override {
    run_eval(tokens, all_logits, nullptr);
  }
  void eval_overlapped(std::span<const int32_t> tokens, bool all_logits,
                       const std::function<void()>& meanwhile) override {
    run_eval(tokens, all_logits, meanwhile ? &meanwhile : nullptr);
  }
  std::span<const float> logits() const override;
  std::span<const float> logits_at(size_t i) const override;
  int32_t sample(const SamplingParams& params, std::span<const int32_t> history,
                 std::mt19937_64& rng, uint64_t* logits_hash) override;
  int32_t sample_and_continue(const SamplingParams& params, std::span<const int32_t> history,
                              std::mt19937_64& rng, uint64_t* logits_hash) override;

 private:
  // sample()'s kernels, queued (no wait, no copy): the SampleOut into samp_.out and, with
  // feed_io, the next decode step's input (n_past_, the id) into feed_io.
  void queue_sample(const SamplingParams& params, std::span<const int32_t> history,
                    std::mt19937_64& rng, int32_t* feed_io);
  int32_t read_sample(uint64_t* logits_hash) const;
  // Waits for the queued work sample_and_continue() left running; a started step that no eval
  // took is dropped here (its logits replaced the sampled ones when those were dec_.logits).
  void settle() const;
  void check_logits_kept(const char* what) const;
  void upload_weights();
  kern::WeightView view(const TensorInfo* t) const;
  void forward(Scratch& s, int n);
  void attention_fast(Scratch& s, size_t il, int n);
  void setup_exact();
  // n_keys: the most keys a row attends to (kern::exact::attention's bound): n_past + n for a
  // prompt batch, n_ctx_ for the decode step's graph.
  void attention_exact(Scratch& s, size_t il, int n, int n_keys);
  void forward_exact(Scratch& s, int n, bool last_only, int n_keys);
  void final_logits_exact(Scratch& s, int first_row, int n_out, int rows_per_call, float* host_out);
  void setup_decode_step();
  void append_step_trace() const;
  void run_eval(std::span<const int32_t> tokens, bool all_logits,
                const std::function<void()>* meanwhile);
  void decode_body(bool persistent);  // the step as the persistent kernel, or per op
  // The step for the token in dec_.io. persistent: the persistent kernel and its embedding,
  // two PDL launches (no graph: a graph launch cannot overlap the sample kernels before it;
  // perf-notes v33); else one launch per op, replayed from graph_ when use_graph.
  void launch_decode(bool persistent);
  bool decode_persistent(int32_t n_past) const {
    return step_ && !sink_ && n_past + 1 <= step_->local_keys();
  }
  void decode_one(int32_t token);
  void trace(const char* name, int layer, const void* dev, int pos_off, int rows, int width,
             bool cache = false);
  void* kc(size_t l) const { return kv_base_ + (2 * l) * kv_layer_bytes_; }
  void* vc(size_t l) const { return kv_base_ + (2 * l + 1) * kv_layer_bytes_; }

  std::shared_ptr<cuda::CudaContext> ctx_;  // first: released last
  std::shared_ptr<const Model> model_;
  const ModelConfig& cfg_;
  CudaEngineOptions opt_;
  CheckpointSink sink_;  // tracing: ops copied to the host as they finish (no graph)
  int device_;
  int32_t n_ctx_ = 0;
  int32_t n_past_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudaGraph_t graph_ = nullptr;  // the decode step one kernel per op (use_graph)
  cudaGraphExec_t graph_exec_ = nullptr;

  Arena weights_;
  std::map<const TensorInfo*, const void*> dev_ptr_;
  kern::WeightView tok_embd_, output_;
  std::vector<LayerDev> layers_;

  // The exact kernels' F32 norm weights / biases and the RoPE table (both numerics: the decode
  // step and the LM head are exact in both).
  struct LayerVecs {
    const float *attn_norm = nullptr, *ffn_norm = nullptr, *bq = nullptr, *bk = nullptr,
                *bv = nullptr;
  };
  DeviceBuffer exact_vecs_;
  std::vector<LayerVecs> xvec_;
  const float* out_norm_f32_ = nullptr;
  const float* rope_table_ = nullptr;
  kern::exact::AttnShape shape_;

  DeviceBuffer kv_;
  uint8_t* kv_base_ = nullptr;
  size_t kv_layer_bytes_ = 0;
  Scratch dec_;  // one token, fixed addresses (graph)
  // Exact decode as one persistent kernel (kernels/decode_step.cuh), when the model qualifies.
  std::unique_ptr<kern::exact::DecodeStep> step_;
  std::string step_trace_path_;  // WORKER_DECODE_STEP_TRACE: each step's timestamps appended
  Scratch batch_;                // prefill, grows on demand
  SampleRegion samp_;
  PinnedBuffer pin_io_;      // [0] = n_past, [1..] = tokens
  PinnedBuffer pin_sample_;  // SampleParams + history
  PinnedBuffer pin_out_;     // one SampleOut: the sampled id and the logits hash
  std::atomic<bool> resident_{false};

  // A step sample_and_continue() started for token `id` at position `n_past` (dec_.io), not
  // yet taken by an eval.
  struct Started {
    int32_t n_past = 0;
    int32_t id = 0;
  };
  mutable std::optional<Started> started_;
  mutable bool queued_ = false;       // work on stream_ that no host call has waited for
  mutable bool logits_lost_ = false;  // a dropped started step overwrote d_last_'s logits
  // sample_and_continue: the sample's kernels are done (stream_), its SampleOut is on the host
  // (copy_stream_, off the path from the sample to the next step)
  Event sample_done_, sampled_;
  cudaStream_t copy_stream_ = nullptr;

  const float* d_last_ = nullptr;  // device logits of the last evaluated position
  mutable std::vector<float> last_host_;
  mutable bool last_host_valid_ = false;
  std::vector<float> all_host_;  // all_logits of the last eval
  size_t n_all_ = 0;
};

CudaEngine::CudaEngine(std::shared_ptr<const Model> model, int32_t ctx_size, int device,
                       const CudaEngineOptions& opt, CheckpointSink sink)
    : ctx_(cuda::CudaContext::acquire(device)),
      model_(std::move(model)),
      cfg_(model_->config),
      opt_(opt),
      sink_(std::move(sink)),
      device_(device) {
  if (sink_) opt_.use_graph = false;  // a traced step copies between its kernels
  if (cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 || cfg_.n_head % cfg_.n_head_kv != 0 ||
      cfg_.head_dim <= 0 || cfg_.head_dim > 256 || cfg_.n_rot % 2 != 0 ||
      cfg_.n_rot > cfg_.head_dim) {
    throw WorkerError(
        ErrorCode::ModelLoadFailed,
        "cuda backend: unsupported attention shape (n_head " + std::to_string(cfg_.n_head) +
            ", n_head_kv " + std::to_string(cfg_.n_head_kv) + ", head_dim " +
            std::to_string(cfg_.head_dim) + ", n_rot " + std::to_string(cfg_.n_rot) + ")");
  }
  if (opt_.max_batch < 1) opt_.max_batch = 1;
  if (opt_.upload_chunk_bytes < 4096) opt_.upload_chunk_bytes = 4096;
  n_ctx_ = resolve_ctx(cfg_, ctx_size);

  // Fail fast, before allocating anything, when the model cannot fit (M0-W-1020).
  const VramUsage need = cuda_engine_vram_estimate(*model_, ctx_size, opt_);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need.total() + kVramMargin > free_b) {
    throw WorkerError(ErrorCode::InsufficientVram,
                      "insufficient VRAM on GPU " + std::to_string(device) + " (" +
                          ctx_->props().name + ") for model " + model_->file->path() +
                          ": required " + std::to_string(need.total() + kVramMargin) +
                          " bytes (weights " + std::to_string(need.weights) + ", KV cache " +
                          std::to_string(need.kv_cache) + " for " + std::to_string(n_ctx_) +
                          " positions, scratch " + std::to_string(need.scratch) + ", reserve " +
                          std::to_string(kVramMargin) + "), available " + std::to_string(free_b) +
                          " of " + std::to_string(total_b) + " bytes");
  }

  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // D15 / M0-W-1031: no TF32 or reduced-precision shortcuts; deterministic algorithms.
  CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));

  upload_weights();
  setup_exact();

  const size_t KD = static_cast<size_t>(cfg_.n_head_kv * cfg_.head_dim);
  kv_layer_bytes_ = static_cast<size_t>(n_ctx_) * KD * (opt_.kv_cache_f32 ? 4 : 2);
  kv_ = DeviceBuffer(kv_bytes(cfg_, n_ctx_, opt_.kv_cache_f32), "KV cache");
  kv_base_ = static_cast<uint8_t*>(kv_.data());
  dec_.allocate(cfg_, 1, 1, exact_sizes(cfg_, 1, n_ctx_, true), "decode scratch");
  const int V = static_cast<int>(cfg_.vocab_size);
  const size_t sort_bytes = kern::sampling_sort_temp_bytes(V);
  samp_.buf = DeviceBuffer(SampleRegion::bytes(V, n_ctx_, sort_bytes), "sampling scratch");
  {
    Layout L(static_cast<uint8_t*>(samp_.buf.data()));
    SampleRegion::lay(L, V, n_ctx_, sort_bytes, &samp_);
  }
  kern::sampling_init(samp_.s, V, stream_);
  setup_decode_step();
  pin_io_ = PinnedBuffer(sizeof(int32_t) * (static_cast<size_t>(opt_.max_batch) + 1));
  pin_sample_ =
      PinnedBuffer(sizeof(kern::SampleParams) + sizeof(int32_t) * static_cast<size_t>(n_ctx_));
  pin_out_ = PinnedBuffer(sizeof(kern::SampleOut));
  last_host_.resize(static_cast<size_t>(V));
  CUDA_CHECK(cudaStreamSynchronize(stream_));

  if (!verify_residency()) {
    throw WorkerError(ErrorCode::CudaError, "VRAM residency check failed after load");
  }
}

CudaEngine::~CudaEngine() {
  if (queued_) (void)cudaStreamSynchronize(stream_);
  if (graph_exec_) (void)cudaGraphExecDestroy(graph_exec_);
  if (graph_) (void)cudaGraphDestroy(graph_);
  if (cublas_) (void)cublasDestroy(cublas_);
  if (copy_stream_) {
    (void)cudaStreamSynchronize(copy_stream_);  // a SampleOut copy left by a throw mid-call
    (void)cudaStreamDestroy(copy_stream_);
  }
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void CudaEngine::upload_weights() {
  const auto tensors = unique_weights(model_->weights);
  weights_ = Arena(weights_bytes(model_->weights), "model weights");
  // No per-chunk narration: model_load_progress is the loader's one 0..100 sequence
  // (M0-W-1621), and M0-W-1900 fixes the event names.
  const size_t chunk = opt_.upload_chunk_bytes;
  PinnedBuffer staging(2 * chunk);
  Event ev[2];
  bool pending[2] = {false, false};
  size_t k = 0;
  uint64_t total = 0, done = 0;
  for (const TensorInfo* t : tensors) total += t->nbytes;
  for (const TensorInfo* t : tensors) {
    auto* dst = static_cast<uint8_t*>(weights_.alloc(t->nbytes));
    dev_ptr_[t] = dst;
    // mmap -> pinned staging -> VRAM in bounded chunks, two staging slots in flight.
    for (size_t off = 0; off < t->nbytes; off += chunk, ++k) {
      const size_t n = std::min(chunk, t->nbytes - off);
      const int slot = static_cast<int>(k % 2);
      if (pending[slot]) CUDA_CHECK(cudaEventSynchronize(ev[slot].get()));
      uint8_t* stage = static_cast<uint8_t*>(staging.data()) + static_cast<size_t>(slot) * chunk;
      std::memcpy(stage, t->data + off, n);
      CUDA_CHECK(cudaMemcpyAsync(dst + off, stage, n, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaEventRecord(ev[slot].get(), stream_));
      pending[slot] = true;
      done += n;
      if (opt_.progress) opt_.progress(done, total);
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));

  tok_embd_ = view(model_->weights.token_embd);
  output_ = view(model_->weights.output);
  for (const auto& l : model_->weights.layers) {
    LayerDev d;
    d.wq = view(l.wq);
    d.wk = view(l.wk);
    d.wv = view(l.wv);
    d.wo = view(l.wo);
    d.gate = view(l.w_gate);
    d.up = view(l.w_up);
    d.down = view(l.w_down);
    layers_.push_back(d);
  }
}

kern::WeightView CudaEngine::view(const TensorInfo* t) const {
  kern::WeightView w;
  w.data = dev_ptr_.at(t);
  w.type = static_cast<uint32_t>(t->type);
  w.rows = t->rows();
  w.cols = t->row_len();
  w.row_bytes = t->row_bytes();
  return w;
}

bool CudaEngine::verify_residency() {
  std::string why;
  bool ok = true;
  const DeviceBuffer* fixed[] = {&weights_.buffer(), &kv_, &dec_.buf, &samp_.buf, &exact_vecs_};
  for (const DeviceBuffer* b : fixed) {
    if (*b && !cuda::is_device_resident(b->data(), device_, &why)) {
      ok = false;
      log::error("vram_residency_violation", {{"reason", why}});
    }
  }
  resident_.store(ok);
  return ok;
}

// The fast numerics' forward of a prompt batch: cuBLAS products for float weights from
// gemm_min_tokens tokens and the flash-attention kernel (FP16 cache; kernels/attention.cuh);
// the norms, SwiGLU and bias + RoPE + KV store are the exact kernels (one family of
// element-wise kernels for both numerics). Decode steps and the LM head run the exact kernels
// in both numerics.
void CudaEngine::forward(Scratch& s, int n) {
  namespace ex = kern::exact;
  const int E = static_cast<int>(cfg_.n_embd), QD = static_cast<int>(cfg_.n_head * cfg_.head_dim),
            F = static_cast<int>(cfg_.n_ff), KD = static_cast<int>(cfg_.n_head_kv * cfg_.head_dim);
  const float eps = cfg_.norm_eps;
  const kern::fast::Ctx c{cublas_, s.lowp, s.act, opt_.gemm_min_tokens};
  kern::embed(tok_embd_, s.io + 1, n, s.x, stream_);
  for (size_t il = 0; il < layers_.size(); ++il) {
    const LayerDev& L = layers_[il];
    const LayerVecs& V = xvec_[il];
    const int li = static_cast<int>(il);
    ex::rmsnorm(s.x, V.attn_norm, s.xn, n, E, eps, stream_);
    trace("attn_norm", li, s.xn, 0, n, E);
    kern::fast::qkv(c, L.wq, L.wk, L.wv, s.xn, n, s.q, s.k, s.v, stream_);
    attention_fast(s, il, n);
    trace("q", li, s.q, 0, n, QD);
    trace("k_cache", li, kc(il), 0, n, KD, true);
    trace("v_cache", li, vc(il), 0, n, KD, true);
    trace("attn_out", li, s.att, 0, n, QD);
    kern::fast::linear(c, L.wo, s.att, n, s.x, true, stream_);  // x += Wo att
    trace("ffn_inp", li, s.x, 0, n, E);
    ex::rmsnorm(s.x, V.ffn_norm, s.xn, n, E, eps, stream_);
    trace("ffn_norm", li, s.xn, 0, n, E);
    kern::fast::ffn(c, L.gate, L.up, L.down, s.xn, n, s.g, s.u, s.x, stream_);
    trace("ffn_act", li, s.g, 0, n, F);
    trace("l_out", li, s.x, 0, n, E);
  }
}

// Bias, RoPE and KV store of layer il (the exact kernel), then the fast attention (out: s.att).
void CudaEngine::attention_fast(Scratch& s, size_t il, int n) {
  namespace ex = kern::exact;
  const LayerVecs& V = xvec_[il];
  const ex::QkvIn x{s.q, s.k, s.v, V.bq, V.bk, V.bv};
  if (opt_.kv_cache_f32) {
    ex::bias_rope_store(x, shape_, rope_table_, n, s.io, static_cast<float*>(kc(il)),
                        static_cast<float*>(vc(il)), stream_);
  } else {
    ex::bias_rope_store(x, shape_, rope_table_, n, s.io, static_cast<uint16_t*>(kc(il)),
                        static_cast<uint16_t*>(vc(il)), stream_);
  }
  kern::attention(s.q, kc(il), vc(il), opt_.kv_cache_f32, s.att, n, shape_.n_head, shape_.n_head_kv,
                  shape_.head_dim, s.io, s.attn_part, stream_);
}

void CudaEngine::setup_exact() {
  const ModelWeights& w = model_->weights;
  exact_vecs_ = DeviceBuffer(exact_vector_bytes(w, cfg_, n_ctx_), "exact-mode vectors");
  std::vector<uint8_t> host(exact_vecs_.size());
  auto* base = static_cast<const uint8_t*>(exact_vecs_.data());
  std::map<const TensorInfo*, const float*> at;
  size_t off = 0;
  for (const TensorInfo* t : exact_vector_tensors(w)) {
    if (t == nullptr || at.count(t) != 0) continue;
    auto* dst = reinterpret_cast<float*>(host.data() + off);
    for (int64_t r = 0; r < t->rows(); ++r) {
      dequantize_row(t->type, t->row(r), dst + r * t->row_len(), t->row_len());
    }
    at[t] = reinterpret_cast<const float*>(base + off);
    off += align_up(static_cast<size_t>(t->n_elements()) * sizeof(float));
  }
  rope_table(n_ctx_, static_cast<int>(cfg_.n_rot), rope_theta_scale(cfg_.rope_base, cfg_.n_rot),
             reinterpret_cast<float*>(host.data() + off));
  rope_table_ = reinterpret_cast<const float*>(base + off);
  CUDA_CHECK(cudaMemcpy(exact_vecs_.data(), host.data(), host.size(), cudaMemcpyHostToDevice));
  auto get = [&](const TensorInfo* t) -> const float* { return t ? at.at(t) : nullptr; };
  out_norm_f32_ = get(w.output_norm);
  for (const auto& l : w.layers) {
    xvec_.push_back({get(l.attn_norm), get(l.ffn_norm), get(l.bq), get(l.bk), get(l.bv)});
  }
  shape_.n_head = static_cast<int>(cfg_.n_head);
  shape_.n_head_kv = static_cast<int>(cfg_.n_head_kv);
  shape_.head_dim = static_cast<int>(cfg_.head_dim);
  shape_.n_rot = static_cast<int>(cfg_.n_rot);
  shape_.neox = cfg_.rope_neox;
}

// Bias, RoPE, KV store and attention of layer il (out: s.att), and s.att rounded for Wo
// into s.act: one launch at decode.
void CudaEngine::attention_exact(Scratch& s, size_t il, int n, int n_keys) {
  namespace ex = kern::exact;
  const LayerDev& L = layers_[il];
  const LayerVecs& V = xvec_[il];
  ex::attention({s.q, s.k, s.v, V.bq, V.bk, V.bv}, shape_, rope_table_, n, s.io,
                {kc(il), vc(il), opt_.kv_cache_f32 ? ex::KvType::F32 : ex::KvType::F16}, s.att,
                n_keys, s.attn_scr, L.wo.type, s.act, stream_);
  s.act.holds(act_type_of(L.wo.type), s.att);
}

// CpuEngine::eval's sequence, op for op. last_only: the last layer's FFN runs for the last
// row only (the reference keeps only the output rows there, and with one row its matmuls
// take the one-token order).
void CudaEngine::forward_exact(Scratch& s, int n, bool last_only, int n_keys) {
  namespace ex = kern::exact;
  const int E = static_cast<int>(cfg_.n_embd), QD = static_cast<int>(cfg_.n_head * cfg_.head_dim),
            F = static_cast<int>(cfg_.n_ff), KD = static_cast<int>(cfg_.n_head_kv * cfg_.head_dim);
  const float eps = cfg_.norm_eps;
  kern::embed(tok_embd_, s.io + 1, n, s.x, stream_);
  for (size_t il = 0; il < layers_.size(); ++il) {
    const LayerDev& L = layers_[il];
    const LayerVecs& V = xvec_[il];
    const int li = static_cast<int>(il);
    ex::rmsnorm_act(s.x, V.attn_norm, s.xn, n, E, eps, L.wq.type, s.act, stream_);
    trace("attn_norm", li, s.xn, 0, n, E);
    ex::qkv(L.wq, L.wk, L.wv, s.xn, n, s.act, s.q, s.k, s.v, stream_);
    attention_exact(s, il, n, n_keys);
    trace("q", li, s.q, 0, n, QD);
    trace("k_cache", li, kc(il), 0, n, KD, true);
    trace("v_cache", li, vc(il), 0, n, KD, true);
    trace("attn_out", li, s.att, 0, n, QD);
    ex::linear(L.wo, s.att, n, s.act, s.x, true, stream_);  // x += Wo att
    trace("ffn_inp", li, s.x, 0, n, E);
    const int r0 = (last_only && il + 1 == layers_.size()) ? n - 1 : 0;
    const int nr = n - r0;
    float* xr = s.x + static_cast<size_t>(r0) * static_cast<size_t>(E);
    ex::rmsnorm_act(xr, V.ffn_norm, s.xn, nr, E, eps, L.gate.type, s.act, stream_);
    trace("ffn_norm", li, s.xn, r0, nr, E);
    ex::ffn(L.gate, L.up, L.down, s.xn, nr, s.act, s.g, s.u, static_cast<float*>(s.lowp), xr,
            stream_);  // x += Wdown SwiGLU(Wgate xn, Wup xn)
    trace("ffn_act", li, s.g, r0, nr, F);
    trace("l_out", li, xr, r0, nr, E);
  }
}

// Logits of rows first_row .. first_row + n_out - 1 of s.x: the final norm and the LM head
// as one batch of n_out rows (its order depends on n_out), computed rows_per_call rows at a
// time into s.logits; each piece is copied to host_out + r * vocab (when given) before the
// next overwrites it (same stream).
void CudaEngine::final_logits_exact(Scratch& s, int first_row, int n_out, int rows_per_call,
                                    float* host_out) {
  namespace ex = kern::exact;
  const int E = static_cast<int>(cfg_.n_embd);
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  ex::rmsnorm_act(s.x + static_cast<size_t>(first_row) * static_cast<size_t>(E), out_norm_f32_,
                  s.xn, n_out, E, cfg_.norm_eps, output_.type, s.act, stream_);
  trace("result_norm", -1, s.xn, first_row, n_out, E);
  for (int r = 0; r < n_out; r += rows_per_call) {
    const int rows = std::min(rows_per_call, n_out - r);
    ex::linear_rows(output_, s.act, r, rows, n_out, s.logits, stream_);
    if (host_out != nullptr) {
      CUDA_CHECK(cudaMemcpyAsync(host_out + static_cast<size_t>(r) * V, s.logits,
                                 sizeof(float) * V * static_cast<size_t>(rows),
                                 cudaMemcpyDeviceToHost, stream_));
    }
    d_last_ = s.logits + static_cast<size_t>(rows - 1) * V;
  }
}

// Tracing: `rows` rows of `width` floats at `dev` (cache: the KV cache rows at n_past, fp16
// unless kv_cache_f32) copied to the host and handed to the sink, one row per token, at
// positions n_past + pos_off.. (n_past from the step's pinned io buffer).
void CudaEngine::trace(const char* name, int layer, const void* dev, int pos_off, int rows,
                       int width, bool cache) {
  if (!sink_) return;
  const int32_t n_past = static_cast<const int32_t*>(pin_io_.data())[0];
  const bool f16 = cache && !opt_.kv_cache_f32;
  const size_t W = static_cast<size_t>(width), elt = f16 ? 2 : 4;
  const auto* src =
      static_cast<const uint8_t*>(dev) + (cache ? static_cast<size_t>(n_past) * W * elt : 0);
  std::vector<uint8_t> raw(static_cast<size_t>(rows) * W * elt);
  CUDA_CHECK(cudaMemcpyAsync(raw.data(), src, raw.size(), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<float> v(static_cast<size_t>(rows) * W);
  for (size_t i = 0; i < v.size(); ++i) {
    if (f16) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      v[i] = fp16_to_fp32(h);
    } else {
      std::memcpy(&v[i], raw.data() + 4 * i, 4);
    }
  }
  for (int r = 0; r < rows; ++r)
    sink_(name, layer, n_past + pos_off + r,
          std::span<const float>(v.data() + static_cast<size_t>(r) * W, W));
}

// The persistent decode step for this model, unless it does not qualify (then the decode
// step launches one kernel per op, forward_exact) or WORKER_DECODE_STEP=0.
void CudaEngine::setup_decode_step() {
  if (!opt_.decode_step || !kern::exact::decode_step_enabled()) {
    log::info("decode_step",
              {{"path", "per_op"},
               {"reason", opt_.decode_step ? "WORKER_DECODE_STEP=0" : "decode_step option off"}});
    return;
  }
  kern::exact::DecodeModel m;
  for (size_t il = 0; il < layers_.size(); ++il) {
    const LayerDev& L = layers_[il];
    const LayerVecs& V = xvec_[il];
    m.layers.push_back({L.wq,
                        L.wk,
                        L.wv,
                        L.wo,
                        L.gate,
                        L.up,
                        L.down,
                        V.attn_norm,
                        V.ffn_norm,
                        V.bq,
                        V.bk,
                        V.bv,
                        {kc(il), vc(il),
                         opt_.kv_cache_f32 ? kern::exact::KvType::F32 : kern::exact::KvType::F16}});
  }
  m.output = output_;
  m.output_norm = out_norm_f32_;
  m.shape = shape_;
  m.eps = cfg_.norm_eps;
  m.n_ctx = n_ctx_;
  m.rope_table = rope_table_;
  m.x = dec_.x;
  m.logits = dec_.logits;
  m.attn_scratch = dec_.attn_scr;
  m.d_n_past = dec_.io;
  m.device_mem = dec_.step_mem;
  std::string why;
  step_ = kern::exact::DecodeStep::plan(m, &why);
  if (step_) {
    if (const char* t = std::getenv("WORKER_DECODE_STEP_TRACE"); t != nullptr && *t != '\0') {
      step_->enable_trace();
      step_trace_path_ = t;
    }
    log::info("decode_step", {{"path", "persistent"},
                              {"blocks", std::to_string(step_->blocks())},
                              {"smem_bytes", std::to_string(step_->smem_bytes())}});
  } else {
    log::info("decode_step", {{"path", "per_op"}, {"reason", why}});
  }
}

// Profiling for kernel work (WORKER_DECODE_STEP_TRACE=file): the step's timestamps
// (DecodeStep::read_trace: uint64 [n_layer + 1][points][blocks]) appended to the file, one record
// per token after a header of {n_layer, points, blocks} as uint64 (bench/steptrace.py).
void CudaEngine::append_step_trace() const {
  const std::vector<uint64_t> t = step_->read_trace();
  std::FILE* f = std::fopen(step_trace_path_.c_str(), "ab");
  if (f == nullptr) {
    log::error("decode_step_trace", {{"path", step_trace_path_}, {"error", std::strerror(errno)}});
    return;
  }
  const uint64_t hdr[3] = {layers_.size(),
                           static_cast<uint64_t>(kern::exact::DecodeStep::trace_points()),
                           static_cast<uint64_t>(step_->blocks())};
  (void)std::fwrite(hdr, sizeof(hdr), 1, f);
  (void)std::fwrite(t.data(), sizeof(uint64_t), t.size(), f);
  (void)std::fclose(f);
}

void CudaEngine::decode_body(bool persistent) {
  if (persistent) {
    kern::embed(tok_embd_, dec_.io + 1, 1, dec_.x, stream_);
    step_->launch(stream_);
  } else {
    forward_exact(dec_, 1, true, n_ctx_);
    final_logits_exact(dec_, 0, 1, 1, nullptr);
  }
}

void CudaEngine::launch_decode(bool persistent) {
  if (persistent || !opt_.use_graph) {
    decode_body(persistent);
    return;
  }
  if (graph_exec_ == nullptr) {
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      decode_body(false);
    } catch (...) {
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(stream_, &g);
      if (g) (void)cudaGraphDestroy(g);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, graph_, 0));
  }
  CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
}

void CudaEngine::decode_one(int32_t token) {
  auto* io = static_cast<int32_t*>(pin_io_.data());
  io[0] = n_past_;
  io[1] = token;
  CUDA_CHECK(cudaMemcpyAsync(dec_.io, io, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  // The persistent step while its attention's local mode holds the keys; beyond, one kernel per
  // op (kernels/decode_step.cu says why), from its graph (captured at its first use).
  // Both numerics: the fast one differs in prompt batches only (its decode kernels were slower
  // than these on every type; perf-notes v20).
  const bool persistent = decode_persistent(n_past_);
  launch_decode(persistent);
  // The pinned step buffer is reused by the next call; errors surface here (M0-W-1420).
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  d_last_ = dec_.logits;
  if (!step_trace_path_.empty() && persistent) append_step_trace();
}

void CudaEngine::settle() const {
  if (started_) {
    started_.reset();
    if (d_last_ == dec_.logits) logits_lost_ = true;
  }
  if (queued_) {
    queued_ = false;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void CudaEngine::check_logits_kept(const char* what) const {
  settle();
  if (logits_lost_) {
    throw WorkerError(ErrorCode::Internal,
                      std::string(what) +
                          " after sample_and_continue() without the eval of the sampled token: "
                          "the step it started replaced the logits");
  }
}

// eval(); `meanwhile` (eval_overlapped) runs once the last chunk's work is queued, before the
// wait for it.
void CudaEngine::run_eval(std::span<const int32_t> tokens, bool all_logits,
                          const std::function<void()>* meanwhile) {
  check_eval_input(tokens, n_past_, n_ctx_, cfg_.vocab_size);
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (started_ && n == 1 && !all_logits && started_->n_past == n_past_ &&
      started_->id == tokens[0]) {
    // The step sample_and_continue() started for this token: it is this eval (still running;
    // the next sample queues behind it, anything else waits for it in settle()).
    started_.reset();
    last_host_valid_ = false;
    n_all_ = 0;
    d_last_ = dec_.logits;
    if (meanwhile != nullptr) (*meanwhile)();
    n_past_ += 1;
    return;
  }
  settle();
  logits_lost_ = false;
  last_host_valid_ = false;
  n_all_ = 0;
  if (n == 1 && !all_logits) {
    if (meanwhile != nullptr) (*meanwhile)();
    decode_one(tokens[0]);
    n_past_ += 1;
    return;
  }

  const int chunk = static_cast<int>(std::min<int64_t>(n, opt_.max_batch));
  if (batch_.B < chunk) {
    // Allocated once, at the full batch size the startup check counted, so VRAM use is
    // flat from the first prompt on. Failing here is this job's VRAM_OOM; nothing of the
    // engine's state has changed, and the next job tries again (M0-W-1021).
    const int B = std::max(1, std::min(opt_.max_batch, n_ctx_));
    batch_.buf.reset();
    batch_.B = 0;
    const ExactSizes ex = exact_sizes(cfg_, B, n_ctx_, opt_.exact);
    if (fault::inject_alloc_failure()) {  // WRK-D28, test-only: this cudaMalloc fails
      throw WorkerError(
          ErrorCode::VramOom,
          fault::injected_alloc_message(Scratch::bytes(cfg_, B, std::min(B, kLogitRows), ex),
                                        "prefill scratch"));
    }
    batch_.allocate(cfg_, B, std::min(B, kLogitRows), ex, "prefill scratch");
    std::string why;
    if (!cuda::is_device_resident(batch_.buf.data(), device_, &why)) {
      throw WorkerError(ErrorCode::CudaError, "prefill scratch not in VRAM: " + why);
    }
  }
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  if (all_logits) all_host_.resize(static_cast<size_t>(n) * V);
  auto* io = static_cast<int32_t*>(pin_io_.data());
  for (int64_t off = 0; off < n; off += chunk) {
    const int m = static_cast<int>(std::min<int64_t>(chunk, n - off));
    io[0] = n_past_ + static_cast<int32_t>(off);
    std::memcpy(io + 1, tokens.data() + off, sizeof(int32_t) * static_cast<size_t>(m));
    CUDA_CHECK(cudaMemcpyAsync(batch_.io, io, sizeof(int32_t) * (static_cast<size_t>(m) + 1),
                               cudaMemcpyHostToDevice, stream_));
    if (opt_.exact) {
      // Earlier chunks' last-layer FFN outputs are never read: only their KV entries are.
      forward_exact(batch_, m, !all_logits, n_past_ + static_cast<int>(off) + m);
    } else {
      forward(batch_, m);
    }
    if (all_logits) {
      final_logits_exact(batch_, 0, m, batch_.logit_rows,
                         all_host_.data() + static_cast<size_t>(off) * V);
    } else if (off + m == n) {
      final_logits_exact(batch_, m - 1, 1, 1, nullptr);
    }
    if (meanwhile != nullptr && off + m == n) {
      try {
        (*meanwhile)();
      } catch (...) {
        (void)cudaStreamSynchronize(stream_);  // the pinned io buffer is reused by the next eval
        throw;
      }
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  if (all_logits) n_all_ = static_cast<size_t>(n);
  n_past_ += static_cast<int32_t>(n);
}

std::span<const float> CudaEngine::logits() const {
  if (d_last_ == nullptr) throw WorkerError(ErrorCode::Internal, "logits() before any eval");
  check_logits_kept("logits()");
  if (!last_host_valid_) {
    CUDA_CHECK(cudaMemcpy(last_host_.data(), d_last_, sizeof(float) * last_host_.size(),
                          cudaMemcpyDeviceToHost));
    last_host_valid_ = true;
  }
  return {last_host_.data(), last_host_.size()};
}

std::span<const float> CudaEngine::logits_at(size_t i) const {
  check_logits_kept("logits_at()");
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  if (n_all_ > 0) {
    if (i >= n_all_) {
      throw WorkerError(ErrorCode::Internal, "logits_at(" + std::to_string(i) + "): only " +
                                                 std::to_string(n_all_) + " positions kept");
    }
    return {all_host_.data() + i * V, V};
  }
  if (i == 0) return logits();
  throw WorkerError(ErrorCode::Internal,
                    "logits_at(" + std::to_string(i) +
                        "): only the last position kept (eval with all_logits for every position)");
}

void CudaEngine::queue_sample(const SamplingParams& params, std::span<const int32_t> history,
                              std::mt19937_64& rng, int32_t* feed_io) {
  if (d_last_ == nullptr) throw WorkerError(ErrorCode::Internal, "sample() before any eval");
  check_sampling_params(params);
  // A step started by sample_and_continue() and not taken replaced the logits; a taken one is
  // still running, and this queues behind it.
  if (started_ || logits_lost_) check_logits_kept("sample()");
  if (history.size() > static_cast<size_t>(n_ctx_))
    history = history.last(static_cast<size_t>(n_ctx_));
  const bool greedy = !(params.temperature > 0.0f);
  const bool penalize = params.repetition_penalty != 1.0f && !history.empty();
  // Same stream of draws as the CPU sampler: one per non-greedy token.
  const uint64_t draw = greedy ? 0 : sampler_draw(rng);
  if (!greedy || penalize) {  // the greedy kernels without a penalty read no parameters
    auto* p = static_cast<kern::SampleParams*>(pin_sample_.data());
    p->temperature = params.temperature;
    p->top_p = params.top_p;
    p->min_p = params.min_p;
    p->repetition_penalty = params.repetition_penalty;
    p->top_k = params.top_k;
    p->n_history = static_cast<int32_t>(history.size());
    p->draw = draw;
    auto* h = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(pin_sample_.data()) +
                                         sizeof(kern::SampleParams));
    std::memcpy(h, history.data(), history.size_bytes());
    CUDA_CHECK(cudaMemcpyAsync(samp_.params, pin_sample_.data(),
                               sizeof(kern::SampleParams) + history.size_bytes(),
                               cudaMemcpyHostToDevice, stream_));
  }
  kern::sample(d_last_, static_cast<int>(cfg_.vocab_size), samp_.params, greedy, penalize,
               samp_.history, samp_.s, {samp_.out, feed_io, n_past_}, stream_);
}

int32_t CudaEngine::read_sample(uint64_t* logits_hash) const {
  const auto* out = static_cast<const kern::SampleOut*>(pin_out_.data());
  if (logits_hash) *logits_hash = out->logits_hash;
  return out->id;
}

int32_t CudaEngine::sample(const SamplingParams& params, std::span<const int32_t> history,
                           std::mt19937_64& rng, uint64_t* logits_hash) {
  queue_sample(params, history, rng, nullptr);
  CUDA_CHECK(cudaMemcpyAsync(pin_out_.data(), samp_.out, sizeof(kern::SampleOut),
                             cudaMemcpyDeviceToHost, stream_));
  queued_ = false;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return read_sample(logits_hash);
}

// The sampling as sample(), then, queued behind it before the wait, the decode step of the
// sampled token (the sample's last kernel writes it into the step's io from the device). The
// SampleOut goes to the host on copy_stream_, so nothing sits between the sample's kernels and
// the step on stream_; the wait is for that copy only: the step runs while the caller handles
// the id. samp_.out is next written by the next sample, queued after this wait.
int32_t CudaEngine::sample_and_continue(const SamplingParams& params,
                                        std::span<const int32_t> history, std::mt19937_64& rng,
                                        uint64_t* logits_hash) {
  // Traced steps copy between their kernels, and the context's last position has no next one.
  if (sink_ || !step_trace_path_.empty() || n_past_ >= n_ctx_) {
    return sample(params, history, rng, logits_hash);
  }
  queue_sample(params, history, rng, dec_.io);
  CUDA_CHECK(cudaEventRecord(sample_done_.get(), stream_));
  CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, sample_done_.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(pin_out_.data(), samp_.out, sizeof(kern::SampleOut),
                             cudaMemcpyDeviceToHost, copy_stream_));
  CUDA_CHECK(cudaEventRecord(sampled_.get(), copy_stream_));
  launch_decode(decode_persistent(n_past_));
  queued_ = true;
  CUDA_CHECK(cudaEventSynchronize(sampled_.get()));
  const int32_t id = read_sample(logits_hash);
  started_ = Started{n_past_, id};
  return id;
}

}  // namespace

VramUsage cuda_engine_vram_estimate(const Model& model, int32_t ctx_size,
                                    const CudaEngineOptions& options) {
  const ModelConfig& c = model.config;
  const int32_t n_ctx = resolve_ctx(c, ctx_size);
  const int V = static_cast<int>(c.vocab_size);
  const int B = std::max(1, std::min(options.max_batch, n_ctx));
  VramUsage u;
  const bool ex = options.exact;
  u.weights = weights_bytes(model.weights);
  u.kv_cache = kv_bytes(c, n_ctx, options.kv_cache_f32);
  u.scratch = Scratch::bytes(c, 1, 1, exact_sizes(c, 1, n_ctx, true)) +
              Scratch::bytes(c, B, std::min(B, kLogitRows), exact_sizes(c, B, n_ctx, ex)) +
              SampleRegion::bytes(V, n_ctx, kern::sampling_sort_temp_bytes(V)) +
              align_up(exact_vector_bytes(model.weights, c, n_ctx));
  return u;
}

std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                         int gpu_device, const CudaEngineOptions& options) {
  if (!model) throw WorkerError(ErrorCode::Internal, "make_cuda_engine: no model");
  return std::make_unique<CudaEngine>(std::move(model), ctx_size, gpu_device, options, nullptr);
}

std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                         int gpu_device, const CudaEngineOptions& options,
                                         CheckpointSink sink) {
  if (!model) throw WorkerError(ErrorCode::Internal, "make_cuda_engine: no model");
  return std::make_unique<CudaEngine>(std::move(model), ctx_size, gpu_device, options,
                                      std::move(sink));
}

std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                         int gpu_device) {
  return make_cuda_engine(std::move(model), ctx_size, gpu_device, CudaEngineOptions{});
}

}  // namespace worker
