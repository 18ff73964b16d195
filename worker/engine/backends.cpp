#include "common/errors.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/engine.h"
#ifdef WORKER_HAVE_CUDA
#include "cuda/cuda_engine.h"
#endif

namespace worker {

std::unique_ptr<Engine> make_engine(const std::string& backend, std::shared_ptr<const Model> model,
                                    int32_t ctx_size, int gpu_device, bool fast_numerics,
                                    const std::string& kv_cache) {
  if (!kv_cache.empty() && kv_cache != "f16" && kv_cache != "f32")
    throw WorkerError(ErrorCode::InvalidRequest,
                      "unknown KV cache type '" + kv_cache + "' (f16 | f32)");
  if (backend == "cpu") {
    CpuEngineOptions opt;
    opt.kv_f16 = kv_cache == "f16";
    return make_cpu_engine(std::move(model), ctx_size, nullptr, opt);
  }
  if (backend == "cuda") {
#ifdef WORKER_HAVE_CUDA
    CudaEngineOptions opt;
    opt.exact = !fast_numerics;
    opt.kv_cache_f32 = kv_cache == "f32";
    return make_cuda_engine(std::move(model), ctx_size, gpu_device, opt);
#else
    (void)gpu_device;
    (void)fast_numerics;
    throw WorkerError(ErrorCode::CudaError,
                      "this worker was built without the CUDA backend; use --backend cpu "
                      "explicitly or rebuild with CUDA");
#endif
  }
  throw WorkerError(ErrorCode::InvalidRequest, "unknown backend '" + backend + "' (cpu | cuda)");
}

}  // namespace worker
