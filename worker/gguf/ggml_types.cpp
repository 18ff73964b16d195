#include "gguf/ggml_types.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/errors.h"
#include "gguf/gguf_file.h"
#include "gguf/type_traits.h"

namespace worker {

namespace {

constexpr int kQK = TypeTraits<GgmlType::Q8_0>::kBlock;    // Q4_0 / Q5_0 / Q8_0
constexpr int kQK_K = TypeTraits<GgmlType::Q4_K>::kBlock;  // the K-quants

// Block layouts from llama.cpp's ggml-common.h (all fields little-endian, packed).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == TypeTraits<GgmlType::Q4_0>::kBlockBytes);
static_assert(sizeof(BlockQ5_0) == TypeTraits<GgmlType::Q5_0>::kBlockBytes);
static_assert(sizeof(BlockQ8_0) == TypeTraits<GgmlType::Q8_0>::kBlockBytes);
static_assert(sizeof(BlockQ4_K) == TypeTraits<GgmlType::Q4_K>::kBlockBytes);
static_assert(sizeof(BlockQ6_K) == TypeTraits<GgmlType::Q6_K>::kBlockBytes);

struct TypeInfo {
  uint32_t id;
  const char* name;
  size_t block;
  size_t bytes;
  bool supported;
};

// A type this worker computes with: its sizes from TypeTraits.
template <GgmlType T>
constexpr TypeInfo supported(const char* name) {
  return {static_cast<uint32_t>(T), name, TypeTraits<T>::kBlock, TypeTraits<T>::kBlockBytes, true};
}

// Sizes of every type a GGUF file may hold, so that an unsupported one is still parsed and
// reported by name (D2) rather than misread.
constexpr TypeInfo kTypes[] = {
    supported<GgmlType::F32>("F32"),   supported<GgmlType::F16>("F16"),
    supported<GgmlType::Q4_0>("Q4_0"), {3, "Q4_1", 32, 20, false},
    supported<GgmlType::Q5_0>("Q5_0"), {7, "Q5_1", 32, 24, false},
    supported<GgmlType::Q8_0>("Q8_0"), {9, "Q8_1", 32, 36, false},
    {10, "Q2_K", 256, 84, false},      {11, "Q3_K", 256, 110, false},
    supported<GgmlType::Q4_K>("Q4_K"), {13, "Q5_K", 256, 176, false},
    supported<GgmlType::Q6_K>("Q6_K"), {15, "Q8_K", 256, 292, false},
    {16, "IQ2_XXS", 256, 66, false},   {17, "IQ2_XS", 256, 74, false},
    {18, "IQ3_XXS", 256, 98, false},   {19, "IQ1_S", 256, 50, false},
    {20, "IQ4_NL", 32, 18, false},     {21, "IQ3_S", 256, 110, false},
    {22, "IQ2_S", 256, 82, false},     {23, "IQ4_XS", 256, 136, false},
    {24, "I8", 1, 1, false},           {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},          {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},          {29, "IQ1_M", 256, 56, false},
    supported<GgmlType::BF16>("BF16"), {34, "TQ1_0", 256, 54, false},
    {35, "TQ2_0", 256, 66, false},     {39, "MXFP4", 32, 17, false},
};

constexpr const TypeInfo* traits(uint32_t type) {
  for (const auto& t : kTypes) {
    if (t.id == type) return &t;
  }
  return nullptr;
}

inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// The dequantizers below follow ggml-quants.c's dequantize_row_* operation for operation
// (same products, same order) so the floats are bit-identical to llama.cpp's.
void deq_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[i * kQK + j] = x0 * d;
      y[i * kQK + j + kQK / 2] = x1 * d;
    }
  }
}

void deq_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
      const int32_t x0 = ((x[i].qs[j] & 0x0F) | xh_0) - 16;
      const int32_t x1 = ((x[i].qs[j] >> 4) | xh_1) - 16;
      y[i * kQK + j] = x0 * d;
      y[i * kQK + j + kQK / 2] = x1 * d;
    }
  }
}

void deq_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[i * kQK + j] = x[i].qs[j] * d;
  }
}

