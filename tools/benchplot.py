#!/usr/bin/env python3
"""Benchmark plots (issue 17): SVG charts drawn by this script from a benchmark JSON
(reports/bench-<date>.json, schema 1, written by the bench driver), and the report page
reports/bench-<date>.md that links them.

  benchplot.py                      every reports/bench-*.json -> reports/<its name>/*.svg
                                    + reports/<its name>.md (bench-<date>[-tag])
  benchplot.py FILE.json [--out-dir DIR] [--md FILE.md]

Plots: decode tok/s per weight type and numerics against llama.cpp and the bandwidth floor;
time to first token and inter-token latency distributions; decode tok/s against context
length; prompt tok/s against prompt length. A value that was not measured (null) is left out
of a chart and named in its note, never drawn as zero. In the .md only the block between the
benchplot markers is rewritten; text around it (the bench driver's, a person's) stays.
python3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- benchplot:begin -->", "<!-- benchplot:end -->"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
# Worker numerics and llama.cpp: one colour each in every chart.
SERIES_COLOUR = {"exact": "#0969da", "fast": "#54aeff", "llama.cpp": "#8c959f"}
LINE_COLOURS = ["#0969da", "#1a7f37", "#bc4c00", "#8250df", "#cf222e", "#1b7c83", "#bf3989",
                "#57606a"]
FLOOR_COLOUR = "#cf222e"
TYPE_ORDER = ["F16", "Q8_0", "Q4_K_M"]


def fmt(v: float) -> str:
    """Short human number: 827, 15.5k, 7.4, 0.31."""
    if v is None:
        return "n/a"
    a = abs(v)
    if a >= 10000:
        return f"{v / 1000:.1f}k".replace(".0k", "k")
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def nice_ticks(hi: float, n: int = 5, lo: float = 0.0) -> list[float]:
    """lo', lo'+step, ... covering [lo, hi], step a 1/2/2.5/5 x 10^k, lo' = lo rounded down."""
    if hi <= lo:
        return [lo, lo + 1.0]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks = [math.floor(lo / step) * step]
    while ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def tick(v: float) -> str:
    return f"{v / 1000:g}k" if abs(v) >= 10000 else f"{v:g}"


class Svg:
    def __init__(self, w: int, h: int, title: str, subtitle: str = ""):
        self.w, self.h = w, h
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" font-family="{FONT}" font-size="12">',
            f"<title>{escape(title)}</title>",
            f'<rect width="{w}" height="{h}" fill="#ffffff"/>',
            f'<text x="20" y="28" font-size="17" font-weight="bold" fill="#1f2328">'
            f"{escape(title)}</text>"]
        if subtitle:
            self.text(20, 47, subtitle, size=12, fill="#57606a")

    def text(self, x, y, s, size=12, fill="#1f2328", anchor="start", weight="normal",
             extra=""):
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" '
                          f'text-anchor="{anchor}" font-weight="{weight}"{extra}>'
                          f"{escape(str(s))}</text>")

    def line(self, x1, y1, x2, y2, stroke="#d0d7de", width=1.0, dash="", extra=""):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                          f'stroke="{stroke}" stroke-width="{width}"{d}{extra}/>')

    def rect(self, x, y, w, h, fill, extra=""):
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" '
                          f'height="{max(h, 0):.1f}" fill="{fill}"{extra}/>')

    def circle(self, x, y, r, fill, extra=""):
        self.parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}"{extra}/>')

    def raw(self, s: str):
        self.parts.append(s)

    def legend(self, x, y, items: list[tuple[str, str, str]]):
        """items: (label, colour, kind) with kind box | dash | line; laid out in one row."""
        for label, colour, kind in items:
            if kind == "box":
                self.rect(x, y - 9, 12, 12, colour)
            elif kind == "dash":
                self.line(x, y - 3, x + 14, y - 3, colour, 2, "5,3")
            else:
                self.line(x, y - 3, x + 14, y - 3, colour, 2.5)
                self.circle(x + 7, y - 3, 3.5, colour)
            self.text(x + 18, y + 1, label, size=12)
            x += 26 + 7.2 * len(label)

    def done(self) -> str:
        return "\n".join(self.parts + ["</svg>"]) + "\n"


def row_label(r: dict) -> str:
    return f"{r.get('type') or '?'} {r.get('numerics') or ''}".strip()


def attr(name: str, value) -> str:
    return f' data-{name}="{escape(str(value))}"'


# ---------------------------------------------------------------- charts


