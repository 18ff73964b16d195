// Exact quantized prompt GEMM, see exact.cuh. (Being written.)
#include "exact.cuh"
