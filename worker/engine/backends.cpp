#include "common/errors.h"
#include "engine/cpu/cpu_engine.h"
#include "engine/engine.h"
#ifdef WORKER_HAVE_CUDA
#include "cuda/cuda_engine.h"
#endif

namespace worker {

std::unique_ptr<Engine> make_engine(const std::string& backend, std::shared_ptr<const Model> model,
                                    int32_t ctx_size, int gpu_device, bool fast_numerics) {
  if (backend == "cpu") return make_cpu_engine(std::move(model), ctx_size);
  if (backend == "cuda") {
#ifdef WORKER_HAVE_CUDA
    CudaEngineOptions opt;
    opt.exact = !fast_numerics;
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
