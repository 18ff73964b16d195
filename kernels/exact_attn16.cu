// Exact attention over an FP16 KV cache, see exact.cuh. (Being written.)
#include "exact.cuh"
