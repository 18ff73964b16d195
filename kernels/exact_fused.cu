// Exact fused kernels, see exact.cuh. (Being written.)
#include "exact.cuh"
