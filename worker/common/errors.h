#pragma once
// Stable error codes (M0-W-1500, D11) and the one exception type the engine throws.
#include <stdexcept>
#include <string>
#include <string_view>

namespace worker {

enum class ErrorCode {
  InvalidRequest,    // 400
  WorkerBusy,        // 503
  ModelLoadFailed,
  InsufficientVram,
  VramOom,
  CudaError,
  InferenceTimeout,  // 504
  Cancelled,         // 499
  Internal,
};

std::string_view error_code_name(ErrorCode code);  // "INVALID_REQUEST", ...
int error_http_status(ErrorCode code);
bool error_retriable(ErrorCode code);

// Thrown anywhere below the HTTP layer; the job runner maps it to an SSE `error` event.
class WorkerError : public std::runtime_error {
 public:
  WorkerError(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace worker
