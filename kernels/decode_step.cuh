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
  float* x = nullptr;  // [n_embd] the residual stream (embed writes it before the step)
  float *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr;
  float* act_att = nullptr;  // [n_head * head_dim] attention output rounded for Wo
  float* act_g = nullptr;    // [n_ff] SwiGLU output rounded for down
  float* logits = nullptr;   // [vocab]
  float* attn_scratch = nullptr;
  const int32_t* d_n_past = nullptr;
  // DecodeStep::device_bytes(layers.size()) bytes, 256-aligned, for the step's tables
  void* device_mem = nullptr;
};

class DecodeStep {
 public:
  // Device memory the step needs for n_layer layers (its layer table and counters; the
  // caller provides it as DecodeModel::device_mem and counts it as scratch).
  static size_t device_bytes(int n_layer);
  // A plan for `m` on the current device, or nullptr with *why set when the model does not
  // qualify (weight types, shapes, shared memory).
  static std::unique_ptr<DecodeStep> plan(const DecodeModel& m, std::string* why);
  ~DecodeStep();
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;
  // Launches the step (after the embedding of this step's token into m.x, on the same
  // stream); the logits land in m.logits.
  void launch(cudaStream_t stream) const;
  // Profiling for kernel work: every later launch records, per block, %globaltimer at 19
  // points of each layer (after each wait, norm and product, the attention's phases, and
  // down's staged and quantized input; [layer][point][block]) and 3 of the LM head (layer
  // n_layer); read_trace() returns the last launch's.
  void enable_trace();
  std::vector<uint64_t> read_trace() const;
  static int trace_points();  // points a layer (19)
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
}  // namespace step

}  // namespace worker::kern::exact
