#include "server/cli.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "build_info.h"
#include "engine/engine.h"

namespace worker::server {
namespace {

template <typename T>
T parse_int(const std::string& opt, const std::string& v, T lo, T hi) {
  T x{};
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, x);
  if (v.empty() || ec != std::errc() || p != end || x < lo || x > hi)
    throw std::invalid_argument(opt + " must be an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got '" + v + "'");
  return x;
}

// Seconds as a decimal number (e.g. 300, 0.5) in [lo, hi].
double parse_seconds(const std::string& opt, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  const double x = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(x >= lo && x <= hi))
    throw std::invalid_argument(opt + " must be a number of seconds in [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

}  // namespace

std::string cli_usage() {
  return R"(usage: worker-orcd --model FILE.gguf [options]
       worker-orcd tokenize|detokenize ...   (tokenizer tool)
       worker-orcd generate ...              (one generation on the command line)
       worker-orcd trace ...                 (first op where two backends differ)
       worker-orcd verify RECEIPT --model M  (replay a receipt on the CPU reference)
options:
  --model FILE               GGUF model file (required)
  --port N                   HTTP port, 1024..65535 (default 8080)
  --bind ADDR                listen address (default 127.0.0.1; 0.0.0.0 for all: use --api-key)
  --gpu-device N, --gpu N    CUDA device index (default 0)
  --worker-id UUID           worker id (default: a generated UUID v4)
  --backend cuda|cpu         inference backend (default cuda; no fallback)
  --numerics exact|fast      cuda: exact = the CPU reference's logits bit for bit (default),
                             fast = other summation orders in prompt batches
  --kv-cache f16|f32         KV cache element type (default f16, both backends; with exact
                             numerics cpu and cuda then give the same logits bit for bit)
  --ctx-size N               KV cache context size (default: the model's, capped at 32768)
  --queue-depth N            waiting jobs admitted before 503 WORKER_BUSY (default 16)
  --inference-timeout-sec S  per-job limit in seconds (fractions allowed), then INFERENCE_TIMEOUT (default 300)
  --http-timeout-sec S       a request head must arrive within S seconds, its body within 3*S (default 10)
  --api-key KEY              require Authorization: Bearer KEY (all but /health)
  --tokenizer FILE           use a Hugging Face tokenizer.json (hf-json)
  --log-logits FILE          JSONL parity log of every evaluated position
  --callback-url URL         POST {worker_id, vram_bytes, ...} here when ready
  --help                     this text
  --version                  commit, build date and type, CUDA architectures
)";
}

std::string version_text() {
  return std::string("worker-orcd commit ") + build_info::kCommit + ", built " + build_info::kDate +
         " (" + build_info::kType + "), CUDA arch " + build_info::kCudaArch + "\n";
}

bool is_valid_uuid(const std::string& s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

bool is_loopback_address(const std::string& addr) {
  if (addr == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, addr.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, addr.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

std::string generate_uuid_v4() {
  std::random_device rd;
  std::mt19937_64 gen(((uint64_t(rd()) << 32) ^ rd()));
  uint64_t hi = gen(), lo = gen();
  hi = (hi & ~0xF000ull) | 0x4000ull;                  // version 4
  lo = (lo & ~(0xC000ull << 48)) | (0x8000ull << 48);  // variant 10
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xFFFF),
                static_cast<unsigned long long>(hi & 0xFFFF),
                static_cast<unsigned long long>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFull));
  return buf;
}

CliOptions parse_cli(const std::vector<std::string>& args) {
  CliOptions o;
  bool have_model = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::string val;
    bool has_inline = false;
    if (const auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
    if (a == "--help" || a == "-h") {
      o.help = true;
      continue;
    }
    auto value = [&]() -> std::string {
      if (has_inline) return val;
      if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
      return args[++i];
    };
    if (a == "--model") {
      o.model = value();
      have_model = !o.model.empty();
    } else if (a == "--port") {
      o.port = parse_int<int>(a, value(), 1024, 65535);  // M0-W-1100
    } else if (a == "--bind") {
      o.bind = value();
      if (o.bind.empty()) throw std::invalid_argument("--bind must not be empty");
    } else if (a == "--gpu-device" || a == "--gpu") {
      o.gpu_device = parse_int<int>(a, value(), 0, 1023);
    } else if (a == "--worker-id") {
      o.worker_id = value();
      if (!is_valid_uuid(o.worker_id))
        throw std::invalid_argument("--worker-id must be a UUID (8-4-4-4-12 hex digits), got '" +
                                    o.worker_id + "'");
    } else if (a == "--backend") {
      o.backend = value();
      if (o.backend != "cuda" && o.backend != "cpu")
        throw std::invalid_argument("--backend must be cuda or cpu, got '" + o.backend + "'");
    } else if (a == "--numerics") {
      o.numerics = value();
      if (o.numerics != "exact" && o.numerics != "fast")
        throw std::invalid_argument("--numerics must be exact or fast, got '" + o.numerics + "'");
    } else if (a == "--kv-cache") {
      o.kv_cache = kv_cache_arg(value());
    } else if (a == "--ctx-size") {
      o.ctx_size = parse_int<int32_t>(a, value(), 0, 1 << 20);
    } else if (a == "--queue-depth") {
      o.queue_depth = parse_int<size_t>(a, value(), 0, 4096);
    } else if (a == "--inference-timeout-sec") {
      o.inference_timeout_sec = parse_seconds(a, value(), 0.001, 86400);
    } else if (a == "--http-timeout-sec") {
      o.http_timeout_sec = parse_seconds(a, value(), 0.1, 3600);
    } else if (a == "--api-key") {
      o.api_key = value();
      if (o.api_key.empty()) throw std::invalid_argument("--api-key must not be empty");
    } else if (a == "--tokenizer") {
      o.tokenizer = value();
    } else if (a == "--log-logits") {
      o.log_logits = value();
    } else if (a == "--callback-url") {
      o.callback_url = value();
      if (o.callback_url.rfind("http://", 0) != 0 && o.callback_url.rfind("https://", 0) != 0)
        throw std::invalid_argument("--callback-url must start with http:// or https://");
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (see --help)");
    }
  }
  if (!o.help && !have_model) throw std::invalid_argument("--model is required");
  if (o.worker_id.empty()) {
    o.worker_id = generate_uuid_v4();
    o.worker_id_generated = true;
  }
  return o;
}

}  // namespace worker::server
