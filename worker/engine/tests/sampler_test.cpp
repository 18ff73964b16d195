// Sampler unit tests: each filter against a hand-computed distribution, the draw against
// the softmax (chi-square), reproducibility with a fixed seed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "common/errors.h"
#include "engine/sampler.h"
#include "engine/sampler_math.h"

namespace worker {
namespace {

std::vector<double> softmax(const std::vector<double>& l) {
  double mx = l[0];
  for (double x : l) mx = std::max(mx, x);
  double s = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) s += (p[i] = std::exp(l[i] - mx));
  for (double& x : p) x /= s;
  return p;
}

// REQ: M0-W-1032 M0-W-1421
TEST(EngineSampler, TemperatureZeroIsGreedyWithLowestIdTie) {
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  SamplingParams p;
  p.temperature = 0.0f;
  std::mt19937_64 rng(123);
  const auto before = rng;
  EXPECT_EQ(sample_logits(logits, p, {}, rng), 1);
  EXPECT_EQ(rng, before) << "greedy must not consume randomness";
  EXPECT_EQ(argmax(logits), 1);
  logits[3] = 3.5f;
  EXPECT_EQ(sample_logits(logits, p, {}, rng), 3);
}

// REQ: M0-W-1421
TEST(EngineSampler, RepetitionPenaltyAsLlamaCpp) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f};
  const std::vector<int32_t> history = {0, 1, 0,
                                        0, 7, -3};  // repeats counted once; out of range ignored
  apply_repetition_penalty(logits, 2.0f, history);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);   // positive: divided once
  EXPECT_FLOAT_EQ(logits[1], -4.0f);  // negative: multiplied
  EXPECT_FLOAT_EQ(logits[2], 1.0f);
  EXPECT_FLOAT_EQ(logits[3], 0.5f);
  // Greedy with the penalty: ids 0 and 2 tie at 1.0 -> lowest id.
  std::vector<float> l2 = {2.0f, -2.0f, 1.5f, 0.5f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample_logits(l2, p, std::vector<int32_t>{0}, rng), 2);
  EXPECT_EQ(sample_logits(l2, p, std::vector<int32_t>{}, rng), 0);
}

// REQ: M0-W-1421 M0-W-1032
TEST(EngineSampler, TopKAndTemperature) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f, 2.0f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 3;
  const auto c = sampler_candidates(logits, p, {});
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].id, 1);
  EXPECT_EQ(c[1].id, 2);  // tie 2.0: lower id first
  EXPECT_EQ(c[2].id, 4);
  // softmax of {6, 4, 4} (logits / 0.5)
  const auto ref = softmax({6.0, 4.0, 4.0});
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(c[i].p, ref[i], 1e-9);  // 2^-32 weight steps
  EXPECT_EQ(c[0].weight, 4294967296ull);
}

// REQ: M0-W-1421
TEST(EngineSampler, TopPKeepsSmallestPrefixReachingP) {
  // probabilities 0.5, 0.25, 0.125, 0.125 exactly (logits are log2 multiples)
  const std::vector<float> logits = {std::log(0.125f), std::log(0.5f), std::log(0.25f),
                                     std::log(0.125f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.75 -> {1, 2}
  auto c = sampler_candidates(logits, p, {});
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 1);
  EXPECT_EQ(c[1].id, 2);
  EXPECT_NEAR(c[0].p, 0.5, 1e-6);
  EXPECT_NEAR(c[1].p, 0.25, 1e-6);
  p.top_p = 0.5f;  // exactly reached by the first
  EXPECT_EQ(sampler_candidates(logits, p, {}).size(), 1u);
  p.top_p = 0.0f;  // at least one kept
  EXPECT_EQ(sampler_candidates(logits, p, {}).size(), 1u);
  p.top_p = 0.9f;  // 0.875 < 0.9 -> all four, tie at 0.125: id 0 before id 3
  c = sampler_candidates(logits, p, {});
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[2].id, 0);
  EXPECT_EQ(c[3].id, 3);
}

// REQ: M0-W-1421
TEST(EngineSampler, MinPRelativeToMax) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f),
                                     std::log(0.1f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.45f;  // keep p >= 0.18
  auto c = sampler_candidates(logits, p, {});
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].id, 2);
  p.min_p = 0.76f;  // 0.3 < 0.304 -> only the max
  EXPECT_EQ(sampler_candidates(logits, p, {}).size(), 1u);
  // top-p then min-p compose: top_p 0.95 keeps {0,1,2,3}, min_p 0.45 drops id 3
  p.top_p = 0.95f;
  p.min_p = 0.45f;
  EXPECT_EQ(sampler_candidates(logits, p, {}).size(), 3u);
}

// REQ: M0-W-1421 M0-W-1030
TEST(EngineSampler, DrawFromKeptSetOnly) {
  const std::vector<float> logits = {0.0f, 5.0f, 4.9f, -3.0f, 4.8f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  std::mt19937_64 rng(7);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 2000; ++i) counts[sample_logits(logits, p, {}, rng)]++;
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
}

