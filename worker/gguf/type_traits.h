#pragma once
// The one table of the weight types this worker computes with, for host and device code
// (the CPU reference and kernels/ both read it): block size and bytes, the type an
// activation row is rounded to before it is dotted with a row of that type (ggml's
// vec_dot_type), and the dot family. dispatch() turns a run-time GgmlType into these
// compile-time traits; it is the only switch over weight types an entry point needs.
#include <cstdint>

#include "gguf/ggml_types.h"

#if defined(__CUDACC__)
#define WORKER_HD __host__ __device__
// dispatch() calls host lambdas from host code and device lambdas from device code.
#define WORKER_HD_CALLS_ANY _Pragma("nv_exec_check_disable")
#else
#define WORKER_HD
#define WORKER_HD_CALLS_ANY
#endif

namespace worker {

// ggml's vec_dot_type: F32 (no rounding), F16, BF16, Q8_0 (blocks of 32, fp16 scale) or
// Q8_K (blocks of 256, float scale, sums of 16).
enum class ActType : uint8_t { F32, F16, BF16, Q8_0, Q8_K };

// How a row is dotted: float products, integer dots of 32-element blocks with one fp16
// scale (Q4_0 / Q5_0 / Q8_0), or of 256-element K-quant super-blocks (Q4_K / Q6_K); None:
// not at all (a type this worker does not compute with).
enum class DotFamily : uint8_t { None, Float, Block32, KQuant };
WORKER_HD constexpr bool quantized(DotFamily f) {
  return f == DotFamily::Block32 || f == DotFamily::KQuant;
}

template <GgmlType T, int Block, int BlockBytes, ActType Act, DotFamily Family, bool Repack = false>
struct TypeRow {
  static constexpr bool kSupported = true;
  static constexpr GgmlType kType = T;
  static constexpr int kBlock = Block;            // elements per block (1: float types)
  static constexpr int kBlockBytes = BlockBytes;  // bytes per block
  static constexpr ActType kAct = Act;
  static constexpr DotFamily kFamily = Family;
  // llama.cpp's x86 CPU backend keeps a weight of this type with a multiple of 8 rows in
  // its "repack" layout (ggml_repack_get_optimal_repack_type: Q4_0 -> q4_0_8x8, Q4_K ->
  // q4_K_8x8 on AVX2), whose dot products are summed in another order.
  static constexpr bool kRepack = Repack;
};

template <GgmlType T>
struct TypeTraits;
// clang-format off
template <> struct TypeTraits<GgmlType::F32>  : TypeRow<GgmlType::F32,    1,   4, ActType::F32,  DotFamily::Float> {};
template <> struct TypeTraits<GgmlType::F16>  : TypeRow<GgmlType::F16,    1,   2, ActType::F16,  DotFamily::Float> {};
template <> struct TypeTraits<GgmlType::BF16> : TypeRow<GgmlType::BF16,   1,   2, ActType::BF16, DotFamily::Float> {};
template <> struct TypeTraits<GgmlType::Q8_0> : TypeRow<GgmlType::Q8_0,  32,  34, ActType::Q8_0, DotFamily::Block32> {};
template <> struct TypeTraits<GgmlType::Q4_0> : TypeRow<GgmlType::Q4_0,  32,  18, ActType::Q8_0, DotFamily::Block32, true> {};
template <> struct TypeTraits<GgmlType::Q5_0> : TypeRow<GgmlType::Q5_0,  32,  22, ActType::Q8_0, DotFamily::Block32> {};
template <> struct TypeTraits<GgmlType::Q4_K> : TypeRow<GgmlType::Q4_K, 256, 144, ActType::Q8_K, DotFamily::KQuant, true> {};
template <> struct TypeTraits<GgmlType::Q6_K> : TypeRow<GgmlType::Q6_K, 256, 210, ActType::Q8_K, DotFamily::KQuant> {};
// clang-format on

// What dispatch() passes for a type this worker does not compute with.
struct UnsupportedType {
  static constexpr bool kSupported = false;
  static constexpr ActType kAct = ActType::F32;
  static constexpr DotFamily kFamily = DotFamily::None;
  static constexpr bool kRepack = false;
};

// f(TypeTraits<T>{}) for the T that `t` names, f(UnsupportedType{}) for any other type.
WORKER_HD_CALLS_ANY
template <class F>
WORKER_HD constexpr decltype(auto) dispatch(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32: return f(TypeTraits<GgmlType::F32>{});
    case GgmlType::F16: return f(TypeTraits<GgmlType::F16>{});
    case GgmlType::BF16: return f(TypeTraits<GgmlType::BF16>{});
    case GgmlType::Q8_0: return f(TypeTraits<GgmlType::Q8_0>{});
    case GgmlType::Q4_0: return f(TypeTraits<GgmlType::Q4_0>{});
    case GgmlType::Q5_0: return f(TypeTraits<GgmlType::Q5_0>{});
    case GgmlType::Q4_K: return f(TypeTraits<GgmlType::Q4_K>{});
    case GgmlType::Q6_K: return f(TypeTraits<GgmlType::Q6_K>{});
    default: return f(UnsupportedType{});
  }
}
WORKER_HD_CALLS_ANY
template <class F>
WORKER_HD constexpr decltype(auto) dispatch(uint32_t t, F&& f) {
  return dispatch(static_cast<GgmlType>(t), static_cast<F&&>(f));
}

