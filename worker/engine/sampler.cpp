#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <unordered_set>

#include "common/errors.h"
#include "engine/sampler_math.h"

namespace worker {

uint64_t sampler_draw(std::mt19937_64& rng) {
  return rng() >> 11;
}

uint64_t logits_hash(std::span<const float> logits) {
  uint64_t sum = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    sum += sampler_math::logit_term(static_cast<uint32_t>(i), logits[i]);
  return sampler_math::logits_hash_final(sum, logits.size());
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

void check_sampling_params(const SamplingParams& p) {
  if (!(p.repetition_penalty > 0.0f))
    throw WorkerError(ErrorCode::InvalidRequest, "repetition_penalty must be > 0");
  if (p.top_k < 0) throw WorkerError(ErrorCode::InvalidRequest, "top_k must be >= 0");
}

namespace {

void check_params(std::span<const float> logits, const SamplingParams& p) {
  if (logits.empty()) throw WorkerError(ErrorCode::Internal, "sampling from empty logits");
  check_sampling_params(p);
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

  // Steps 4-6 on integer weights (sampler_math.h); only the float division by the
  // temperature and the subtraction round, each once and identically on the GPU.
  std::vector<SampleCandidate> cand(n);
  const float s0 = work[static_cast<size_t>(ids[0])] / params.temperature;
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const float scaled = work[static_cast<size_t>(ids[i])] / params.temperature;
    cand[i] = {ids[i],
               i == 0 ? static_cast<uint64_t>(sampler_math::kWeightOne)
                      : sampler_math::weight(scaled - s0),
               0.0};
    total += cand[i].weight;
  }
  for (auto& c : cand) c.p = static_cast<double>(c.weight) / static_cast<double>(total);

  size_t keep = n;
  if (params.top_p < 1.0f) {
    const double threshold = sampler_math::top_p_threshold(params.top_p, total);
    uint64_t cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += cand[i].weight;
      if (static_cast<double>(cum) >= threshold) {
        keep = i + 1;
        break;
      }
    }
  }
  if (params.min_p > 0.0f) {
    const double threshold = sampler_math::min_p_threshold(params.min_p);
    for (size_t i = 1; i < keep; ++i) {
      if (!(static_cast<double>(cand[i].weight) >= threshold)) {
        keep = i;
        break;
      }
    }
  }
  cand.resize(keep);
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
  uint64_t total = 0;
  for (const auto& c : cand) total += c.weight;
  const uint64_t target = sampler_math::scale_draw(sampler_draw(rng), total);
  uint64_t cum = 0;
  for (const auto& c : cand) {
    cum += c.weight;
    if (target < cum) return c.id;
  }
  throw WorkerError(ErrorCode::Internal, "sampler: draw beyond the kept weights");
}

}  // namespace worker
