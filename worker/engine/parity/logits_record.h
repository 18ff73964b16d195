#pragma once
// The D16 parity record of one evaluated position, shared by the CLI (--log-logits) and
// tools/compare_logits.py. Same fields as the server's log: checkpoint, job_id, token_idx,
// dtype, shape, values (the first n_values logits; all of them for full comparisons),
// argmax, logsumexp, top {ids, logits} (10 highest, lowest id first on ties).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

namespace worker::parity {

inline constexpr size_t kTopN = 10;

struct LogitsSummary {
  int32_t argmax = 0;
  double logsumexp = 0;  // log(sum(exp(logits))) in double
  std::vector<int32_t> top_ids;
  std::vector<float> top_logits;
};

LogitsSummary summarize(std::span<const float> logits, size_t top_n = kTopN);

// n_values == SIZE_MAX (or >= vocab) writes the whole vector.
nlohmann::json logits_record(std::span<const float> logits, const std::string& checkpoint,
                             const std::string& job_id, int64_t token_idx,
                             size_t n_values = SIZE_MAX);

}  // namespace worker::parity
