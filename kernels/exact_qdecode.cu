// Exact one-token products, see exact.cuh. (Being written.)
#include "exact.cuh"
