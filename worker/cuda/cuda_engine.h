#pragma once
// The CUDA backend (the product): weights in VRAM in their stored format.
#include <cstddef>

#include "engine/engine.h"

namespace worker {
// Throws WorkerError (CUDA_ERROR when no device, INSUFFICIENT_VRAM with required vs
// available bytes when the model does not fit).
std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                         int gpu_device);

// Tuning and test knobs of the CUDA backend; the defaults are the product's settings.
struct CudaEngineOptions {
  size_t upload_chunk_bytes = 1024 * 1024;  // M0-W-1222: bounded host->device chunks
  // Replay the per-op decode step (past the persistent step's keys) as a captured CUDA graph;
  // the persistent step is two direct launches either way.
  bool use_graph = true;
  int gemm_min_tokens = 16;  // prefill batches from this size use cuBLAS (float weights)
  int max_batch = 512;       // prefill chunk size (bounds the activation scratch)
  // FP32 instead of FP16 KV cache. The product uses FP16 (M0-W-1201, llama.cpp's default);
  // with exact numerics the CPU reference's matching mode is CpuEngineOptions::kv_f16.
  bool kv_cache_f32 = false;
  // Exact numerics (the default): every op computes bit for bit the floats of the CPU
  // reference (and so of llama.cpp's CPU backend) with the kernels of kernels/exact.cuh: the
  // CPU reference with kv_f16 for the FP16 cache, without for kv_cache_f32. Logits and greedy
  // continuations equal the CPU backend's. false: prompt batches take cuBLAS products of float
  // weights and the flash-attention kernel (other summation orders), whose logits differ from
  // the reference in the last bits (bounds in worker/cuda/tests/cuda_engine_test.cpp); their
  // norms, SwiGLU and RoPE, the decode steps and the LM head are the exact kernels.
  bool exact = true;
  // Both numerics: the decode step as one persistent kernel (kernels/decode_step.cuh) where
  // the model qualifies (float weights of one type; BackendInfo::decode says which ran), the
  // same bits as one kernel per op (false, or WORKER_DECODE_STEP=0 in the environment).
  bool decode_step = true;
  LoadProgress progress;  // weight bytes uploaded so far (the terminal progress line)
};
std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                         int gpu_device, const CudaEngineOptions& options);
// Traced (`worker-orcd trace`): `sink` gets the CPU reference's checkpoints (engine.h) that the
// kernels expose, each op's output copied to the host when it finishes; the decode step then
// runs without its CUDA graph. Fused ops report their outputs only (k and v: as cached).
std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                         int gpu_device, const CudaEngineOptions& options,
                                         CheckpointSink sink);

// Bytes the engine would allocate for this model and context (weights, KV cache,
// activations): what the INSUFFICIENT_VRAM check compares with cudaMemGetInfo's free bytes.
VramUsage cuda_engine_vram_estimate(const Model& model, int32_t ctx_size,
                                    const CudaEngineOptions& options = {});
}  // namespace worker