def chart_decode(d: dict) -> tuple[str, list[str]]:
    """Grouped bars per weight type: worker exact, worker fast, llama.cpp; the bandwidth floor
    (weights read once per token at the card's bandwidth) as a dashed mark over each group."""
    rows = d["rows"]
    types = sorted({r["type"] for r in rows}, key=lambda t: (
        TYPE_ORDER.index(t) if t in TYPE_ORDER else 99, t))
    numerics = [n for n in ("exact", "fast") if any(r.get("numerics") == n for r in rows)]
    numerics += sorted({r.get("numerics") for r in rows} - set(numerics) - {None})
    series = numerics + ["llama.cpp"]
    notes = []
    vals: dict[tuple[str, str], float | None] = {}
    floors: dict[str, float | None] = {}
    for t in types:
        for r in (r for r in rows if r["type"] == t):
            vals[(t, r.get("numerics"))] = r.get("decode_tok_s")
            if r.get("llamacpp_decode_tok_s") is not None:
                vals[(t, "llama.cpp")] = r["llamacpp_decode_tok_s"]
            if r.get("floor_tok_s") is not None:
                floors[t] = r["floor_tok_s"]
        vals.setdefault((t, "llama.cpp"), None)
        floors.setdefault(t, None)
    for (t, s), v in vals.items():
        if v is None:
            notes.append(f"{t} {s}: not measured")
    top = max([v for v in vals.values() if v is not None] +
              [v for v in floors.values() if v is not None] + [1.0])
    ticks = nice_ticks(top * 1.08)
    W, H = 860, 470
    L, R, T, B = 80, 20, 90, 60
    pw, ph = W - L - R, H - T - B
    g = Svg(W, H, "Decode throughput per weight type",
            f"{d.get('card') or 'unknown card'} · {d.get('date')} · commit {d.get('commit')}"
            f" · llama.cpp: {d.get('llamacpp_source') or 'not measured'}")
    y = lambda v: T + ph - ph * v / ticks[-1]  # noqa: E731
    for tk in ticks:
        g.line(L, y(tk), L + pw, y(tk), "#eaeef2")
        g.text(L - 8, y(tk) + 4, tick(tk), anchor="end", fill="#57606a")
    g.text(18, T + ph / 2, "decode tokens / s", anchor="middle", fill="#57606a",
           extra=f' transform="rotate(-90 18 {T + ph / 2:.1f})"')
    gw = pw / max(1, len(types))
    bw = min(70.0, gw * 0.8 / len(series))
    for i, t in enumerate(types):
        gx = L + gw * i + (gw - bw * len(series)) / 2
        for j, s in enumerate(series):
            v = vals.get((t, s))
            x = gx + j * bw
            if v is None:
                g.text(x + bw / 2, T + ph - 6, "n/a", anchor="middle", size=10, fill="#8c959f")
                continue
            g.rect(x + 2, y(v), bw - 4, T + ph - y(v), SERIES_COLOUR.get(s, "#6e7781"),
                   ' class="bar"' + attr("series", s) + attr("type", t) + attr("value", v))
            g.text(x + bw / 2, y(v) - 5, fmt(v), anchor="middle", size=11, weight="bold")
        f = floors[t]
        if f is not None:
            g.line(gx - 6, y(f), gx + bw * len(series) + 6, y(f), FLOOR_COLOUR, 2, "6,4",
                   ' class="floor"' + attr("type", t) + attr("value", f))
            g.text(gx + bw * len(series) + 6, y(f) - 5, f"floor {fmt(f)}", anchor="end",
                   size=11, fill=FLOOR_COLOUR)
            best = max((vals.get((t, n)) or 0) for n in numerics)
            if best:
                g.text(L + gw * (i + 0.5), T + ph + 38, f"best worker = {100 * best / f:.0f}% "
                       "of floor", anchor="middle", size=11, fill="#57606a")
        g.text(L + gw * (i + 0.5), T + ph + 20, t, anchor="middle", size=13, weight="bold")
    g.line(L, T + ph, L + pw, T + ph, "#57606a")
    g.legend(L, 70, [(f"worker {n}", SERIES_COLOUR.get(n, "#6e7781"), "box") for n in numerics]
             + [("llama.cpp", SERIES_COLOUR["llama.cpp"], "box"),
                ("bandwidth floor", FLOOR_COLOUR, "dash")])
    return g.done(), notes


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def chart_distribution(d: dict, key: str, p50: str, p_hi: str, hi_name: str, title: str,
                       unit_label: str) -> tuple[str, list[str]]:
    """One row per (type, numerics): every sample as a dot, a box from p25 to p75 with the
    median, whiskers p5..p95; rows with only summary figures get their p50 / p95 marks."""
    rows = d["rows"]
    notes = []
    allv = []
    for r in rows:
        allv += [v for v in (r.get(key) or []) if v is not None]
        allv += [r[k] for k in (p50, p_hi) if r.get(k) is not None]
    # The axis spans the data (latencies sit far from 0; their spread is what matters).
    lo, hi = (min(allv), max(allv)) if allv else (0.0, 1.0)
    pad = 0.08 * (hi - lo) if hi > lo else 0.1 * hi
    ticks = nice_ticks(hi + pad, 6, max(0.0, lo - pad))
    W = 860
    L, R, T, B = 130, 150, 90, 50
    band = 46
    H = T + B + band * max(1, len(rows))
    pw = W - L - R
    g = Svg(W, H, title, f"{d.get('card') or 'unknown card'} · {d.get('date')} · each dot one "
            "request; box p25..p75, line p50, whiskers p5..p95")
    x = lambda v: L + pw * (v - ticks[0]) / (ticks[-1] - ticks[0])  # noqa: E731
    for tk in ticks:
        g.line(x(tk), T - 6, x(tk), T + band * len(rows), "#eaeef2")
        g.text(x(tk), T + band * len(rows) + 18, tick(tk), anchor="middle", fill="#57606a")
    g.text(L + pw / 2, H - 10, unit_label, anchor="middle", fill="#57606a")
    for i, r in enumerate(rows):
        cy = T + band * i + band / 2
        colour = SERIES_COLOUR.get(r.get("numerics"), "#6e7781")
        g.text(L - 12, cy + 4, row_label(r), anchor="end", size=13, weight="bold")
        xs = [v for v in (r.get(key) or []) if v is not None]
        tag = attr("row", row_label(r))
        if xs:
            q = {p: percentile(xs, p) for p in (5, 25, 50, 75, 95)}
            g.line(x(q[5]), cy, x(q[25]), cy, "#57606a", 1.5)
            g.line(x(q[75]), cy, x(q[95]), cy, "#57606a", 1.5)
            for p in (5, 95):
                g.line(x(q[p]), cy - 7, x(q[p]), cy + 7, "#57606a", 1.5)
            g.rect(x(q[25]), cy - 13, x(q[75]) - x(q[25]), 26, colour,
                   ' fill-opacity="0.25" stroke="' + colour + '"')
            g.line(x(q[50]), cy - 13, x(q[50]), cy + 13, colour, 3)
            for k, v in enumerate(xs):
                jitter = ((k * 7919) % 17 - 8) * 1.1  # fixed spread so dots do not stack
                g.circle(x(v), cy + jitter, 2.2, colour,
                         ' fill-opacity="0.55" class="pt"' + tag + attr("value", v))
            med = q[50]
            hi = q[95] if hi_name == "p95" else percentile(xs, 99)
        else:
            med, hi = r.get(p50), r.get(p_hi)
            for v, name in ((med, "p50"), (hi, hi_name)):
                if v is not None:
                    g.circle(x(v), cy, 5, colour, ' class="mark"' + tag + attr("value", v))
                    g.text(x(v), cy - 9, name, anchor="middle", size=10, fill="#57606a")
            notes.append(f"{row_label(r)}: no per-request samples ({key}), p50/{hi_name} only"
                         if med is not None or hi is not None else
                         f"{row_label(r)}: not measured")
        # The summary figures as the bench driver measured them (HTTP, JSON fields).
        fm50 = r.get(p50) if r.get(p50) is not None else med
        fmhi = r.get(p_hi) if r.get(p_hi) is not None else hi
        g.text(L + pw + 10, cy + 4, f"p50 {fmt(fm50)} · {hi_name} {fmt(fmhi)}", size=11,
               fill="#1f2328")
    g.line(L, T + band * len(rows), L + pw, T + band * len(rows), "#57606a")
    return g.done(), notes


