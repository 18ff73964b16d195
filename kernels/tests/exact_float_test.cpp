// Exact kernels against the CPU reference, bit for bit (see kernels/exact.cuh). (Being written.)
#include <gtest/gtest.h>
