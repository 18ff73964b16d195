#!/usr/bin/env python3
"""Counts a CUDA kernel's PTX instructions loop by loop: the "count first" step of
reports/perf-notes.md, done before any device time.

    nvcc ... -arch=sm_90a -ptx -x cu kernels/matmul_qgemm.cu -o /tmp/q.ptx
    tools/ptxcount.py /tmp/q.ptx 'qmma_kernel.*GgmlTypeE8ELb0'
    nvcc ... -lineinfo -ptx ...; tools/ptxcount.py --by-source 30 /tmp/s.ptx 'decode_step_kernel.*E12E'

For the first kernel whose mangled name matches the regular expression, it splits the body
into basic blocks (at `$L__BB...:` labels), finds each loop (a branch back to an earlier
label: the blocks from that label to the branch), and prints for each loop its static
instruction count, its opcode histogram and the share of FFMA-class instructions
(`fma.rn.f32`), which is what an FP32-chain floor is counted in. PTX is not SASS, but
straight-line arithmetic maps about one to one: for the Q0 prompt tiles of v37 the loop
body's FFMA share (27.2% for wq0) matched the share ncu measured (27.6%).

With --by-source N (PTX made with -lineinfo) it also says where the kernel's code comes from:
its instructions counted by the source location of the `.loc` before them, summed by file, by
function (the innermost function or lambda whose braces hold the line in its source file: a
heuristic, as inlined calls keep only the callee's lines) and the N lines of most
instructions, each with its source text when the file can be read. For a kernel whose size is
the question (a persistent kernel's code against the instruction caches), this is where to cut.

Exit status: 0 when the kernel was found, 1 when no kernel matches, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

LABEL = re.compile(r"^(\$L__BB\S+):$")
LOC = re.compile(r"^\.loc\s+(\d+)\s+(\d+)\b")
FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"')
# a function or lambda head in C++ / CUDA source (by_source's attribution)
FUNC_HEAD = re.compile(
    r"^\s*(?:template\s*<.*>\s*)?(?:static\s+)?(?:__global__|__device__|__host__|EXQ_HD|inline)\b"
    r"|=\s*\[[^\]]*\]\s*\(|^\s*\[[^\]]*\]\s*\(")
ENTRY = re.compile(r"^\.(?:visible\s+|weak\s+)?\.?entry\s+(\S+)\(")
BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB[^;\s]+);")


class Block:
    """A basic block: its label, one opcode per instruction, the labels it branches to."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.ops: list[str] = []
        self.targets: list[str] = []


def opcode(instr: str) -> str:
    """The instruction's opcode with its type suffixes (`fma.rn.f32`), predicate dropped."""
    words = instr.split()
    if words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";")


def kernel_body(ptx: str, pattern: str) -> tuple[str, list[str]] | None:
    """The first entry whose name matches `pattern`: its name and its body's lines."""
    lines = ptx.splitlines()
    rx = re.compile(pattern)
    for i, line in enumerate(lines):
        m = ENTRY.match(line.strip())
        if not m or not rx.search(m.group(1)):
            continue
        depth, body, opened = 0, [], False
        for line2 in lines[i + 1 :]:
            s = line2.strip()
            depth += s.count("{") - s.count("}")
            if s.startswith("{") and not opened:
                opened = True
                continue
            if opened and depth <= 0:
                break
            if opened:
                body.append(s)
        return m.group(1), body
    return None


def blocks_of(body: list[str]) -> list[Block]:
    blocks = [Block("entry")]
    for s in body:
        m = LABEL.match(s)
        if m:
            blocks.append(Block(m.group(1)))
            continue
        # inline-asm scopes: `{  cvt.f32.f16 %f1, %rs1;}` is one instruction
        s = s.strip("{} \t")
        if not s or s.startswith("//") or s.startswith("."):
            continue
        blocks[-1].ops.append(opcode(s))
        b = BRANCH.search(s)
        if b:
            blocks[-1].targets.append(b.group(1))
    return blocks


def loops_of(blocks: list[Block]) -> list[tuple[int, int]]:
    """(first, last) block indices of every loop: a branch from block `last` back to the
    label of block `first` <= last. Sorted by first, then by size."""
    index = {b.label: i for i, b in enumerate(blocks)}
    found = set()
    for i, b in enumerate(blocks):
        for t in b.targets:
            j = index.get(t)
            if j is not None and j <= i:
                found.add((j, i))
    return sorted(found, key=lambda r: (r[0], r[1] - r[0]))


def histogram(blocks: list[Block]) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for b in blocks:
        c.update(b.ops)
    return c


def is_ffma(op: str) -> bool:
    return op.startswith("fma.") and op.endswith(".f32")