void deq_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = fp16_to_fp32(x[i].d);
    const float min = fp16_to_fp32(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < kQK_K; j += 64) {
      get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void deq_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// dequantize_row for one type (check_row has refused unsupported types and partial blocks).
void f16_like_row(const void* src, float* dst, int64_t n, float (*conv)(uint16_t)) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    dst[i] = conv(h);
  }
}
void deq_row(UnsupportedType, const void*, float*, int64_t) {}
void deq_row(TypeTraits<GgmlType::F32>, const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void deq_row(TypeTraits<GgmlType::F16>, const void* src, float* dst, int64_t n) {
  f16_like_row(src, dst, n, fp16_to_fp32);
}
void deq_row(TypeTraits<GgmlType::BF16>, const void* src, float* dst, int64_t n) {
  f16_like_row(src, dst, n, bf16_to_fp32);
}
void deq_row(TypeTraits<GgmlType::Q4_0>, const void* src, float* dst, int64_t n) {
  deq_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
}
void deq_row(TypeTraits<GgmlType::Q5_0>, const void* src, float* dst, int64_t n) {
  deq_q5_0(static_cast<const BlockQ5_0*>(src), dst, n / kQK);
}
void deq_row(TypeTraits<GgmlType::Q8_0>, const void* src, float* dst, int64_t n) {
  deq_q8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
}
void deq_row(TypeTraits<GgmlType::Q4_K>, const void* src, float* dst, int64_t n) {
  deq_q4_k(static_cast<const BlockQ4_K*>(src), dst, n / kQK_K);
}
void deq_row(TypeTraits<GgmlType::Q6_K>, const void* src, float* dst, int64_t n) {
  deq_q6_k(static_cast<const BlockQ6_K*>(src), dst, n / kQK_K);
}

void check_row(GgmlType type, int64_t n) {
  const TypeInfo* t = traits(static_cast<uint32_t>(type));
  if (!t || !t->supported) {
    throw GgufError("tensor type " + std::string(ggml_type_name(static_cast<uint32_t>(type))) +
                    " is not supported (supported: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q4_K Q6_K)");
  }
  if (n < 0 || n % static_cast<int64_t>(t->block) != 0) {
    throw GgufError("row of " + std::to_string(n) + " elements is not a multiple of " + t->name +
                    "'s block size " + std::to_string(t->block));
  }
}

}  // namespace

std::string_view ggml_type_name(uint32_t type) {
  if (const TypeInfo* t = traits(type)) return t->name;
  // Unknown values get a stable printable name; one buffer per thread keeps the view valid.
  thread_local std::string buf;
  buf = "type" + std::to_string(type);
  return buf;
}

bool ggml_type_supported(uint32_t type) {
  const TypeInfo* t = traits(type);
  return t && t->supported;
}

std::optional<size_t> ggml_block_size(uint32_t type) {
  if (const TypeInfo* t = traits(type)) return t->block;
  return std::nullopt;
}

std::optional<size_t> ggml_type_block_bytes(uint32_t type) {
  if (const TypeInfo* t = traits(type)) return t->bytes;
  return std::nullopt;
}

size_t ggml_row_bytes(GgmlType type, int64_t n) {
  const TypeInfo* t = traits(static_cast<uint32_t>(type));
  if (!t) throw GgufError("unknown tensor type " + std::to_string(static_cast<uint32_t>(type)));
  return static_cast<size_t>(n) / t->block * t->bytes;
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  check_row(type, n);
  dispatch(type, [&](auto tr) { deq_row(tr, src, dst, n); });
}

float dot_row(GgmlType type, const void* row, const float* x, int64_t n) {
  check_row(type, n);
  // Dequantize one chunk at a time into a stack buffer and accumulate strictly left to
  // right, so the result depends only on the data, never on threads or vector width.
  const size_t block = *ggml_block_size(static_cast<uint32_t>(type));
  const size_t bytes = *ggml_type_block_bytes(static_cast<uint32_t>(type));
  constexpr int64_t kChunk = 256;  // a multiple of every supported block size
  float buf[kChunk];
  const auto* src = static_cast<const uint8_t*>(row);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min<int64_t>(kChunk, n - i);
    dequantize_row(type, src + static_cast<size_t>(i) / block * bytes, buf, m);
    for (int64_t j = 0; j < m; ++j) sum += buf[j] * x[i + j];
  }
  return sum;
}

void throw_unsupported_type(const char* what, GgmlType t) {
  throw WorkerError(ErrorCode::Internal, std::string(what) + ": unsupported weight type " +
                                             std::string(ggml_type_name(static_cast<uint32_t>(t))));
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00);   // NaN
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00);  // overflow -> inf
  if (absx < 0x38800000u) {
    // Result is subnormal or zero: shift the implicit-1 mantissa and round to nearest even.
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < half the smallest subnormal
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (113 - e) - 1 ... gives mantissa bits for 2^-24 units
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias and round the 13 dropped mantissa bits to nearest even.
  uint32_t r = ((absx >> 13) - (112u << 10));
  const uint32_t rem = absx & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;  // may carry into the exponent: ok
  return static_cast<uint16_t>(sign | r);
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

}  // namespace worker
