// CUDA/cuBLAS failures become one exception type with a stable code and a message naming
// the call, file and line (M0-W-1501 as restated in spec/, M0-W-1431); the context's
// teardown resets the device (M0-W-1401).
#include <gtest/gtest.h>

#include <string>

#include "common/errors.h"
#include "cuda/cuda_context.h"
#include "cuda_check.h"
#include "gpu_test_util.h"

namespace worker {
namespace {

WorkerError expect_throw(void (*fn)()) {
  try {
    fn();
  } catch (const WorkerError& e) {
    return e;
  }
  ADD_FAILURE() << "no WorkerError thrown";
  return WorkerError(ErrorCode::Internal, "");
}

// Runs without a GPU: the error mapping needs only the runtime's error tables.
// REQ: M0-W-1501 M0-W-1431 M0-W-1500
TEST(CudaErrors, FailuresCarryStableCodeAndCallSite) {
  const WorkerError oom = expect_throw(
      [] { cuda_check(cudaErrorMemoryAllocation, "cudaMalloc(&p, bytes)", "engine.cu", 42); });
  EXPECT_EQ(oom.code(), ErrorCode::VramOom);
  const std::string m = oom.what();
  EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
  EXPECT_NE(m.find("cudaMalloc(&p, bytes)"), std::string::npos) << m;
  EXPECT_NE(m.find("engine.cu:42"), std::string::npos) << m;

  const WorkerError inval = expect_throw(
      [] { cuda_check(cudaErrorInvalidValue, "cudaMemcpyAsync(d, s, n)", "upload.cpp", 7); });
  EXPECT_EQ(inval.code(), ErrorCode::CudaError);
  EXPECT_NE(std::string(inval.what()).find("upload.cpp:7"), std::string::npos);

  const WorkerError blas = expect_throw(
      [] { cublas_check(CUBLAS_STATUS_EXECUTION_FAILED, "cublasGemmEx(...)", "matmul.cu", 99); });
  EXPECT_EQ(blas.code(), ErrorCode::CudaError);
  EXPECT_NE(std::string(blas.what()).find("CUBLAS_STATUS_EXECUTION_FAILED"), std::string::npos);
  const WorkerError blas_oom = expect_throw(
      [] { cublas_check(CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate(&h)", "ctx.cpp", 3); });
  EXPECT_EQ(blas_oom.code(), ErrorCode::VramOom);

  EXPECT_NO_THROW(cuda_check(cudaSuccess, "ok", "f", 1));
  EXPECT_NO_THROW(cublas_check(CUBLAS_STATUS_SUCCESS, "ok", "f", 1));
}

// REQ: M0-W-1401 M0-W-1400
TEST(CudaContextLifetime, LastReleaseResetsTheDevice) {
  REQUIRE_GPU();
  void* leaked = nullptr;
  {
    auto ctx = cuda::CudaContext::acquire(0);
    EXPECT_EQ(ctx->device(), 0);
    CK(cudaMalloc(&leaked, 1 << 20));  // deliberately not freed: the reset must release it
    cudaPointerAttributes attr{};
    CK(cudaPointerGetAttributes(&attr, leaked));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  }
  // After cudaDeviceReset the old allocation no longer belongs to this process's context.
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, leaked);
  (void)cudaGetLastError();
  EXPECT_TRUE(e != cudaSuccess || attr.type != cudaMemoryTypeDevice)
      << "allocation survived the context's teardown";
  EXPECT_EQ(cudaFree(leaked), cudaErrorInvalidValue) << "freeing it again must fail";
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace worker
