// Exact quantized prompt GEMM against the CPU reference, bit for bit. (Being written.)
#include <gtest/gtest.h>
