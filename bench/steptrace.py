#!/usr/bin/env python3
"""Where the persistent decode step's time goes, from its trace (kernel work).

    WORKER_DECODE_STEP_TRACE=/tmp/t.bin build/bench/decode_bench --model M.gguf --decode 24
    python3 bench/steptrace.py /tmp/t.bin [steps to skip, default 2]
    python3 bench/steptrace.py --compare before.bin after.bin [steps to skip]
    (either form) --heads N: also the skew of each head's attention blocks (below)

(WORKER_DECODE_STEP_TRACE appends: remove the file between runs.) --compare prints every figure
of two traces (an A/B's two builds on one model) side by side with the difference, after - before.

The trace (CudaEngine with WORKER_DECODE_STEP_TRACE=file; kernels/decode_step.cuh) is one record
per decode step: uint64 {n_layer, points, blocks}, then uint64 [n_layer + 1][points][blocks]
%globaltimer stamps (ns) taken by thread 0 of every block. Points of a layer: 0 start (after the
wait for the previous layer's down), 1 norm done, 2 Q/K/V done, 3 attention inputs ready
(attention blocks only; 0 in the others), 4 attention done, 5 Wo start, 6 Wo done, 7 gate+up
start, 8 norm done, 9 gate+up done, 10 down start, 11 down done, 12-16 the attention's phases
(RoPE, scores, exps, softmax sum, KQV; attention blocks), 17 down's input staged, 18 down's
input quantized (quantized weights; float weights stamp 17 and 18 together), so that down is
stage (10-17), quantize (17-18) and rows (18-11), 19 Wo's input staged, 20 (traces of 21 points:
the step since eaaafe7; older traces have 20) the attention block's own scores computed and put,
before the exchange (between 12 and 13: the scores phase is then "own keys" 12-20 and
"exchange" 20-13); layer n_layer: 0 the
LM head's start, 1 its norm done, 2 its end. Prints, averaged over layers and steps
(microseconds): each op's compute time (median and slowest block), the attention's phases, the
layer and the LM head, for each edge between ops the time from the last writer's end to the
median reader's having its input, and a block's own time between the ops where thread 0 issues
bulk copies (ISSUES). Every op's output is a tagged value (no counter): its readers
poll the values inside the next op (the attention's inputs, Wo's and down's stages, the norms),
so that op's time holds the wait. (Traces of builds with counters: the same figure is the
counter's latency plus the op's input.)
With --heads N (the model's attention heads: the attention blocks, those that stamp point 3, are
N runs of C consecutive blocks, one run a head, as the step assigns them) it also prints how far
apart a head's C blocks are (max - min over them, median over heads) when their inputs are ready
(3), when they start scoring (12) and when every score is theirs (13), and the time from the
head's last block starting to score to its median block having every score: what split mode's
exchange costs once the last block is there (perf-notes v45: the exchange waits for the skew);
with 21 points also the time from the head's last block putting its scores to its median block
having every score: the exchange's own latency (perf-notes v46).
Python's standard library only.
"""
import statistics
import struct
import sys

OPS = [("norm (attn)", 0, 1), ("Q/K/V", 1, 2), ("Wo", 5, 6), ("norm (ffn)", 7, 8),
       ("gate+up", 8, 9), ("down", 10, 11)]
# tagged edges: (name, the writers' end, the readers' input ready (blocks that stamp it); next:
# in the next layer)
TAGGED = [("Q/K/V -> attn inputs", 2, 3, 0), ("attn -> Wo stage", 4, 19, 0),
          ("Wo -> ffn norm", 6, 8, 0), ("gate+up -> down stage", 9, 17, 0),
          ("down -> attn norm", 11, 1, 1)]
PHASES = [(3, 12, "RoPE"), (12, 13, "scores"), (13, 14, "exps"), (14, 15, "softmax sum"),
          (15, 16, "KQV"), (16, 4, "reduce, out")]
