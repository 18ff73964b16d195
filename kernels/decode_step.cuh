#pragma once
// The exact decode step as one persistent kernel (decode_step.cu): every layer's RMSNorm,
// Q/K/V, attention, Wo, RMSNorm, gate + up + SwiGLU, down, then the final norm and the LM head,
// in one launch of one block per SM. Ops are separated by counters in global memory instead
// of kernel boundaries, and each block's share of the next ops' weights is copied into its
// shared memory while it waits. The arithmetic is the exact kernels' per-thread code
// (exact_float_rows.cuh, attention_exact_decode.cuh, exact_ops_math.cuh): the same bits as
// the launch-per-op decode step, which the engine tests compare with the CPU reference.
//
// Runs models whose layer matrices and output matrix are all one float type (F32, F16, BF16),
// or quantized with a type per matrix: Q8_0 / Q5_0 (the input quantized to Q8_0 in shared
// memory by every block, the rows' 8 lane chains of dot_q0_lanes), and FFN down also Q4_K /
// Q6_K (its input quantized to Q8_K, the long rows of matvec1_quant: qd::long_row_dots):
// llama.cpp's Q4_K_M of a model whose rows of n_embd columns are no multiple of 256 (Qwen2.5
// 0.5B). DecodeStep::plan() says whether a model qualifies on this device.
//
// The kernel needs all of its blocks (one per SM) resident at once: one step in flight per
// device (the worker's one inference thread, which waits for each step). Were SMs withheld (two
// engines' steps concurrently on one device in one process, an MPS limit), blocks would wait
// for counters that never complete: the kernel then traps after 5 s and the step fails with a
// CUDA error instead of hanging.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <string>
#include <vector>

#include "act_round.cuh"
#include "attention_exact.cuh"
#include "weights.cuh"  // WeightView

namespace worker::kern::exact {

// One layer's tensors (device memory); norms as FP32.
struct DecodeLayer {
  WeightView wq, wk, wv, wo, gate, up, down;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* bq = nullptr;  // biases or nullptr
  const float* bk = nullptr;
  const float* bv = nullptr;
  KvCache kv;
};

// The model and the decode scratch (device memory, fixed addresses: the step is replayed as a
// CUDA graph).
struct DecodeModel {
  std::vector<DecodeLayer> layers;
  WeightView output;
  const float* output_norm = nullptr;
  AttnShape shape;
  float eps = 0.0f;
  int n_ctx = 0;
  const float* rope_table = nullptr;
  // scratch
  // [n_embd] the embedding of the step's token (embed writes it before the step); the step's
  // own activations are tagged values in device_mem
  float* x = nullptr;
  float* logits = nullptr;  // [vocab]
  float* attn_scratch = nullptr;
  const int32_t* d_n_past = nullptr;
  // DecodeStep::device_bytes(layers.size(), n_head, n_embd, n_ff, n_q, n_kv) bytes, 256-aligned,
  // for the step's tables
  void* device_mem = nullptr;
};

class DecodeStep {
 public:
  // Device memory the step needs for n_layer layers of n_head heads (its layer table, counters
  // and tagged x, Q/K/V, attention and SwiGLU outputs; n_q = n_head * head_dim, n_kv = n_head_kv
  // * head_dim); the caller provides it as DecodeModel::device_mem and counts it as scratch.
  static size_t device_bytes(int n_layer, int n_head, int n_embd, int n_ff, int n_q, int n_kv);
  // A plan for `m` on the current device, or nullptr with *why set when the model does not
  // qualify (weight types, shapes, shared memory).
  static std::unique_ptr<DecodeStep> plan(const DecodeModel& m, std::string* why);
  ~DecodeStep();
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;
  // Launches the step (after the embedding of this step's token into m.x, on the same
  // stream); the logits land in m.logits.
  void launch(cudaStream_t stream) const;
  // Profiling for kernel work: every later launch records, per block, %globaltimer at 21
  // points of each layer (after each wait, norm and product, the attention's phases and its own
  // scores before their exchange, Wo's and down's staged input, down's quantized input;
  // [layer][point][block]) and 3 of the LM
  // head (layer n_layer); read_trace() returns the last launch's.
  void enable_trace();
  std::vector<uint64_t> read_trace() const;
  static int trace_points();  // points a layer (21)
  int blocks() const { return blocks_; }
  size_t smem_bytes() const { return smem_; }
  // The step may be launched while n_past + 1 <= local_keys() (the attention's local mode);
  // it traps beyond.
  int local_keys() const { return local_keys_; }

