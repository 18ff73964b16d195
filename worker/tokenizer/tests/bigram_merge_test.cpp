// merge_bigrams, the merge loop under both the BPE and the SPM tokenizer, on hand-made
// priority tables: which pair goes first, ties, chained merges over stale queue entries,
// and where the text is cut into characters.
#include "tokenizer/bigram_merge.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace worker {
namespace {

using Pieces = std::vector<std::string_view>;

// A priority for each allowed joined text; any other pair is never joined.
auto table(std::map<std::string, int> t) {
  return [t = std::move(t)](std::string_view pair, size_t) -> std::optional<int> {
    auto it = t.find(std::string(pair));
    return it == t.end() ? std::nullopt : std::optional<int>(it->second);
  };
}

TEST(TokenizerBigramMerge, NoPairQualifiesGivesWholeUtf8Characters) {
  EXPECT_EQ(merge_bigrams("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x80", table({}), std::less<int>()),
            (Pieces{"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\xA6\x80"}));
  EXPECT_TRUE(merge_bigrams("", table({}), std::less<int>()).empty());
}

// A lead byte whose sequence runs past the end is cut there, never read beyond the text.
TEST(TokenizerBigramMerge, TruncatedUtf8AtTheEndIsOneShortSymbol) {
  EXPECT_EQ(merge_bigrams("a\xE4\xB8", table({}), std::less<int>()), (Pieces{"a", "\xE4\xB8"}));
  EXPECT_EQ(merge_bigrams(std::string_view("\xF0", 1), table({}), std::less<int>()),
            (Pieces{"\xF0"}));
}

// The same table read as BPE ranks (lowest first) and as SPM scores (highest first).
// REQ: WRK-D3
TEST(TokenizerBigramMerge, BetterDecidesWhichPairGoesFirst) {
  const auto t = table({{"ab", 1}, {"bc", 0}});
  EXPECT_EQ(merge_bigrams("abc", t, std::less<int>()), (Pieces{"a", "bc"}));
  EXPECT_EQ(merge_bigrams("abc", t, std::greater<int>()), (Pieces{"ab", "c"}));
}

// REQ: WRK-D3
TEST(TokenizerBigramMerge, EqualPrioritiesMergeLeftmostFirst) {
  const auto t = table({{"aa", 0}});
  EXPECT_EQ(merge_bigrams("aaa", t, std::less<int>()), (Pieces{"aa", "a"}));
  EXPECT_EQ(merge_bigrams("aaaaa", t, std::less<int>()), (Pieces{"aa", "aa", "a"}));
}

// After "ab" forms, the queued (b, c) pair is stale and must be skipped; the new pair
// (ab, c) and then (abc, d) are queued and joined.
// REQ: WRK-D3
TEST(TokenizerBigramMerge, ChainedMergesSkipStalePairs) {
  const auto t = table({{"ab", 0}, {"bc", 1}, {"abc", 2}, {"cd", 5}, {"abcd", 3}});
  EXPECT_EQ(merge_bigrams("abcd", t, std::less<int>()), (Pieces{"abcd"}));
  // Without the (abc, d) merge the stale (c, d) entry from the start must not rejoin c.
  const auto u = table({{"ab", 0}, {"bc", 1}, {"abc", 2}, {"cd", 5}});
  EXPECT_EQ(merge_bigrams("abcd", u, std::less<int>()), (Pieces{"abc", "d"}));
  // (b, c) was queued before c grew into "cd": it must not join b with "cd".
  EXPECT_EQ(merge_bigrams("abcd", table({{"cd", 0}, {"bc", 1}}), std::less<int>()),
            (Pieces{"a", "b", "cd"}));
}

// The priority sees the joined text and where the left side ends, in bytes.
TEST(TokenizerBigramMerge, PriorityGetsThePairAndItsSplit) {
  std::vector<std::pair<std::string, size_t>> calls;
  const auto spy = [&](std::string_view pair, size_t split) -> std::optional<int> {
    calls.emplace_back(std::string(pair), split);
    return pair == "\xC3\xA9x" ? std::optional<int>(0) : std::nullopt;
  };
  EXPECT_EQ(merge_bigrams("\xC3\xA9xy", spy, std::less<int>()), (Pieces{"\xC3\xA9x", "y"}));
  const std::vector<std::pair<std::string, size_t>> want = {
      {"\xC3\xA9x", 2}, {"xy", 1}, {"\xC3\xA9xy", 3}};
  EXPECT_EQ(calls, want);
}

}  // namespace
}  // namespace worker
