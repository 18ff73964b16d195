#include "server/metrics.h"

#include <cstdio>

namespace worker::server {
namespace {
std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lock(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + fmt(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_ms({5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}),
      inter_token_ms({1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000}),
      inference_ms({10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000}) {
  for (const char* o : {"ok", "cancelled", "timeout", "error", "busy", "invalid"}) requests_[o] = 0;
}

void Metrics::count_request(const std::string& outcome) {
  std::lock_guard lock(mu_);
  ++requests_[outcome];
}

uint64_t Metrics::requests(const std::string& outcome) const {
  std::lock_guard lock(mu_);
  auto it = requests_.find(outcome);
  return it == requests_.end() ? 0 : it->second;
}

std::string Metrics::render() const {
  std::string out;
  out += "# HELP worker_requests_total Inference requests by outcome.\n";
  out += "# TYPE worker_requests_total counter\n";
  {
    std::lock_guard lock(mu_);
    for (const auto& [k, v] : requests_)
      out += "worker_requests_total{outcome=\"" + k + "\"} " + std::to_string(v) + "\n";
  }
  out += "# HELP worker_tokens_generated_total Tokens generated.\n";
  out += "# TYPE worker_tokens_generated_total counter\n";
  out += "worker_tokens_generated_total " + std::to_string(tokens_.load()) + "\n";
  ttft_ms.render(out, "worker_time_to_first_token_ms",
                 "Time from admission to the first token event (ms).");
  inter_token_ms.render(out, "worker_inter_token_ms", "Time between token events (ms).");
  inference_ms.render(out, "worker_inference_duration_ms",
                      "Job run time on the inference thread (ms).");
  out += "# HELP worker_queue_depth Jobs waiting in the admission queue.\n";
  out += "# TYPE worker_queue_depth gauge\n";
  out += "worker_queue_depth " + std::to_string(queue_depth_.load()) + "\n";
  out += "# HELP worker_vram_bytes Device memory held by the engine (bytes).\n";
  out += "# TYPE worker_vram_bytes gauge\n";
  out += "worker_vram_bytes " + std::to_string(vram_bytes_.load()) + "\n";
  const double up =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  out += "# HELP worker_uptime_seconds Seconds since the process started.\n";
  out += "# TYPE worker_uptime_seconds gauge\n";
  out += "worker_uptime_seconds " + fmt(up) + "\n";
  return out;
}

}  // namespace worker::server
