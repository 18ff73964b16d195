#pragma once
// Prometheus text metrics (M0-W-1350). Counters and histograms are updated by the job
// runner and the HTTP layer; render() reads them without waiting on the inference thread.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace worker::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines of `name`.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // outcome: ok | cancelled | timeout | error | busy | invalid | unauthorized
  void count_request(const std::string& outcome);
  uint64_t requests(const std::string& outcome) const;
  void add_tokens(uint64_t n) { tokens_.fetch_add(n, std::memory_order_relaxed); }
  void set_queue_depth(int64_t n) { queue_depth_.store(n, std::memory_order_relaxed); }
  void set_vram_bytes(uint64_t n) { vram_bytes_.store(n, std::memory_order_relaxed); }
  uint64_t vram_bytes() const { return vram_bytes_.load(std::memory_order_relaxed); }

  Histogram ttft_ms;
  Histogram inter_token_ms;
  Histogram inference_ms;

  std::string render() const;

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> requests_;
  std::atomic<uint64_t> tokens_{0};
  std::atomic<int64_t> queue_depth_{0};
  std::atomic<uint64_t> vram_bytes_{0};
};

}  // namespace worker::server