// REQ: M0-W-1421 M0-W-1030
TEST(EngineSampler, ChiSquareAtTemperatureOneMatchesSoftmax) {
  const std::vector<float> logits = {0.1f, 1.3f, -0.7f, 2.0f, 0.0f, 1.0f, -2.0f, 0.5f};
  std::vector<double> ld(logits.begin(), logits.end());
  const auto prob = softmax(ld);
  SamplingParams p;
  p.temperature = 1.0f;
  std::mt19937_64 rng(20261125);
  const int n = 200000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) counts[static_cast<size_t>(sample_logits(logits, p, {}, rng))]++;
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = prob[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 7 degrees of freedom: P(chi2 > 24.32) = 0.001
  EXPECT_LT(chi2, 24.32) << "sampled frequencies do not follow the softmax";
  // and a deliberately wrong distribution (temperature 2) must be rejected by the statistic
  p.temperature = 2.0f;
  std::vector<int> c2(logits.size(), 0);
  for (int i = 0; i < n; ++i) c2[static_cast<size_t>(sample_logits(logits, p, {}, rng))]++;
  double chi2_wrong = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = prob[i] * n;
    chi2_wrong += (c2[i] - e) * (c2[i] - e) / e;
  }
  EXPECT_GT(chi2_wrong, 24.32);
}

// REQ: M0-W-1030 M0-SYS-2.3.1 WRK-D15
TEST(EngineSampler, SameSeedSameIdsTenRuns) {
  std::vector<float> logits(1000);
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& x : logits) x = nd(g);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.top_k = 50;
  p.min_p = 0.01f;
  p.repetition_penalty = 1.1f;
  auto run = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> hist;
    for (int i = 0; i < 64; ++i) hist.push_back(sample_logits(logits, p, hist, rng));
    return hist;
  };
  const auto first = run(42);
  for (int r = 0; r < 9; ++r) EXPECT_EQ(run(42), first);
  EXPECT_NE(run(43), first);
}

TEST(EngineSampler, DrawIs53BitsOfTheGenerator) {
  std::mt19937_64 rng(9);
  std::mt19937_64 ref(9);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t d = sampler_draw(rng);
    ASSERT_LT(d, uint64_t{1} << 53);
    EXPECT_EQ(d, ref() >> 11);
  }
}

// The integer weights follow e^d closely (within 2^-32 of the top weight), never increase as
// d falls, are exactly 2^32 at 0 and 0 below about -22.2 (WRK-D18).
// REQ: WRK-D18 M0-W-1421
TEST(EngineSampler, WeightsAreFloorOfScaledExp) {
  namespace sm = sampler_math;
  EXPECT_EQ(sm::weight(0.0f), 4294967296ull);
  EXPECT_EQ(sm::weight(-0.0f), 4294967296ull);
  EXPECT_EQ(sm::weight(-23.0f), 0u);
  EXPECT_EQ(sm::weight(std::nanf("")), 0u);
  EXPECT_EQ(sm::weight(-std::numeric_limits<float>::infinity()), 0u);
  uint64_t prev = sm::weight(0.0f);
  int checked = 0;
  for (float d = 0.0f; d > -23.0f; d = std::nextafter(d, -100.0f) - 1e-4f) {
    const uint64_t w = sm::weight(d);
    const double want = std::ldexp(std::exp(static_cast<double>(d)), 32);
    ASSERT_LE(std::fabs(static_cast<double>(w) - want), 1.0 + want * 1e-15) << "d=" << d;
    ASSERT_LE(w, prev) << "weights must not increase as d falls, d=" << d;
    prev = w;
    ++checked;
  }
  EXPECT_GT(checked, 200000);
  // e^-22.18 * 2^32 < 1: the cut-off follows from the floor, not from a second rule
  EXPECT_EQ(sm::weight(-22.25f), 0u);
  EXPECT_EQ(sm::weight(-22.0f), 1u);
}

// The draw maps 53 random bits onto [0, total) exactly: floor(u * total / 2^53).
// REQ: WRK-D18
TEST(EngineSampler, ScaledDrawIsExact) {
  namespace sm = sampler_math;
  const uint64_t top = (uint64_t{1} << 53) - 1;
  EXPECT_EQ(sm::scale_draw(0, 12345), 0u);
  EXPECT_EQ(sm::scale_draw(top, 1), 0u);
  EXPECT_EQ(sm::scale_draw(top, uint64_t{1} << 49), (uint64_t{1} << 49) - 1);
  EXPECT_EQ(sm::scale_draw(uint64_t{1} << 52, 1000), 500u);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t u = rng() >> 11, t = (rng() >> 14) + 1;
    __extension__ typedef unsigned __int128 u128;
    const auto want = static_cast<uint64_t>((static_cast<u128>(u) * t) >> 53);
    ASSERT_EQ(sm::scale_draw(u, t), want);
    ASSERT_LT(sm::scale_draw(u, t), t);
  }
}

// The receipt's logits hash sees every bit of every logit and the vector's length, and not
// the order in which its terms are added.
// REQ: WRK-D18
TEST(EngineSampler, LogitsHashSeesEveryBit) {
  std::vector<float> l(1000);
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& x : l) x = nd(g);
  const uint64_t h = logits_hash(l);
  EXPECT_EQ(logits_hash(l), h);
  for (size_t i : {size_t{0}, size_t{500}, size_t{999}}) {
    auto m = l;
    m[i] = std::nextafter(m[i], 100.0f);
    EXPECT_NE(logits_hash(m), h) << i;
  }
  auto z = l;
  z[3] = 0.0f;
  auto nz = l;
  nz[3] = -0.0f;
  EXPECT_NE(logits_hash(z), logits_hash(nz));
  auto sw = l;
  std::swap(sw[1], sw[2]);
  EXPECT_NE(logits_hash(sw), h);  // positions are part of each term
  EXPECT_NE(logits_hash(std::span<const float>(l).first(999)), h);
}

TEST(EngineSampler, RejectsBadInput) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  EXPECT_THROW(sample_logits(std::vector<float>{}, p, {}, rng), WorkerError);
  p.repetition_penalty = 0.0f;
  EXPECT_THROW(sample_logits(std::vector<float>{1.0f}, p, {}, rng), WorkerError);
}

}  // namespace
}  // namespace worker
