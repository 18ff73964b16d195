#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "matvec.cuh"

namespace worker::kern {
namespace {

constexpr int kRowsPerBlock = 8;  // 8 warps, one row each
constexpr int kMaxTok = 8;        // tokens sharing one pass over a weight row

// Quantized types: lane handles 32-weight sub-blocks lane, lane+32, ...; each sub-block
// is dequantized into registers once and used for every token of the tile.
template <GgmlType T, int NT>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp)
    matvec_q_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                    const float* __restrict__ x, float* __restrict__ y, int n_tok,
                    int accumulate) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int t0 = blockIdx.y * NT;
  if (r >= rows) return;
  const int nt = min(NT, n_tok - t0);
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  const int nsb = cols / 32;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (int sb = lane; sb < nsb; sb += kWarp) {
    float v[32];
    deq32<T>(row, sb, v);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        const float4* xp =
            reinterpret_cast<const float4*>(x + static_cast<size_t>(t0 + t) * cols + sb * 32);
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 xv = xp[i];
          a += v[4 * i] * xv.x + v[4 * i + 1] * xv.y + v[4 * i + 2] * xv.z + v[4 * i + 3] * xv.w;
        }
        acc[t] += a;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < nt) {
      float* out = y + static_cast<size_t>(t0 + t) * rows + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Float types: lane reads 8 consecutive weights per step (16 bytes for F16/BF16), so a
// warp reads one contiguous stretch of the row per step.
template <GgmlType T>
__device__ __forceinline__ void load8(const uint8_t* row, int j, float* v) {
  if constexpr (T == GgmlType::F32) {
    const float4* p = reinterpret_cast<const float4*>(row) + j / 4;
    const float4 a = p[0], b = p[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + static_cast<size_t>(j) * 2);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f;
      if constexpr (T == GgmlType::F16) {
        f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      } else {
        f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      }
      v[2 * i] = f.x; v[2 * i + 1] = f.y;
    }
  }
}

template <GgmlType T, int NT>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp)
    matvec_f_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                    const float* __restrict__ x, float* __restrict__ y, int n_tok,
                    int accumulate) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int t0 = blockIdx.y * NT;
  if (r >= rows) return;
  const int nt = min(NT, n_tok - t0);
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (int j = lane * 8; j < cols; j += kWarp * 8) {
    float v[8];
    load8<T>(row, j, v);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        const float4* xp =
            reinterpret_cast<const float4*>(x + static_cast<size_t>(t0 + t) * cols + j);
        const float4 a = xp[0], b = xp[1];
        acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y +
                  v[6] * b.z + v[7] * b.w;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < nt) {
      float* out = y + static_cast<size_t>(t0 + t) * rows + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Float rows whose length is not a multiple of 8 (tiny test models): one element per lane.
template <GgmlType T, int NT>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp)
    matvec_scalar_kernel(const uint8_t* __restrict__ w, int rows, int cols, size_t row_bytes,
                         const float* __restrict__ x, float* __restrict__ y, int n_tok,
                         int accumulate) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int t0 = blockIdx.y * NT;
  if (r >= rows) return;
  const int nt = min(NT, n_tok - t0);
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (int j = lane; j < cols; j += kWarp) {
    const float v = load_float_elem(row, static_cast<uint32_t>(T), j);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) acc[t] += v * x[static_cast<size_t>(t0 + t) * cols + j];
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < nt) {
      float* out = y + static_cast<size_t>(t0 + t) * rows + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

template <GgmlType T, int NT>
void launch_one(const WeightView& w, const float* x, float* y, int n_tok, bool acc,
                cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((w.rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((n_tok + NT - 1) / NT));
  const auto* data = static_cast<const uint8_t*>(w.data);
  if constexpr (BlockInfo<T>::kElems == 1) {
    if (w.cols % 8 != 0) {
      matvec_scalar_kernel<T, NT><<<grid, kRowsPerBlock * kWarp, 0, s>>>(
          data, static_cast<int>(w.rows), static_cast<int>(w.cols), w.row_bytes, x, y, n_tok,
          acc);
      CUDA_CHECK_LAUNCH("matvec_scalar_kernel");
      return;
    }
    matvec_f_kernel<T, NT><<<grid, kRowsPerBlock * kWarp, 0, s>>>(
        data, static_cast<int>(w.rows), static_cast<int>(w.cols), w.row_bytes, x, y, n_tok, acc);
  } else {
    matvec_q_kernel<T, NT><<<grid, kRowsPerBlock * kWarp, 0, s>>>(
        data, static_cast<int>(w.rows), static_cast<int>(w.cols), w.row_bytes, x, y, n_tok, acc);
  }
  CUDA_CHECK_LAUNCH("matvec kernel");
}

template <GgmlType T>
void launch_type(const WeightView& w, const float* x, float* y, int n_tok, bool acc,
                 cudaStream_t s) {
  const int elems = BlockInfo<T>::kElems == 1 ? 1 : BlockInfo<T>::kElems;
  if (w.cols % elems != 0) {
    throw WorkerError(ErrorCode::Internal,
                      "matvec: row length " + std::to_string(w.cols) + " of type " +
                          std::string(ggml_type_name(static_cast<uint32_t>(T))) +
                          " is not a multiple of " + std::to_string(elems));
  }
  if (n_tok == 1) {
    launch_one<T, 1>(w, x, y, n_tok, acc, s);
  } else if (n_tok == 2) {
    launch_one<T, 2>(w, x, y, n_tok, acc, s);
  } else if (n_tok <= 4) {
    launch_one<T, 4>(w, x, y, n_tok, acc, s);
  } else {
    launch_one<T, kMaxTok>(w, x, y, n_tok, acc, s);
  }
}

// x = hi + lo with hi = round(x) and lo = round(x - hi) in the 16-bit type: two GEMMs on
// (hi, lo) carry ~22 (F16) / ~16 (BF16) bits of each activation instead of 11 / 8, so the
// prefill stays within rounding of the FP32-activation decode path and the CPU reference.
template <typename T>
__device__ __forceinline__ T to_lowp(float f);
template <>
__device__ __forceinline__ __half to_lowp<__half>(float f) { return __float2half_rn(f); }
template <>
__device__ __forceinline__ __nv_bfloat16 to_lowp<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
__device__ __forceinline__ float from_lowp(__half h) { return __half2float(h); }
__device__ __forceinline__ float from_lowp(__nv_bfloat16 h) { return __bfloat162float(h); }

template <typename T>
__global__ void split_kernel(const float* __restrict__ x, T* __restrict__ hi, T* __restrict__ lo,
                             size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const T h = to_lowp<T>(x[i]);
    hi[i] = h;
    lo[i] = to_lowp<T>(x[i] - from_lowp(h));
  }
}

}  // namespace

