#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <memory>

#include "common/utf8.h"
#include "tokenizer/unicode_tables.h"

namespace worker::unicode {
namespace {

constexpr uint32_t kMaxCp = 0x110000;

// One flags entry per code point (2.2 MB), built once: lookups are on the hot path of every
// pre-tokenizer step.
const std::vector<uint16_t>& flag_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(kMaxCp, kUndefined);
    for (size_t i = 0; i < tables::kCategoryRangeCount; ++i) {
      const uint32_t begin = tables::kCategoryRanges[i].first;
      const uint32_t end =
          i + 1 < tables::kCategoryRangeCount ? tables::kCategoryRanges[i + 1].first : kMaxCp;
      std::fill(t.begin() + begin, t.begin() + end, tables::kCategoryRanges[i].value);
    }
    for (size_t i = 0; i < tables::kWhitespaceCount; ++i) t[tables::kWhitespace[i]] |= kWhitespace;
    return t;
  }();
  return table;
}

struct ByteMaps {
  std::array<std::string, 256> to_unicode;
  std::vector<int16_t> from_unicode;  // indexed by code point < 324
};

// The GPT-2 mapping: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.
const ByteMaps& byte_maps() {
  static const ByteMaps maps = [] {
    ByteMaps m;
    m.from_unicode.assign(512, -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(m.to_unicode[b], cp);
      m.from_unicode[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

void decompose_into(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {  // Hangul syllables decompose algorithmically
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* begin = tables::kDecompositions;
  const auto* end = begin + tables::kDecompositionCount;
  const auto* it = std::lower_bound(
      begin, end, cp, [](const tables::Decomposition& d, uint32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose_into(it->first, out);
  if (it->second != 0) decompose_into(it->second, out);
}

// Primary composites {first, second, composite}, sorted: the two-code-point canonical
// decompositions read backwards, for a starter first and a composite not excluded (UAX #15).
const std::vector<std::array<uint32_t, 3>>& compositions() {
  static const std::vector<std::array<uint32_t, 3>> pairs = [] {
    std::vector<std::array<uint32_t, 3>> out;
    const auto* ex = tables::kCompositionExclusions;
    const auto* ex_end = ex + tables::kCompositionExclusionCount;
    for (size_t i = 0; i < tables::kDecompositionCount; ++i) {
      const auto& d = tables::kDecompositions[i];
      if (d.second != 0 && !std::binary_search(ex, ex_end, d.cp) && combining_class(d.first) == 0)
        out.push_back({d.first, d.second, d.cp});
    }
    std::sort(out.begin(), out.end());
    return out;
  }();
  return pairs;
}

uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& pairs = compositions();
  const auto it = std::lower_bound(pairs.begin(), pairs.end(), std::array<uint32_t, 3>{a, b, 0});
  const auto end = pairs.end();
  if (it != end && (*it)[0] == a && (*it)[1] == b) return (*it)[2];
  return 0;
}

}  // namespace

uint16_t flags(uint32_t cp) {
  return cp < kMaxCp ? flag_table()[cp] : static_cast<uint16_t>(kUndefined);
}

size_t utf8_len(uint8_t lead) {
  static constexpr size_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[lead >> 4];
}

std::vector<uint32_t> decode_lenient(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  auto cont = [&](size_t k) { return k < n && (p[k] & 0xC0) == 0x80; };
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      out.push_back(c);
      i += 1;
    } else if ((c & 0x40) == 0) {
      out.push_back(0xFFFD);
      i += 1;
    } else if ((c & 0x20) == 0) {
      if (!cont(i + 1)) {
        out.push_back(0xFFFD);
        i += 1;
        continue;
      }
      out.push_back((static_cast<uint32_t>(c & 0x1F) << 6) | (p[i + 1] & 0x3F));
      i += 2;
    } else if ((c & 0x10) == 0) {
      if (!cont(i + 1) || !cont(i + 2)) {
        out.push_back(0xFFFD);
        i += 1;
        continue;
      }
      out.push_back((static_cast<uint32_t>(c & 0x0F) << 12) |
                    (static_cast<uint32_t>(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F));
      i += 3;
    } else if ((c & 0x08) == 0) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) {
        out.push_back(0xFFFD);
        i += 1;
        continue;
      }
      out.push_back((static_cast<uint32_t>(c & 0x07) << 18) |
                    (static_cast<uint32_t>(p[i + 1] & 0x3F) << 12) |
                    (static_cast<uint32_t>(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F));
      i += 4;
    } else {
      out.push_back(0xFFFD);
      i += 1;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  utf8::append(out, cp < kMaxCp ? cp : 0xFFFD);
}

std::string to_utf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  out.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
  return out;
}

const std::string& byte_to_unicode(uint8_t b) {
  return byte_maps().to_unicode[b];
}

int unicode_to_byte(uint32_t cp) {
  const auto& m = byte_maps().from_unicode;
  return cp < m.size() ? m[cp] : -1;
}

uint8_t combining_class(uint32_t cp) {
  const auto* begin = tables::kCombiningClasses;
  const auto* end = begin + tables::kCombiningClassCount;
  const auto* it = std::upper_bound(begin, end, cp,
                                    [](uint32_t c, const tables::Range& r) { return c < r.first; });
  return it == begin ? 0 : (it - 1)->value;
}

std::string nfc(std::string_view s) {
  // Fast path: ASCII is always NFC.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
    return std::string(s);
  }
  std::vector<uint32_t> d;
  d.reserve(s.size());
  for (uint32_t cp : decode_lenient(s)) decompose_into(cp, d);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(
        d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
        [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition (UAX #15): combine each character with the last starter unless
  // blocked by an intervening character of equal or higher class.
  std::vector<uint32_t> out;
  out.reserve(d.size());
  if (d.empty()) return {};
  size_t starter = 0;
  out.push_back(d[0]);
  // last_class 0 means "the previous character is the starter itself"; 256 blocks
  // composition when the text begins with a non-starter.
  int last_class = combining_class(d[0]) == 0 ? 0 : 256;
  for (size_t i = 1; i < d.size(); ++i) {
    const uint32_t cp = d[i];
    const int cls = combining_class(cp);
    if (last_class < cls || last_class == 0) {
      const uint32_t comp = compose_pair(out[starter], cp);
      if (comp != 0) {
        out[starter] = comp;
        continue;
      }
    }
    if (cls == 0) starter = out.size();
    last_class = cls;
    out.push_back(cp);
  }
  return to_utf8(out, 0, out.size());
}

}  // namespace worker::unicode
