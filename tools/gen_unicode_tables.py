#!/usr/bin/env python3
"""Generates worker/tokenizer/unicode_tables.cpp from the Unicode Character Database.

Input: Debian's unicode-data package (/usr/share/unicode: UnicodeData.txt, PropList.txt,
CompositionExclusions.txt). Output: C++ tables used by the tokenizers:
  - general-category flags per code point range (\\p{L}, \\p{N}, \\p{P}, ...), the way
    llama.cpp groups categories into flags (Cn -> undefined, Cc/Cf/Co/Cs -> control, ...),
  - the White_Space property,
  - canonical combining classes, canonical decompositions and the composition exclusions
    (for NFC, used by the hf-json tokenizer's normalizer; unicode.cpp derives the
    composition pairs from the decompositions).

Usage: tools/gen_unicode_tables.py [UCD_DIR] > worker/tokenizer/unicode_tables.cpp
Only the Python standard library is needed.
"""
import os
import re
import sys

MAX_CP = 0x110000

# Flag bits; must match worker/tokenizer/unicode.h.
UNDEFINED, NUMBER, LETTER, SEPARATOR, MARK, PUNCT, SYMBOL, CONTROL = (
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80)
CATEGORY_FLAGS = {
    "Cn": UNDEFINED, "Cc": CONTROL, "Cf": CONTROL, "Co": CONTROL, "Cs": CONTROL,
    "Ll": LETTER, "Lm": LETTER, "Lo": LETTER, "Lt": LETTER, "Lu": LETTER,
    "Mc": MARK, "Me": MARK, "Mn": MARK,
    "Nd": NUMBER, "Nl": NUMBER, "No": NUMBER,
    "Pc": PUNCT, "Pd": PUNCT, "Pe": PUNCT, "Pf": PUNCT, "Pi": PUNCT, "Po": PUNCT, "Ps": PUNCT,
    "Sc": SYMBOL, "Sk": SYMBOL, "Sm": SYMBOL, "So": SYMBOL,
    "Zl": SEPARATOR, "Zp": SEPARATOR, "Zs": SEPARATOR,
}


def read_unicode_data(path):
    """Yields (cp, category, ccc, decomposition string) for every assigned code point."""
    first = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            cp = int(fields[0], 16)
            name, cat, ccc, decomp = fields[1], fields[2], int(fields[3]), fields[5]
            if name.endswith(", First>"):
                first = cp
                continue
            if name.endswith(", Last>"):
                for c in range(first, cp + 1):
                    yield c, cat, ccc, ""
                first = None
                continue
            yield cp, cat, ccc, decomp


def read_ranges(path, prop):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            rng, name = [x.strip() for x in line.split(";")[:2]]
            if name != prop:
                continue
            if ".." in rng:
                a, b = rng.split("..")
                out.extend(range(int(a, 16), int(b, 16) + 1))
            else:
                out.append(int(rng, 16))
    return out


def read_exclusions(path):
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                out.add(int(line, 16))
    return out


def main():
    ucd = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode"
    flags = bytearray([UNDEFINED]) * MAX_CP
    ccc = {}
    decomp = {}
    for cp, cat, cc, d in read_unicode_data(os.path.join(ucd, "UnicodeData.txt")):
        flags[cp] = CATEGORY_FLAGS[cat]
        if cc:
            ccc[cp] = cc
        if d and not d.startswith("<"):  # canonical decompositions only
            decomp[cp] = [int(x, 16) for x in d.split()]
    whitespace = read_ranges(os.path.join(ucd, "PropList.txt"), "White_Space")
    exclusions = read_exclusions(os.path.join(ucd, "CompositionExclusions.txt"))

    ranges = []
    for cp in range(MAX_CP):
        if not ranges or ranges[-1][1] != flags[cp]:
            ranges.append((cp, flags[cp]))

    # Combining classes as boundaries, like the category ranges: code points from `first`
    # up to the next boundary share the class (0 between the listed ones).
    ccc_ranges = []
    for cp in range(MAX_CP):
        if not ccc_ranges or ccc_ranges[-1][1] != ccc.get(cp, 0):
            ccc_ranges.append((cp, ccc.get(cp, 0)))

    # The canonical composition pairs are not written: unicode.cpp derives them from the
    # decompositions (UAX #15 primary composites: two-code-point decompositions whose first
    # element is a starter, minus these exclusions).
    excluded = sorted(cp for cp in exclusions if len(decomp.get(cp, [])) == 2)

    version = "unknown"
    readme = os.path.join(ucd, "ReadMe.txt")
    if os.path.exists(readme):
        with open(readme, encoding="utf-8", errors="replace") as f:
            m = re.search(r"Unicode(\d+\.\d+\.\d+)", f.read())
            if m:
                version = "Unicode " + m.group(1)

    w = sys.stdout.write
    w("// GENERATED FILE - do not edit. Produced by tools/gen_unicode_tables.py from the\n")
    w("// Unicode Character Database (Debian unicode-data: UnicodeData.txt, PropList.txt,\n")
    w("// CompositionExclusions.txt). The data is Unicode's (Unicode license); the layout is ours.\n")
    w(f"// UCD: {version}\n")
    w('#include "tokenizer/unicode_tables.h"\n\n')
    w("// clang-format off\n")
    w("namespace worker::unicode::tables {\n\n")
    w("const Range kCategoryRanges[] = {\n")
    for i in range(0, len(ranges), 6):
        w("    " + " ".join(f"{{0x{a:X}, 0x{b:02X}}}," for a, b in ranges[i:i + 6]) + "\n")
    w("};\n")
    w(f"const size_t kCategoryRangeCount = {len(ranges)};\n\n")
    w("const uint32_t kWhitespace[] = {\n    ")
    w(", ".join(f"0x{c:X}" for c in sorted(whitespace)))
    w("};\n")
    w(f"const size_t kWhitespaceCount = {len(whitespace)};\n\n")
    w("const Range kCombiningClasses[] = {\n")
    for i in range(0, len(ccc_ranges), 8):
        w("    " + " ".join(f"{{0x{a:X}, {c}}}," for a, c in ccc_ranges[i:i + 8]) + "\n")
    w("};\n")
    w(f"const size_t kCombiningClassCount = {len(ccc_ranges)};\n\n")
    w("const Decomposition kDecompositions[] = {\n")
    items = sorted(decomp.items())
    for i in range(0, len(items), 4):
        parts = []
        for cp, d in items[i:i + 4]:
            second = d[1] if len(d) > 1 else 0
            parts.append(f"{{0x{cp:X}, 0x{d[0]:X}, 0x{second:X}}},")
        w("    " + " ".join(parts) + "\n")
    w("};\n")
    w(f"const size_t kDecompositionCount = {len(items)};\n\n")
    w("const uint32_t kCompositionExclusions[] = {\n")
    for i in range(0, len(excluded), 10):
        w("    " + " ".join(f"0x{c:X}," for c in excluded[i:i + 10]) + "\n")
    w("};\n")
    w(f"const size_t kCompositionExclusionCount = {len(excluded)};\n\n")
    w("// clang-format on\n")
    w("}  // namespace worker::unicode::tables\n")
    assert all(len(d) <= 2 for d in decomp.values())


if __name__ == "__main__":
    main()
