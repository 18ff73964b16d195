#include <algorithm>

#include "common/errors.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/engine.h"
#ifdef WORKER_HAVE_CUDA
#include "cuda/cuda_engine.h"
#endif

namespace worker {
namespace {

volatile uint8_t g_page_sink;  // keeps the page-in reads from being optimised away

// The cpu backend computes from the file mapping: reading every page of the tensor data once
// makes the weights resident at ready, as the cuda upload does, and counts the bytes.
void page_in(const GgufFile& file, const LoadProgress& progress) {
  constexpr size_t kPage = 4096, kReport = size_t{1} << 20;
  uint64_t total = 0, done = 0;
  for (const TensorInfo& t : file.tensors()) total += t.nbytes;
  uint8_t acc = 0;
  for (const TensorInfo& t : file.tensors()) {
    for (size_t off = 0; off < t.nbytes; off += kReport) {
      const size_t n = std::min(kReport, t.nbytes - off);
      for (size_t p = 0; p < n; p += kPage) acc ^= t.data[off + p];
      done += n;
      if (progress) progress(done, total);
    }
  }
  g_page_sink = acc;
}

}  // namespace

std::unique_ptr<Engine> make_engine(const std::string& backend, std::shared_ptr<const Model> model,
                                    int32_t ctx_size, int gpu_device, bool fast_numerics,
                                    const std::string& kv_cache, const LoadProgress& progress) {
  if (!kv_cache.empty() && kv_cache != "f16" && kv_cache != "f32")
    throw WorkerError(ErrorCode::InvalidRequest,
                      "unknown KV cache type '" + kv_cache + "' (f16 | f32)");
  if (backend == "cpu") {
    page_in(*model->file, progress);
    CpuEngineOptions opt;
    opt.kv_f16 = kv_cache != "f32";
    return make_cpu_engine(std::move(model), ctx_size, nullptr, opt);
  }
  if (backend == "cuda") {
#ifdef WORKER_HAVE_CUDA
    CudaEngineOptions opt;
    opt.exact = !fast_numerics;
    opt.kv_cache_f32 = kv_cache == "f32";
    opt.progress = progress;
    return make_cuda_engine(std::move(model), ctx_size, gpu_device, opt);
#else
    (void)gpu_device;
    (void)fast_numerics;
    (void)progress;
    throw WorkerError(ErrorCode::CudaError,
                      "this worker was built without the CUDA backend; use --backend cpu "
                      "explicitly or rebuild with CUDA");
#endif
  }
  throw WorkerError(ErrorCode::InvalidRequest, "unknown backend '" + backend + "' (cpu | cuda)");
}

}  // namespace worker
