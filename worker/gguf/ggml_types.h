#pragma once
// Tensor element types as GGUF stores them, with llama.cpp's block layouts (D2).
// Every quantized row is dequantized here exactly as llama.cpp's ggml does it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace worker {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

// Name as llama.cpp prints it ("F32", "Q4_K", ...); "type<N>" for unknown values.
std::string_view ggml_type_name(uint32_t type);
// True for the types this worker computes with: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_0 Q6_K.
bool ggml_type_supported(uint32_t type);
// Elements per block (1 for float types) and bytes per block; nullopt for unknown types.
std::optional<size_t> ggml_block_size(uint32_t type);
std::optional<size_t> ggml_type_block_bytes(uint32_t type);
// Bytes of a row of n elements; n must be a multiple of the block size.
size_t ggml_row_bytes(GgmlType type, int64_t n);

// Dequantize n elements (n a multiple of the block size) of a supported type into dst.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
// dot(row of n elements of `type`, x) in float, accumulated in a fixed order.
float dot_row(GgmlType type, const void* row, const float* x, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even, as ggml's GGML_FP32_TO_FP16
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);  // round to nearest even, as ggml

}  // namespace worker
