// Exact one-token products vs the CPU reference, bit for bit. (Being written.)
#include <gtest/gtest.h>
