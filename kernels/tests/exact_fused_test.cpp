// Exact fused kernels against the unfused exact kernels and the CPU reference, bit for bit. (Being written.)
#include <gtest/gtest.h>
