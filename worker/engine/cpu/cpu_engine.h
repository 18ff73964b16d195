#pragma once
// The CPU reference backend: FP32 math, weights read in place from the mapping.
#include "engine/engine.h"

namespace worker {
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const Model> model, int32_t ctx_size);
}