void matvec(const WeightView& w, const float* x, float* y, int n_tok, bool accumulate,
            cudaStream_t stream) {
  if (n_tok <= 0 || w.rows <= 0 || w.cols <= 0) {
    throw WorkerError(ErrorCode::Internal, "matvec: empty shape");
  }
  switch (static_cast<GgmlType>(w.type)) {
    case GgmlType::F32: return launch_type<GgmlType::F32>(w, x, y, n_tok, accumulate, stream);
    case GgmlType::F16: return launch_type<GgmlType::F16>(w, x, y, n_tok, accumulate, stream);
    case GgmlType::BF16: return launch_type<GgmlType::BF16>(w, x, y, n_tok, accumulate, stream);
    case GgmlType::Q8_0: return launch_type<GgmlType::Q8_0>(w, x, y, n_tok, accumulate, stream);
    case GgmlType::Q4_0: return launch_type<GgmlType::Q4_0>(w, x, y, n_tok, accumulate, stream);
    case GgmlType::Q5_0: return launch_type<GgmlType::Q5_0>(w, x, y, n_tok, accumulate, stream);
    case GgmlType::Q4_K: return launch_type<GgmlType::Q4_K>(w, x, y, n_tok, accumulate, stream);
    case GgmlType::Q6_K: return launch_type<GgmlType::Q6_K>(w, x, y, n_tok, accumulate, stream);
    default:
      throw WorkerError(ErrorCode::Internal,
                        "matvec: unsupported weight type " + std::string(ggml_type_name(w.type)));
  }
}

bool gemm_supported(uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

void gemm_cublas(cublasHandle_t handle, const WeightView& w, const float* x, void* x_lowp,
                 float* y, int n_tok, bool accumulate, cudaStream_t stream) {
  const auto t = static_cast<GgmlType>(w.type);
  if (!gemm_supported(w.type)) {
    throw WorkerError(ErrorCode::Internal,
                      "gemm_cublas: unsupported weight type " + std::string(ggml_type_name(w.type)));
  }
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  const size_t n = static_cast<size_t>(n_tok) * static_cast<size_t>(w.cols);
  const int m = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Row-major W [rows, cols] is column-major [cols, rows]; so y^T = op_T(W) * x^T with
  // x [n_tok, cols] row-major = column-major [cols, n_tok].
  auto gemm = [&](const void* b, cudaDataType_t ty, float bt) {
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n_tok, k, &one, w.data, ty, k, b,
                              ty, k, &bt, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  };
  if (t == GgmlType::F32) {
    gemm(x, CUDA_R_32F, beta);
    return;
  }
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  if (t == GgmlType::F16) {
    auto* hi = static_cast<__half*>(x_lowp);
    split_kernel<__half><<<blocks, 256, 0, stream>>>(x, hi, hi + n, n);
    CUDA_CHECK_LAUNCH("split_kernel<half>");
    gemm(hi, CUDA_R_16F, beta);
    gemm(hi + n, CUDA_R_16F, 1.0f);
  } else {
    auto* hi = static_cast<__nv_bfloat16*>(x_lowp);
    split_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(x, hi, hi + n, n);
    CUDA_CHECK_LAUNCH("split_kernel<bf16>");
    gemm(hi, CUDA_R_16BF, beta);
    gemm(hi + n, CUDA_R_16BF, 1.0f);
  }
}

}  // namespace worker::kern
