#include <string>

#include "common.cuh"
#include "common/errors.h"
#include "cuda_check.h"
#include "embed.cuh"
#include "launch.cuh"

namespace worker::kern {
namespace {

template <GgmlType T>
__global__ void embed_q_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int cols,
                               const int32_t* __restrict__ tokens, float* __restrict__ out) {
  griddep_wait();
  const uint8_t* row = w + static_cast<size_t>(tokens[blockIdx.x]) * row_bytes;
  float* o = out + static_cast<size_t>(blockIdx.x) * cols;
  for (int sb = threadIdx.x; sb < cols / 32; sb += blockDim.x) {
    float v[32];
    deq32<T>(row, sb, v);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[sb * 32 + i] = v[i];
  }
}

__global__ void embed_f_kernel(const uint8_t* __restrict__ w, uint32_t type, size_t row_bytes,
                               int cols, const int32_t* __restrict__ tokens,
                               float* __restrict__ out) {
  griddep_wait();
  const uint8_t* row = w + static_cast<size_t>(tokens[blockIdx.x]) * row_bytes;
  float* o = out + static_cast<size_t>(blockIdx.x) * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = load_float_elem(row, type, i);
}

template <GgmlType T>
void launch_q(const WeightView& t, const int32_t* tokens, int n_tok, float* out, cudaStream_t s) {
  if (t.cols % TypeTraits<T>::kBlock != 0) {
    throw WorkerError(ErrorCode::Internal, "embed: row length not a multiple of the block");
  }
  launch_pdl("embed_q_kernel", embed_q_kernel<T>, dim3(n_tok), dim3(128), s,
             static_cast<const uint8_t*>(t.data), t.row_bytes, static_cast<int>(t.cols), tokens,
             out);
  CUDA_CHECK_LAUNCH("embed_q_kernel");
}
}  // namespace

void embed(const WeightView& t, const int32_t* tokens, int n_tok, float* out, cudaStream_t stream) {
  dispatch_or_throw(t.type, "embed", [&](auto tr) {
    using Tr = decltype(tr);
    if constexpr (Tr::kFamily == DotFamily::Float) {
      launch_pdl("embed_f_kernel", embed_f_kernel, dim3(n_tok), dim3(256), stream,
                 static_cast<const uint8_t*>(t.data), t.type, t.row_bytes, static_cast<int>(t.cols),
                 tokens, out);
      CUDA_CHECK_LAUNCH("embed_f_kernel");
    } else {
      launch_q<Tr::kType>(t, tokens, n_tok, out, stream);
    }
  });
}
}  // namespace worker::kern
