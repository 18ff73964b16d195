#include "engine/parity/logits_record.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"

namespace worker::parity {

LogitsSummary summarize(std::span<const float> logits, size_t top_n) {
  if (logits.empty()) throw WorkerError(ErrorCode::Internal, "summarize: empty logits");
  LogitsSummary s;
  float mx = logits[0];
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > mx) {
      mx = logits[i];
      s.argmax = static_cast<int32_t>(i);
    }
  }
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - static_cast<double>(mx));
  s.logsumexp = static_cast<double>(mx) + std::log(sum);
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const size_t k = std::min(top_n, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k), ids.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = logits[static_cast<size_t>(a)];
                      const float lb = logits[static_cast<size_t>(b)];
                      return la != lb ? la > lb : a < b;
                    });
  for (size_t i = 0; i < k; ++i) {
    s.top_ids.push_back(ids[i]);
    s.top_logits.push_back(logits[static_cast<size_t>(ids[i])]);
  }
  return s;
}

nlohmann::json logits_record(std::span<const float> logits, const std::string& checkpoint,
                             const std::string& job_id, int64_t token_idx, size_t n_values) {
  const LogitsSummary s = summarize(logits);
  const size_t n = std::min(n_values, logits.size());
  return {
      {"checkpoint", checkpoint},
      {"job_id", job_id},
      {"token_idx", token_idx},
      {"dtype", "f32"},
      {"shape", {logits.size()}},
      {"values", std::vector<float>(logits.begin(), logits.begin() + static_cast<ptrdiff_t>(n))},
      {"argmax", s.argmax},
      {"logsumexp", s.logsumexp},
      {"top", {{"ids", s.top_ids}, {"logits", s.top_logits}}}};
}

}  // namespace worker::parity
