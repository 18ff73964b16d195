#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <unordered_set>

#include "common/errors.h"

namespace worker {

double sampler_uniform(std::mt19937_64& rng) {
  // 53 random bits -> a double in [0, 1); independent of the standard library's
  // distribution implementations, so every build and backend agrees.
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

int32_t argmax(std::span<const float> v) {
  if (v.empty()) throw WorkerError(ErrorCode::Internal, "argmax over an empty logits vector");
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[best]) best = i;  // strict: the lowest id wins ties
  }
  return static_cast<int32_t>(best);
}

void apply_repetition_penalty(std::span<float> logits, float penalty,
                              std::span<const int32_t> history) {
  if (penalty == 1.0f || history.empty()) return;
  std::unordered_set<int32_t> seen;
  for (int32_t id : history) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
    if (!seen.insert(id).second) continue;  // each distinct token penalised once
    float& l = logits[static_cast<size_t>(id)];
    l = l > 0.0f ? l / penalty : l * penalty;
  }
}

namespace {

void check_params(std::span<const float> logits, const SamplingParams& p) {
  if (logits.empty()) throw WorkerError(ErrorCode::Internal, "sampling from empty logits");
  if (!(p.repetition_penalty > 0.0f))
    throw WorkerError(ErrorCode::InvalidRequest, "repetition_penalty must be > 0");
  if (p.top_k < 0) throw WorkerError(ErrorCode::InvalidRequest, "top_k must be >= 0");
}

}  // namespace

std::vector<SampleCandidate> sampler_candidates(std::span<const float> logits,
                                                const SamplingParams& params,
                                                std::span<const int32_t> history) {
  check_params(logits, params);
  if (!(params.temperature > 0.0f))
    throw WorkerError(ErrorCode::Internal, "sampler_candidates needs temperature > 0");
  std::vector<float> work(logits.begin(), logits.end());
  apply_repetition_penalty(work, params.repetition_penalty, history);

  std::vector<int32_t> ids(work.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    const float la = work[static_cast<size_t>(a)], lb = work[static_cast<size_t>(b)];
    return la != lb ? la > lb : a < b;
  };
  size_t n = ids.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
    n = static_cast<size_t>(params.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(), before);
    ids.resize(n);
  } else {
    std::sort(ids.begin(), ids.end(), before);
  }

  std::vector<SampleCandidate> cand(n);
  std::vector<float> scaled(n);
  for (size_t i = 0; i < n; ++i) scaled[i] = work[static_cast<size_t>(ids[i])] / params.temperature;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cand[i].id = ids[i];
    cand[i].p = std::exp(static_cast<double>(scaled[i] - scaled[0]));
    sum += cand[i].p;
  }
  for (auto& c : cand) c.p /= sum;

  if (params.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += cand[i].p;
      if (cum >= static_cast<double>(params.top_p)) {
        keep = i + 1;
        break;
      }
    }
    cand.resize(std::max<size_t>(keep, 1));
  }
  if (params.min_p > 0.0f) {
    const double threshold = static_cast<double>(params.min_p) * cand[0].p;
    size_t keep = 1;
    while (keep < cand.size() && cand[keep].p >= threshold) ++keep;
    cand.resize(keep);
  }
  return cand;
}

int32_t sample_logits(std::span<const float> logits, const SamplingParams& params,
                      std::span<const int32_t> history, std::mt19937_64& rng) {
  check_params(logits, params);
  if (!(params.temperature > 0.0f)) {
    if (params.repetition_penalty == 1.0f || history.empty()) return argmax(logits);
    std::vector<float> work(logits.begin(), logits.end());
    apply_repetition_penalty(work, params.repetition_penalty, history);
    return argmax(work);
  }
  const std::vector<SampleCandidate> cand = sampler_candidates(logits, params, history);
  double total = 0.0;
  for (const auto& c : cand) total += c.p;
  const double u = sampler_uniform(rng) * total;
  double cum = 0.0;
  for (const auto& c : cand) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return cand.back().id;
}

}  // namespace worker