 private:
  DecodeStep() = default;
  struct Impl;
  Impl* impl_ = nullptr;
  int blocks_ = 0;
  size_t smem_ = 0;
  int local_keys_ = 0;
};

// WORKER_DECODE_STEP=0 in the environment turns the persistent decode step off (A/B
// measurements); read once.
bool decode_step_enabled();

// How the step copies a block's rows of a matrix into shared memory (decode_step.cu; here for
// its host test, DecodeStepHost.*).
namespace step {
__host__ __device__ constexpr size_t align16(size_t n) {
  return (n + 15) & ~size_t{15};
}
// A block's rows [r0, r1) of a matrix of rb bytes a row as the bulk copy moves them: the
// 16-byte units that hold them, `bytes` from byte `lo` of the matrix, row r0 at byte `off` of
// the copy (0 when rows are multiples of 16 bytes). The matrices lie in the weights' arena,
// which aligns every tensor to 256 bytes (worker/cuda/device_buffer.h): the unit that holds a
// matrix's last byte is inside the allocation.
struct Span {
  size_t lo;
  unsigned bytes, off;
};
__host__ __device__ inline Span span_of(size_t rb, int r0, int r1) {
  if (r1 <= r0) return {0, 0, 0};
  const size_t a = static_cast<size_t>(r0) * rb, b = static_cast<size_t>(r1) * rb;
  const size_t lo = a & ~size_t{15};
  return {lo, static_cast<unsigned>(align16(b) - lo), static_cast<unsigned>(a - lo)};
}
// Shared bytes of the slot a copy of n rows lands in: exactly the rows when they are
// multiples of 16 bytes (consecutive slots are then one tile), else the units with the
// start's offset and 16 bytes past the end (qd::rd32 reads the word after a row's last).
__host__ __device__ inline size_t slot_bytes(int n, size_t rb) {
  if (n <= 0) return 0;
  return rb % 16 == 0 ? static_cast<size_t>(n) * rb : align16(static_cast<size_t>(n) * rb) + 32;
}

// The persistent step's dynamic shared memory (DecodeStep::plan; the kernel's use of it in
// decode_step.cu's file comment). Regions, as byte ranges from 0:
//   P = [0, p_b):          Wo's tile [0, wo_b), then Q/K/V's [wo_b, wo_b + qkv_b) and the
//                          attention's arrays [wo_b, wo_b + dec_smem_b) over it; later the
//                          down tile [0, down_b) and a K-quant down's slot arrays
//                          [sf_at, sf_at + sf_b), which may run on into G
//   G = [p_b, p_b + gu_b): gate's and up's tiles
//   the attention's K / V stage [kst_at, kst_at + kst_b): after Wo, Q/K/V and the attention's
//                          arrays (all live while it is copied), over the rest of P and G
//   the LM head's ring [0, lm_stages * slot) over P and G after the last layer
//   XS = [pg, pg + xs_b):  the op's input (floats, then Q8_0 / Q8_K quants, scales, sums)
//   [pg + xs_b, smem):     the block's rows of x and gate / up dots (rx_b), every layer's Shape
struct SmemIn {
  int blocks = 0;                        // G: one block an SM
  int64_t E = 0, QD = 0, KD = 0, F = 0;  // n_embd, q, k / v and FFN widths
  size_t rb_q = 0, rb_k = 0, rb_v = 0, rb_o = 0, rb_gate = 0, rb_up = 0, rb_down = 0;  // bytes a
                                                                                       // row (max)
  size_t rb_out = 0;       // the output matrix's row
  bool quant = false;      // quantized weights (Q8_0 / Q5_0 input quants, padded slots)
  bool kdown = false;      // a K-quant FFN down (Q8_K input, long_row_dots' slot arrays)
  size_t long_unit_b = 0;  // kdown: slot bytes a (row, 32-unit) of long_row_dots
  int n_layer = 0;
  size_t shape_b = 0;     // bytes of one layer's Shape
  size_t dec_smem_b = 0;  // sizeof(DecSmem)
  size_t kv_stage_b = 0;  // the attention's K / V stage (dec_kv_stage_bytes; 0: none)
  size_t static_b = 0;    // the kernel's static shared memory
  int min_lm_rows = 8, max_lm_stages = 8;
  size_t optin = 0;  // shared memory a block may opt in to
};
struct SmemLayout {
  size_t wo_b, qkv_b, down_b, p_b, gu_b, kst_at, kst_b, sf_at, sf_b, pg;
  size_t xf_b, aq_b, ad_b, abs_b, xs_b, rx_b, res_b;
  int lm_rows, lm_stages;
  size_t slot;  // one LM-head stage
  size_t smem;  // dynamic bytes: pg + xs_b + res_b
  bool fits;    // at least 2 LM-head stages and smem + static_b <= optin
};
inline SmemLayout smem_layout(const SmemIn& in) {
  SmemLayout o{};
  const int64_t G = in.blocks;
  const auto share = [G](int64_t rows) { return static_cast<int>((rows + G - 1) / G); };
  const auto mx = [](size_t a, size_t b) { return a > b ? a : b; };
  o.wo_b = align16(slot_bytes(share(in.E), in.rb_o));
  const size_t rb_qkv = mx(in.rb_q, mx(in.rb_k, in.rb_v));
  // (quantized: each of the three slots rounds up to 16 bytes and adds 32)
  o.qkv_b = align16(slot_bytes(share(in.QD + 2 * in.KD), rb_qkv) + (in.quant ? 3 * 48 : 0));
  o.down_b = align16(slot_bytes(share(in.E), in.rb_down));
  const size_t att_b = mx(o.qkv_b, align16(in.dec_smem_b));
  o.p_b = mx(o.down_b, o.wo_b + att_b);
  o.kst_at = o.wo_b + att_b;
  o.kst_b = in.kv_stage_b;
  o.gu_b =
      align16(slot_bytes(share(in.F), in.rb_gate)) + align16(slot_bytes(share(in.F), in.rb_up));
  o.sf_at = o.down_b + 32;  // 32: qd::rd32's reads past the down tile's last row
  o.sf_b = in.kdown
               ? static_cast<size_t>(share(in.E)) * static_cast<size_t>(in.F / 32) * in.long_unit_b
               : 0;
  const size_t widest = static_cast<size_t>(in.E > in.QD ? (in.E > in.F ? in.E : in.F)
                                                         : (in.QD > in.F ? in.QD : in.F));
  o.xf_b = align16(widest * sizeof(float));
  o.aq_b = in.quant ? align16(widest) : 0;  // the input's quants, scales, sums of 16
  o.ad_b = in.quant ? align16(widest / 32 * sizeof(float)) : 0;
  o.abs_b = in.kdown ? align16(static_cast<size_t>(in.F) / 16 * sizeof(int32_t)) : 0;
  o.xs_b = o.xf_b + o.aq_b + o.ad_b + o.abs_b;
  o.rx_b = align16(static_cast<size_t>(share(in.E) + 2 * share(in.F)) * sizeof(float));
  o.res_b = o.rx_b + align16(static_cast<size_t>(in.n_layer) * in.shape_b);  // then the Shapes
  // The LM head's ring takes the P and G regions: as many stages as fit, at least 2, of the
  // most rows (64, 32, 16 or 8) of which 3 fit: each stage costs a wait, a barrier and a copy
  // issue besides its rows (8-row stages of F16 rows measured 97 us for the 0.5B shape's 272
  // MB, 2.8 TB/s; perf-notes v27).
  const size_t fixed = in.static_b + o.xs_b + o.res_b;
  const size_t room = in.optin - (fixed < in.optin ? fixed : in.optin);
  o.lm_rows = 64;
  while (o.lm_rows > in.min_lm_rows && room / align16(slot_bytes(o.lm_rows, in.rb_out)) < 3) {
    o.lm_rows /= 2;
  }
  o.slot = align16(slot_bytes(o.lm_rows, in.rb_out));
  const size_t stages = room / o.slot;
  o.lm_stages =
      static_cast<int>(stages < static_cast<size_t>(in.max_lm_stages) ? stages : in.max_lm_stages);
  const size_t ring = static_cast<size_t>(o.lm_stages > 2 ? o.lm_stages : 2) * o.slot;
  o.pg = align16(mx(mx(o.p_b + o.gu_b, o.sf_at + o.sf_b), mx(o.kst_at + o.kst_b, ring)));
  o.smem = o.pg + o.xs_b + o.res_b;
  o.fits = o.lm_stages >= 2 && o.smem + in.static_b <= in.optin;
  return o;
}
}  // namespace step

}  // namespace worker::kern::exact
