#pragma once
// Random valid weights for the exact-kernel tests (exact_quant, exact_qgemm, exact_qdecode)
// and bench/kernel_bench: F32 / F16 / BF16 values in [-0.05, 0.05); random quants, fp16
// scales in a sane range (random bytes there would be NaN / Inf / huge), a few negative
// scales, Q4_K random 6-bit scales and mins (any 12 bytes are valid). Deterministic per seed.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/test_helpers.h"
#include "gguf/ggml_types.h"

namespace worker::exacttest {

using test::XorShift;

inline void put_half(uint8_t* p, float f) {
  const uint16_t h = fp32_to_fp16(f);
  std::memcpy(p, &h, 2);
}

// ggml_range: Q8_0 / Q6_K quants -128 replaced by -127, as ggml writes them; false keeps
// -128 in some blocks (a kernel must not assume the range).
inline std::vector<uint8_t> random_weights(GgmlType type, int64_t rows, int64_t cols, uint64_t seed,
                                           bool ggml_range = true) {
  XorShift rng(seed);
  const size_t rb = ggml_row_bytes(type, cols);
  std::vector<uint8_t> data(rb * static_cast<size_t>(rows));
  for (size_t i = 0; i < data.size(); i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(data.data() + i, &v, std::min<size_t>(8, data.size() - i));
  }
  const size_t bb = *ggml_type_block_bytes(static_cast<uint32_t>(type));
  const size_t nblk = data.size() / bb;
  for (size_t k = 0; k < nblk; ++k) {
    uint8_t* b = data.data() + k * bb;
    const float sign = (rng.next() & 7) == 0 ? -1.0f : 1.0f;  // a few negative scales
    switch (type) {
      case GgmlType::Q8_0:
        put_half(b, sign * rng.uniform(0.002f, 0.02f));
        for (int j = 0; ggml_range && j < 32; ++j)
          if (b[2 + j] == 0x80) b[2 + j] = 0x81;
        break;
      case GgmlType::Q4_0:
      case GgmlType::Q5_0: put_half(b, sign * rng.uniform(0.002f, 0.05f)); break;
      case GgmlType::Q4_K:
        put_half(b, rng.uniform(0.0005f, 0.01f));
        put_half(b + 2, rng.uniform(0.0005f, 0.01f));
        break;
      case GgmlType::Q6_K:
        for (int j = 0; ggml_range && j < 16; ++j)
          if (b[192 + j] == 0x80) b[192 + j] = 0x81;
        put_half(b + 208, sign * rng.uniform(0.0002f, 0.002f));
        break;
      case GgmlType::F32: {
        const float f = rng.uniform(-0.05f, 0.05f);
        std::memcpy(b, &f, 4);
        break;
      }
      case GgmlType::F16: put_half(b, rng.uniform(-0.05f, 0.05f)); break;
      case GgmlType::BF16: {
        const uint16_t h = fp32_to_bf16(rng.uniform(-0.05f, 0.05f));
        std::memcpy(b, &h, 2);
        break;
      }
      default: break;
    }
  }
  return data;
}

}  // namespace worker::exacttest