def chart_lines(d: dict, key: str, xkey: str, title: str, xlabel: str, ylabel: str
                ) -> tuple[str, list[str]]:
    """tok/s against a length on a log2 axis, one line per (type, numerics)."""
    rows = [r for r in d["rows"]]
    notes = []
    series = []
    for r in rows:
        pts = sorted((p[xkey], p["tok_s"]) for p in (r.get(key) or [])
                     if p.get(xkey) and p.get("tok_s") is not None)
        if pts:
            series.append((row_label(r), r, pts))
        else:
            notes.append(f"{row_label(r)}: not measured")
    xs = [p[0] for _, _, pts in series for p in pts] or [1, 2]
    ys = [p[1] for _, _, pts in series for p in pts] or [1.0]
    x_lo, x_hi = math.log2(min(xs)), math.log2(max(xs))
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    ticks = nice_ticks(max(ys) * 1.1)
    W, H = 880, 470
    L, R, T, B = 80, 190, 70, 55
    pw, ph = W - L - R, H - T - B
    g = Svg(W, H, title, f"{d.get('card') or 'unknown card'} · {d.get('date')} · "
            f"commit {d.get('commit')}")
    X = lambda v: L + pw * (math.log2(v) - x_lo) / (x_hi - x_lo)  # noqa: E731
    Y = lambda v: T + ph - ph * v / ticks[-1]  # noqa: E731
    for tk in ticks:
        g.line(L, Y(tk), L + pw, Y(tk), "#eaeef2")
        g.text(L - 8, Y(tk) + 4, tick(tk), anchor="end", fill="#57606a")
    for e in range(math.ceil(x_lo), math.floor(x_hi) + 1):
        g.line(X(2 ** e), T, X(2 ** e), T + ph, "#eaeef2")
        g.text(X(2 ** e), T + ph + 18, str(2 ** e), anchor="middle", fill="#57606a")
    g.text(L + pw / 2, T + ph + 42, xlabel, anchor="middle", fill="#57606a")
    g.text(18, T + ph / 2, ylabel, anchor="middle", fill="#57606a",
           extra=f' transform="rotate(-90 18 {T + ph / 2:.1f})"')
    g.line(L, T + ph, L + pw, T + ph, "#57606a")
    g.line(L, T, L, T + ph, "#57606a")
    types = sorted({r.get("type") for _, r, _ in series}, key=lambda t: (
        TYPE_ORDER.index(t) if t in TYPE_ORDER else 99, str(t)))
    colour_of = {t: LINE_COLOURS[i % len(LINE_COLOURS)] for i, t in enumerate(types)}
    for k, (label, r, pts) in enumerate(series):
        colour = colour_of[r.get("type")]
        dash = ' stroke-dasharray="7,4"' if r.get("numerics") == "fast" else ""
        path = " ".join(f"{'M' if i == 0 else 'L'}{X(a):.1f},{Y(b):.1f}"
                        for i, (a, b) in enumerate(pts))
        g.raw(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2.5"{dash}/>')
        for a, b in pts:
            g.circle(X(a), Y(b), 3.5, colour, ' class="pt"' + attr("row", label) +
                     attr("x", a) + attr("value", b))
    # Legend at the right, in the order of the last values (top line first).
    order = sorted(range(len(series)), key=lambda k: -series[k][2][-1][1])
    if series:
        g.text(L + pw + 14, T - 8, f"tok/s at {max(xs)}", size=11, fill="#57606a")
    for n, k in enumerate(order):
        label, r, pts = series[k]
        colour = colour_of[r.get("type")]
        ly = T + 10 + 22 * n
        dash = "5,3" if r.get("numerics") == "fast" else ""
        g.line(L + pw + 14, ly - 4, L + pw + 38, ly - 4, colour, 2.5, dash)
        g.text(L + pw + 44, ly, f"{label}  {fmt(pts[-1][1])}", size=12)
    return g.done(), notes


PLOTS = [
    ("decode.svg", "Decode tok/s per weight type vs llama.cpp and the bandwidth floor",
     chart_decode),
    ("ttft.svg", "Time to first token (32-token prompt, over HTTP)",
     lambda d: chart_distribution(d, "ttft32_ms", "http_ttft32_p50_ms", "http_ttft32_p95_ms",
                                  "p95", "Time to first token, 32-token prompt (HTTP)",
                                  "milliseconds from POST to the first token event")),
    ("itl.svg", "Inter-token latency (over HTTP)",
     lambda d: chart_distribution(d, "itl_ms", "http_itl_p50_ms", "http_itl_p99_ms", "p99",
                                  "Inter-token latency (HTTP stream)",
                                  "milliseconds between token events")),
    ("decode-vs-ctx.svg", "Decode tok/s against context length",
     lambda d: chart_lines(d, "decode_vs_ctx", "ctx", "Decode throughput vs context length",
                           "tokens already in the KV cache (log scale)", "decode tokens / s")),
    ("prompt-vs-len.svg", "Prompt tok/s against prompt length",
     lambda d: chart_lines(d, "prompt_vs_len", "len", "Prompt throughput vs prompt length",
                           "prompt tokens (log scale)", "prompt tokens / s")),
]


# ---------------------------------------------------------------- report


def md_block(d: dict, plot_dir_rel: str, notes: dict[str, list[str]], json_name: str) -> str:
    out = [BEGIN, "", "## Plots", "",
           f"Drawn by `tools/benchplot.py` from `{json_name}` (regenerate: "
           "`python3 tools/benchplot.py`).", ""]
    out += ["| type | numerics | decode tok/s | % of floor | llama.cpp decode | prompt 512 tok/s "
            "| TTFT32 p50 / p95 ms | ITL p50 / p99 ms |", "|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        def f(k):
            return fmt(r.get(k)) if r.get(k) is not None else "n/a"
        out.append(f"| {r.get('type')} | {r.get('numerics')} | {f('decode_tok_s')} | "
                   f"{f('pct_of_floor')} | {f('llamacpp_decode_tok_s')} | "
                   f"{f('prompt512_tok_s')} | {f('http_ttft32_p50_ms')} / "
                   f"{f('http_ttft32_p95_ms')} | {f('http_itl_p50_ms')} / {f('http_itl_p99_ms')} |")
    out.append("")
    for name, caption, _ in PLOTS:
        out += [f"### {caption}", "", f"![{caption}]({plot_dir_rel}/{name})", ""]
        for n in notes.get(name, []):
            out.append(f"- {n}")
        if notes.get(name):
            out.append("")
    out.append(END)
    return "\n".join(out)


def write_report(json_path: Path, out_dir: Path | None = None, md_path: Path | None = None
                 ) -> list[Path]:
    d = json.loads(json_path.read_text(encoding="utf-8"))
    if d.get("schema") != 1:
        raise SystemExit(f"benchplot: {json_path}: schema {d.get('schema')!r}, expected 1")
    if not d.get("rows"):
        raise SystemExit(f"benchplot: {json_path}: no rows")
    date = d.get("date") or re.sub(r"^bench-|\.json$", "", json_path.name)
    d["date"] = date
    # Named after the JSON file (bench-<date>.json -> bench-<date>/ and bench-<date>.md), so
    # that two runs of one date (bench-<date>-h200.json) keep their own plots and page.
    out_dir = out_dir or json_path.parent / json_path.stem
    md_path = md_path or json_path.parent / f"{json_path.stem}.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    written, notes = [], {}
    for name, _, fn in PLOTS:
        svg, n = fn(d)
        (out_dir / name).write_text(svg, encoding="utf-8")
        notes[name] = n
        written.append(out_dir / name)
    try:
        rel = out_dir.resolve().relative_to(md_path.resolve().parent).as_posix()
    except ValueError:
        rel = out_dir.resolve().as_posix()
    block = md_block(d, rel, notes, json_path.name)
    if md_path.exists():
        text = md_path.read_text(encoding="utf-8")
        if BEGIN in text and END in text:
            text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    else:
        def v(k):
            return d.get(k) if d.get(k) is not None else "unknown"
        text = (f"# Benchmark {date}\n\n"
                f"Card: {v('card')}; driver {v('driver')}, CUDA runtime "
                f"{v('cuda_runtime')}; commit {v('commit')}; memory bandwidth "
                f"{v('bandwidth_gbs')} GB/s (the floor: weight bytes read once per token)."
                f"\nllama.cpp figures: {d.get('llamacpp_source') or 'not measured'}. Data: "
                f"[{json_path.name}]({json_path.name}).\n\n" + block + "\n")
    md_path.write_text(text, encoding="utf-8")
    written.append(md_path)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="*", type=Path, help="default: every reports/bench-*.json")
    ap.add_argument("--out-dir", type=Path, help="plots folder (one JSON only)")
    ap.add_argument("--md", type=Path, help="report page (one JSON only)")
    args = ap.parse_args(argv)
    files = args.json or sorted((ROOT / "reports").glob("bench-*.json"))
    if not files:
        print("benchplot: no reports/bench-*.json yet (the bench driver writes them)")
        return 0
    if len(files) > 1 and (args.out_dir or args.md):
        raise SystemExit("benchplot: --out-dir/--md take one JSON file")
    for f in files:
        for p in write_report(f, args.out_dir, args.md):
            print(f"benchplot: wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
