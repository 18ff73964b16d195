#pragma once
// Every CUDA and cuBLAS call is checked; a failure names the statement, file and line
// (M0-W-1431). Allocation failures become VRAM_OOM so the job fails and the worker keeps
// serving (M0-W-1021); everything else is CUDA_ERROR.
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace worker {

void cuda_check(cudaError_t err, const char* stmt, const char* file, int line);
void cublas_check(cublasStatus_t st, const char* stmt, const char* file, int line);
// cudaGetLastError after a launch: launch-configuration errors surface here.
void cuda_check_launch(const char* kernel, const char* file, int line);

}  // namespace worker

#define CUDA_CHECK(stmt) ::worker::cuda_check((stmt), #stmt, __FILE__, __LINE__)
#define CUBLAS_CHECK(stmt) ::worker::cublas_check((stmt), #stmt, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH(name) ::worker::cuda_check_launch((name), __FILE__, __LINE__)
