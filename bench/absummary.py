#!/usr/bin/env python3
"""The summary of a ci/gpu-ab.sh call: its run lines (one a build, model and numerics:
"new  qwen2-0.5b-f16.gguf  exact yes graph yes decode 1378.0 prompt 31680 hash ca5a...";
"exact no": the fast numerics), each build's median decode and prompt tok/s over its runs,
their change against new's, and whether its logits hashes equal new's (a different hash: the
build's floats changed; exactness needs them equal). Reads a file of those lines (other lines
are skipped), prints the table.
   bench/absummary.py RUN_LINES_FILE
Python's standard library only."""

import statistics
import sys

BASE = "new"


def parse(lines):
    """{(build, model, numerics): {"decode": [...], "prompt": [...], "hash": {...}}}, and the
    builds in their first order."""
    runs, order = {}, []
    for line in lines:
        f = line.split()
        if (len(f) != 12 or f[2] != "exact" or f[4] != "graph" or f[6] != "decode" or
                f[8] != "prompt" or f[10] != "hash"):
            continue
        try:
            decode, prompt = float(f[7]), float(f[9])
        except ValueError:
            continue
        key = (f[0], f[1].removesuffix(".gguf"), "exact" if f[3] == "yes" else "fast")
        r = runs.setdefault(key, {"decode": [], "prompt": [], "hash": set()})
        r["decode"].append(decode)
        r["prompt"].append(prompt)
        r["hash"].add(f[11])
        if f[0] not in order:
            order.append(f[0])
    return runs, order


def pct(v, base):
    return f"{100.0 * (v / base - 1.0):+.1f}%" if base else "-"


def summary(lines):
    runs, order = parse(lines)
    if not runs:
        return ["absummary: no run lines"]
    out = ["summary: median over each build's runs; change and hash against new's",
           f"{'build':5s} {'model':18s} {'numerics':8s} {'runs':>4s} {'decode':>9s} {'vs new':>7s}"
           f" {'prompt':>9s} {'vs new':>7s}  hash"]
    models = list(dict.fromkeys((m, n) for (_, m, n) in runs))
    builds = ([BASE] if BASE in order else []) + [b for b in order if b != BASE]
    for m, n in models:
        base = runs.get((BASE, m, n))
        for b in builds:
            r = runs.get((b, m, n))
            if r is None:
                continue
            d, p = statistics.median(r["decode"]), statistics.median(r["prompt"])
            if len(r["hash"]) > 1:
                h = "DIFFERS BETWEEN RUNS: " + " ".join(sorted(r["hash"]))
            elif base is None or b == BASE:
                h = next(iter(r["hash"]))
            elif r["hash"] == base["hash"]:
                h = "= new"
            else:
                h = "DIFFERS FROM NEW: " + next(iter(r["hash"]))
            dv = pct(d, statistics.median(base["decode"])) if base and b != BASE else ""
            pv = pct(p, statistics.median(base["prompt"])) if base and b != BASE else ""
            out.append(f"{b:5s} {m:18s} {n:8s} {len(r['decode']):4d} {d:9.1f} {dv:>7s}"
                       f" {p:9.0f} {pv:>7s}  {h}")
    return out


def main(argv):
    if len(argv) != 2:
        print("usage: absummary.py RUN_LINES_FILE", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        print("\n".join(summary(f.read().splitlines())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
