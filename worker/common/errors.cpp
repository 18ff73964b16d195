#include "common/errors.h"

namespace worker {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidRequest: return "INVALID_REQUEST";
    case ErrorCode::WorkerBusy: return "WORKER_BUSY";
    case ErrorCode::ModelLoadFailed: return "MODEL_LOAD_FAILED";
    case ErrorCode::InsufficientVram: return "INSUFFICIENT_VRAM";
    case ErrorCode::VramOom: return "VRAM_OOM";
    case ErrorCode::CudaError: return "CUDA_ERROR";
    case ErrorCode::InferenceTimeout: return "INFERENCE_TIMEOUT";
    case ErrorCode::Cancelled: return "CANCELLED";
    case ErrorCode::Internal: return "INTERNAL";
  }
  return "INTERNAL";
}

int error_http_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidRequest: return 400;
    case ErrorCode::WorkerBusy: return 503;
    case ErrorCode::InferenceTimeout: return 504;
    case ErrorCode::Cancelled: return 499;
    default: return 500;
  }
}

bool error_retriable(ErrorCode code) {
  switch (code) {
    case ErrorCode::WorkerBusy:
    case ErrorCode::VramOom:
    case ErrorCode::InferenceTimeout: return true;
    default: return false;
  }
}

}  // namespace worker