# traces of 21 points: the scores phase split at the block's own scores (point 20)
SCORES = [(12, 20, "scores: own keys"), (20, 13, "scores: exchange")]
DOWN = [("down: stage", 10, 17), ("down: quantize", 17, 18), ("down: rows", 18, 11)]
# Between two ops, where thread 0 issues bulk copies: (name, from, to (in the next layer when
# nxt)), a block's own stamps, median over blocks. Since 3d82c29: gate + up at 4 -> 5 for Q8_0
# only (the other types inside Wo's stage, 5 -> 19), down at 6 -> 7 except for Q8_0 (inside its
# ffn norm, 7 -> 8), the next P at 11 -> 0. perf-notes v34: 0.3-0.9 us each (F16, Q8_0).
ISSUES = [("issue: attn -> Wo start", 4, 5, 0), ("issue: Wo -> ffn norm start", 6, 7, 0),
          ("issue: down -> next layer", 11, 0, 1)]


def read(path):
    """[(n_layer, points, blocks, stamps)], stamps[l][p][b] in ns."""
    with open(path, "rb") as f:
        data = f.read()
    recs, off = [], 0
    while off + 24 <= len(data):
        L, P, G = struct.unpack_from("<3Q", data, off)
        n = (L + 1) * P * G
        v = struct.unpack_from(f"<{n}Q", data, off + 24)
        off += 24 + 8 * n
        recs.append((L, P, G, [[list(v[(l * P + p) * G:(l * P + p + 1) * G]) for p in range(P)]
                               for l in range(L + 1)]))
    return recs


# Points of a head's skew (--heads): (name, point)
SKEW = [("inputs ready", 3), ("scoring starts", 12), ("scores done", 13)]
# A head's exchange (--heads): (name, point): from the head's last block at the point to its median
# block having every score (13); point 20 only in traces of 21 points
EXCHANGE = [("head: last block scoring -> median has every score", 12),
            ("head: last block's scores out -> median has every score", 20)]


def head_runs(t, l, heads):
    """The blocks of each head in layer l: the attention blocks (stamp 3 set), `heads` runs of C."""
    att = [b for b in range(len(t[l][3])) if t[l][3][b] > 0]
    if heads <= 0 or not att or len(att) % heads != 0 or att != list(range(len(att))):
        raise ValueError(f"{len(att)} attention blocks cannot be {heads} heads of equal runs")
    c = len(att) // heads
    return [list(range(h * c, (h + 1) * c)) for h in range(heads)]


def analyse(recs, heads=0):
    """Averages in microseconds: {name: value} (see the module doc for the names)."""
    if not recs:
        raise ValueError("no steps in the trace")
    L, P, _, _ = recs[0]
    out = {}

    def mean(f):
        return statistics.fmean(f(t, l) for _, _, _, t in recs for l in range(L)) / 1000

    def diff(t, l, a, b, only=None):
        return [t[l][b][i] - t[l][a][i] for i in range(len(t[l][a]))
                if only is None or t[l][only][i] > 0]

    for name, a, b in OPS:
        out[name] = mean(lambda t, l: statistics.median(diff(t, l, a, b)))
        out[name + " slowest"] = mean(lambda t, l: max(diff(t, l, a, b)))
    out["attention slowest"] = mean(lambda t, l: max(diff(t, l, 3, 4, only=3) or [0]))
    for name, end, ready, nxt in (e for e in TAGGED if max(e[1], e[2]) < P):  # older traces
        out["tagged " + name] = mean(lambda t, l: statistics.median(
            [x for x in t[l + nxt][ready] if x > 0]) - max(t[l][end]))
    out["layer"] = mean(lambda t, l: statistics.median(t[l + 1][0]) - statistics.median(t[l][0]))
    for name, a, b, nxt in ISSUES:  # the last layer's next is the LM head's own issue: left out
        out[name] = statistics.fmean(
            statistics.median(t[l + nxt][b][i] - t[l][a][i] for i in range(len(t[l][a])))
            for _, _, _, t in recs for l in range(L - nxt)) / 1000
    if P >= 17:
        for a, b, name in PHASES + (SCORES if P >= 21 else []):
            out["attention " + name] = mean(
                lambda t, l: statistics.median(diff(t, l, a, b, only=12) or [0]))
    if P >= 19:
        for name, a, b in DOWN:
            out[name] = mean(lambda t, l: statistics.median(diff(t, l, a, b)))
    if heads > 0 and P >= 17:
        runs = [[head_runs(t, l, heads) for l in range(L)] for _, _, _, t in recs]

        def per_head(f):
            return statistics.fmean(
                statistics.median(f(t, l, run) for run in runs[i][l])
                for i, (_, _, _, t) in enumerate(recs) for l in range(L)) / 1000
        for name, pt in SKEW:
            out["head skew: " + name] = per_head(
                lambda t, l, run, pt=pt: max(t[l][pt][b] for b in run) - min(t[l][pt][b] for b in run))
        for name, pt in (e for e in EXCHANGE if e[1] < P):
            out[name] = per_head(lambda t, l, run, pt=pt: statistics.median(t[l][13][b] for b in run)
                                 - max(t[l][pt][b] for b in run))
    out["LM head"] = statistics.fmean(statistics.median(t[L][2]) - statistics.median(t[L][0])
                                      for _, _, _, t in recs) / 1000
    out["step"] = statistics.fmean(max(t[L][2]) - min(t[0][0]) for _, _, _, t in recs) / 1000
    return out


