#include <gtest/gtest.h>

#include "common/errors.h"

using namespace worker;

// REQ: M0-W-1500 WRK-D11
TEST(Errors, StableCodesAndStatuses) {
  EXPECT_EQ(error_code_name(ErrorCode::InvalidRequest), "INVALID_REQUEST");
  EXPECT_EQ(error_code_name(ErrorCode::VramOom), "VRAM_OOM");
  EXPECT_EQ(error_code_name(ErrorCode::Cancelled), "CANCELLED");
  EXPECT_EQ(error_code_name(ErrorCode::InferenceTimeout), "INFERENCE_TIMEOUT");
  EXPECT_EQ(error_http_status(ErrorCode::InvalidRequest), 400);
  EXPECT_EQ(error_http_status(ErrorCode::WorkerBusy), 503);
  EXPECT_EQ(error_http_status(ErrorCode::InferenceTimeout), 504);
  EXPECT_EQ(error_http_status(ErrorCode::Cancelled), 499);
  EXPECT_FALSE(error_retriable(ErrorCode::Cancelled));
  EXPECT_TRUE(error_retriable(ErrorCode::WorkerBusy));
}