def report(name: str, blocks: list[Block], top: int) -> str:
    out = [f"kernel {name}", f"  body: {sum(len(b.ops) for b in blocks)} instructions, "
           f"{len(blocks)} blocks"]
    for first, last in loops_of(blocks):
        h = histogram(blocks[first : last + 1])
        n = sum(h.values())
        ffma = sum(v for k, v in h.items() if is_ffma(k))
        share = f"{100.0 * ffma / n:.1f}%" if n else "-"
        per = f"{(n - ffma) / ffma:.2f}" if ffma else "-"
        out.append(f"  loop {blocks[first].label} .. {blocks[last].label} "
                   f"({last - first + 1} blocks): {n} instructions, FFMA {ffma} ({share}), "
                   f"others a FFMA {per}")
        out.append("    " + ", ".join(f"{k} {v}" for k, v in h.most_common(top)))
    return "\n".join(out)


def source_counts(body: list[str]) -> collections.Counter:
    """Instructions a (file number, line) of the `.loc` before them (("0", 0): none yet)."""
    c: collections.Counter = collections.Counter()
    where = ("0", 0)
    for s in body:
        m = LOC.match(s)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        if LABEL.match(s):
            continue
        s = s.strip("{} \t")
        if not s or s.startswith("//") or s.startswith("."):
            continue
        c[where] += 1
    return c


def head_ranges(src: list[str]) -> list[tuple[int, int]]:
    """(head line, last line) of each function or lambda in src (1-based): from a FUNC_HEAD
    line to the line where the braces opened from it close (string and comment contents are
    not parsed; a head whose braces never open or close spans to the end)."""
    out = []
    for h, text in enumerate(src, 1):
        if not FUNC_HEAD.search(text):
            continue
        depth, opened, end = 0, False, len(src)
        for i in range(h, len(src) + 1):
            code = src[i - 1].split("//", 1)[0]
            for ch in code:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                end = i
                break
            if not opened and code.rstrip().endswith(";"):  # a declaration: no body
                end = i
                break
        out.append((h, end))
    return out


def by_source(ptx: str, body: list[str], top: int) -> str:
    """The kernel's instructions by source file, function head and line (see the docstring)."""
    files = {m.group(1): m.group(2) for m in map(FILE.match, ptx.splitlines()) if m}
    counts = source_counts(body)
    sources: dict[str, list[str]] = {}

    def lines_of(f: str) -> list[str]:
        if f not in sources:
            try:
                sources[f] = Path(files[f]).read_text(encoding="utf-8").splitlines()
            except (OSError, KeyError, UnicodeDecodeError):
                sources[f] = []
        return sources[f]

    def name(f: str) -> str:
        return "(no .loc)" if f == "0" else files.get(f, "?").rsplit("/", 1)[-1]

    per_file: collections.Counter = collections.Counter()
    per_func: collections.Counter = collections.Counter()
    ranges: dict[str, list[tuple[int, int]]] = {}
    for (f, line), n in counts.items():
        per_file[name(f)] += n
        if f not in ranges:
            ranges[f] = head_ranges(lines_of(f))
        # the innermost function or lambda whose lines hold this one
        head = max((h for h, e in ranges[f] if h <= line <= e), default=0)
        per_func[(f, head)] += n
    total = sum(counts.values())
    out = [f"  by source: {total} instructions with a .loc"
           if counts.get(("0", 0), 0) == 0 else
           f"  by source: {total} instructions, {counts[('0', 0)]} before any .loc"]
    out.append("  files: " + ", ".join(f"{k} {v}" for k, v in per_file.most_common(top)))
    out.append("  functions (the innermost function or lambda holding each line):")
    for (f, head), n in per_func.most_common(top):
        text = lines_of(f)[head - 1].strip()[:80] if head else "(no head found)"
        out.append(f"    {n:7d}  {name(f)}:{head}  {text}")
    out.append("  lines:")
    for (f, line), n in counts.most_common(top):
        src = lines_of(f)
        text = src[line - 1].strip()[:80] if 0 < line <= len(src) else ""
        out.append(f"    {n:7d}  {name(f)}:{line}  {text}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ptx", help="a .ptx file (nvcc -ptx)")
    ap.add_argument("kernel", help="regular expression matched against mangled entry names")
    ap.add_argument("--top", type=int, default=24, help="opcodes shown a loop (default 24)")
    ap.add_argument("--by-source", type=int, default=0, metavar="N",
                    help="also count the instructions by source file, function and line "
                    "(PTX made with -lineinfo); N rows each")
    args = ap.parse_args(argv)
    try:
        with open(args.ptx, encoding="utf-8") as f:
            ptx = f.read()
    except OSError as e:
        print(f"ptxcount: {e}", file=sys.stderr)
        return 2
    found = kernel_body(ptx, args.kernel)
    if found is None:
        print(f"ptxcount: no entry matches {args.kernel!r} in {args.ptx}", file=sys.stderr)
        return 1
    name, body = found
    print(report(name, blocks_of(body), args.top))
    if args.by_source > 0:
        print(by_source(ptx, body, args.by_source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
