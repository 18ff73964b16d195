#include <gtest/gtest.h>

#include "server/metrics.h"

namespace worker::server {
namespace {

// REQ: M0-W-1350
TEST(ServerMetrics, RendersAllSeriesInPrometheusText) {
  Metrics m;
  m.count_request("ok");
  m.count_request("ok");
  m.count_request("busy");
  m.add_tokens(7);
  m.ttft_ms.observe(3);
  m.ttft_ms.observe(30);
  m.inter_token_ms.observe(1);
  m.inference_ms.observe(100);
  m.set_queue_depth(2);
  m.set_vram_bytes(1234);
  const std::string t = m.render();
  EXPECT_NE(t.find("worker_requests_total{outcome=\"ok\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("worker_requests_total{outcome=\"busy\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("worker_tokens_generated_total 7\n"), std::string::npos);
  EXPECT_NE(t.find("worker_time_to_first_token_ms_bucket{le=\"5\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("worker_time_to_first_token_ms_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("worker_time_to_first_token_ms_sum 33\n"), std::string::npos);
  EXPECT_NE(t.find("worker_time_to_first_token_ms_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE worker_inter_token_ms histogram"), std::string::npos);
  EXPECT_NE(t.find("worker_inference_duration_ms_count 1\n"), std::string::npos);
  EXPECT_NE(t.find("worker_queue_depth 2\n"), std::string::npos);
  EXPECT_NE(t.find("worker_vram_bytes 1234\n"), std::string::npos);
  EXPECT_NE(t.find("worker_uptime_seconds "), std::string::npos);
}

// REQ: M0-W-1350
TEST(ServerMetrics, HistogramBucketsAreCumulative) {
  Histogram h({1, 10});
  h.observe(0.5);
  h.observe(5);
  h.observe(50);
  std::string out;
  h.render(out, "x", "help");
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"10\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
}

}  // namespace
}  // namespace worker::server
