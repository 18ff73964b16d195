#pragma once
// worker-orcd command line (D13, M0-W-1100, 1101).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace worker::server {

struct CliOptions {
  std::string model;
  int port = 8080;
  std::string bind = "127.0.0.1";  // loopback unless --bind says otherwise
  int gpu_device = 0;
  std::string worker_id;  // generated (v4) when absent
  bool worker_id_generated = false;
  std::string backend = "cuda";
  // cuda backend: "exact" (the CPU reference's floats bit for bit) or "fast" (see
  // CudaEngineOptions::exact)
  std::string numerics = "exact";
  std::string kv_cache;  // "f16" | "f32" | "" (the backend's default: cuda f16, cpu f32)
  int32_t ctx_size = 0;  // 0: the model's training context
  size_t queue_depth = 16;
  double inference_timeout_sec = 300;  // fractions allowed (tests use sub-second limits)
  double http_timeout_sec = 10;        // whole request head; the body gets 3x
  std::string api_key;
  std::string tokenizer;  // hf-json tokenizer.json
  std::string log_logits;
  std::string callback_url;
  bool help = false;
};

// Throws std::invalid_argument naming the bad option and why.
CliOptions parse_cli(const std::vector<std::string>& args);
std::string cli_usage();
// `worker-orcd --version`: commit, build date and type, CUDA architectures or "cpu-only".
std::string version_text();

bool is_valid_uuid(const std::string& s);
// 127.0.0.0/8, ::1, ::ffff:127.x or "localhost".
bool is_loopback_address(const std::string& addr);
std::string generate_uuid_v4();

}  // namespace worker::server
