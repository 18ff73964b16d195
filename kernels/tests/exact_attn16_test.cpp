// Exact FP16-KV attention against the CPU reference's F16-KV mode, bit for bit. (Being written.)
#include <gtest/gtest.h>