// Throws WorkerError(Internal) "<what>: unsupported weight type <name>".
[[noreturn]] void throw_unsupported_type(const char* what, GgmlType t);

// dispatch() for host entry points: an unsupported type throws instead of reaching f.
template <class F>
decltype(auto) dispatch_or_throw(GgmlType t, const char* what, F&& f) {
  using R = decltype(f(TypeTraits<GgmlType::F32>{}));
  return dispatch(t, [&](auto tr) -> R {
    if constexpr (!decltype(tr)::kSupported) {
      throw_unsupported_type(what, t);
    } else {
      return f(tr);
    }
  });
}
template <class F>
decltype(auto) dispatch_or_throw(uint32_t t, const char* what, F&& f) {
  return dispatch_or_throw(static_cast<GgmlType>(t), what, static_cast<F&&>(f));
}

// The activation rounding of a supported weight type; throws for any other.
inline ActType act_type_for(uint32_t t, const char* what) {
  return dispatch_or_throw(t, what, [](auto tr) { return decltype(tr)::kAct; });
}

// The activation rounding of a weight type known at run time (F32 for unsupported types).
WORKER_HD constexpr ActType act_type_of(GgmlType t) {
  return dispatch(t, [](auto tr) { return decltype(tr)::kAct; });
}
WORKER_HD constexpr ActType act_type_of(uint32_t t) {
  return act_type_of(static_cast<GgmlType>(t));
}

// Whether llama.cpp's x86 CPU backend repacks a weight of type t with `rows` rows.
WORKER_HD constexpr bool repacked(GgmlType t, int64_t rows) {
  return dispatch(t, [](auto tr) { return decltype(tr)::kRepack; }) && rows % 8 == 0;
}
WORKER_HD constexpr bool repacked(uint32_t t, int64_t rows) {
  return repacked(static_cast<GgmlType>(t), rows);
}

// The dot family of a weight type known at run time (None for unsupported types).
WORKER_HD constexpr DotFamily dot_family_of(GgmlType t) {
  return dispatch(t, [](auto tr) { return decltype(tr)::kFamily; });
}
WORKER_HD constexpr DotFamily dot_family_of(uint32_t t) {
  return dot_family_of(static_cast<GgmlType>(t));
}

// Elements per block of an activation rounding (1 for the float ones).
WORKER_HD constexpr int act_block(ActType a) {
  return a == ActType::Q8_0 ? 32 : a == ActType::Q8_K ? 256 : 1;
}

}  // namespace worker
