#!/usr/bin/env python3
"""Where the persistent decode step's time goes, from its trace (kernel work).

    WORKER_DECODE_STEP_TRACE=/tmp/t.bin build/bench/decode_bench --model M.gguf --decode 24
    python3 bench/steptrace.py /tmp/t.bin [records to skip, default 2]

The trace (CudaEngine with WORKER_DECODE_STEP_TRACE=file; kernels/decode_step.cuh) is one record
per decode step: uint64 {n_layer, points, blocks}, then uint64 [n_layer + 1][points][blocks]
%globaltimer stamps taken by thread 0 of every block. Points of a layer: 0 start (after the wait
for the previous layer's down), 1 norm done, 2 Q/K/V done, 3 attention inputs ready (attention
blocks), 4 attention done, 5 Wo start, 6 Wo done, 7 gate+up start, 8 norm done, 9 gate+up done,
10 down start, 11 down done, 12-16 the attention's phases (RoPE, scores, exps, softmax sum,
KQV); layer n_layer: 0 the LM head's start, 1 its norm done, 2 its end. Prints, averaged over
layers and steps: each op's compute time (median and slowest block), the counter latency from the
last block's arrival to the median block's release, the attention's phases, and the LM head.
"""
import sys

import numpy as np


def main():
    d = np.fromfile(sys.argv[1], dtype=np.uint64)
    L, P, G = (int(x) for x in d[:3])
    rec = 3 + (L + 1) * P * G
    n = len(d) // rec
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    recs = [d[i * rec + 3:(i + 1) * rec].reshape(L + 1, P, G).astype(np.int64)
            for i in range(skip, n)]
    if not recs:
        sys.exit("no records after the skipped ones")

    def mean_us(f):
        return np.mean([f(r, l) for r in recs for l in range(L)]) / 1000

    print(f"{len(recs)} steps, {L} layers, {G} blocks; per layer, us:")
    for lab, a, b in [("norm (attn)", 0, 1), ("Q/K/V", 1, 2), ("Wo", 5, 6), ("norm (ffn)", 7, 8),
                      ("gate+up", 8, 9), ("down", 10, 11)]:
        med = mean_us(lambda r, l: np.median(r[l, b] - r[l, a]))
        mx = mean_us(lambda r, l: np.max(r[l, b] - r[l, a]))
        print(f"  {lab:12s} median block {med:6.2f}  slowest {mx:6.2f}")

    def attn(r, l):
        m = r[l, 3] > 0
        return np.max(r[l, 4][m] - r[l, 3][m]) if m.any() else 0

    print(f"  {'attention':12s} slowest {mean_us(attn):6.2f}")
    for lab, arr, rel in [("Q/K/V -> attn", 2, 3), ("attn -> Wo", 4, 5), ("Wo -> gate+up", 6, 7),
                          ("gate+up -> down", 9, 10)]:
        def lat(r, l):
            x = r[l, rel][r[l, rel] > 0]
            return np.median(x) - np.max(r[l, arr])
        print(f"  counter {lab:16s} last arrival -> median release {mean_us(lat):6.2f}")

    def nxt(r, l):
        return np.median(r[l + 1, 0]) - np.max(r[l, 11])

    print(f"  counter {'down -> next':16s} last arrival -> median release {mean_us(nxt):6.2f}")
    print(f"  layer total {mean_us(lambda r, l: np.median(r[l + 1, 0]) - np.median(r[l, 0])):6.2f}")
    if P >= 17:
        print("attention phases (median over attention blocks), us:")
        for a, b, lab in [(3, 12, "RoPE"), (12, 13, "scores"), (13, 14, "exps"),
                          (14, 15, "softmax sum"), (15, 16, "KQV"), (16, 4, "reduce, out")]:
            def ph(r, l):
                m = r[l, 12] > 0
                return np.median(r[l, b][m] - r[l, a][m]) if m.any() else 0
            print(f"  {lab:12s} {mean_us(ph):6.2f}")
    lm = np.mean([np.median(r[L, 2]) - np.median(r[L, 0]) for r in recs]) / 1000
    span = np.mean([np.max(r[L, 2]) - np.min(r[0, 0]) for r in recs]) / 1000
    print(f"LM head (norm + rows) {lm:.2f} us; step from layer 0's start {span:.1f} us")


if __name__ == "__main__":
    main()