def compare(before, after):
    """[(name, before, after, after - before)] for the figures both analyses have, in order."""
    return [(k, before[k], after[k], after[k] - before[k]) for k in before if k in after]


def print_compare(paths, skip, heads=0):
    ra, rb = (analyse(read(p)[skip:], heads) for p in paths)
    print(f"{'us (per layer; LM head, step: per step)':42s} {'before':>9s} {'after':>9s} {'delta':>9s}")
    for name, a, b, d in compare(ra, rb):
        print(f"  {name:40s} {a:9.2f} {b:9.2f} {d:+9.2f}")


def main():
    argv, heads = list(sys.argv), 0
    if "--heads" in argv:
        i = argv.index("--heads")
        if i + 1 >= len(argv) or not argv[i + 1].isdigit() or int(argv[i + 1]) < 1:
            sys.exit("--heads takes the model's number of attention heads (>= 1)\n" + __doc__)
        heads = int(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) < 2:
        sys.exit(__doc__)
    if argv[1] == "--compare":
        if len(argv) < 4:
            sys.exit(__doc__)
        print_compare(argv[2:4], int(argv[4]) if len(argv) > 4 else 2, heads)
        return
    recs = read(argv[1])
    skip = int(argv[2]) if len(argv) > 2 else 2
    r = analyse(recs[skip:], heads)
    L, _, G, _ = recs[0]
    print(f"{len(recs) - skip} steps, {L} layers, {G} blocks; per layer, us:")
    for name, _, _ in OPS:
        print(f"  {name:16s} median block {r[name]:6.2f}  slowest {r[name + ' slowest']:6.2f}")
    for name, _, _ in DOWN:
        if name in r:
            print(f"    {name:14s} median block {r[name]:6.2f}")
    print(f"  {'attention':16s} slowest {r['attention slowest']:6.2f}")
    for name in [e[0] for e in TAGGED if "tagged " + e[0] in r]:
        v = r["tagged " + name]
        print(f"  edge {name:22s} last writer's end -> median reader's input {v:6.2f}")
    for name, _, _, _ in ISSUES:
        print(f"  {name:27s} (barrier + copies issued) median block {r[name]:6.2f}")
    print(f"  layer total {r['layer']:6.2f}")
    phases = [k for k in r if k.startswith("attention ") and k != "attention slowest"]
    if phases:
        print("attention phases (median over attention blocks), us:")
        for k in phases:
            print(f"  {k[len('attention '):]:18s} {r[k]:6.2f}")
    skew = [k for k in r if k.startswith("head")]
    if skew:
        print("a head's attention blocks (median over heads), us:")
        for k in skew:
            print(f"  {k:57s} {r[k]:6.2f}")
    print(f"LM head (norm + rows) {r['LM head']:.2f} us; step from layer 0's start {r['step']:.1f} us")


if __name__ == "__main__":
    main()
