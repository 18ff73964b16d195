#pragma once
// The CUDA backend (the product): weights in VRAM in their stored format.
#include "engine/engine.h"

namespace worker {
// Throws WorkerError (CUDA_ERROR when no device, INSUFFICIENT_VRAM with required vs
// available bytes when the model does not fit).
std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<const Model> model, int32_t ctx_size,
                                         int gpu_device);
}
