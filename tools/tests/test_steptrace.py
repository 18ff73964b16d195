#!/usr/bin/env python3
"""bench/steptrace.py on a synthetic decode-step trace with known op times (the format the CUDA
engine writes for WORKER_DECODE_STEP_TRACE: kernels/decode_step.cuh)."""

import importlib.util
import os
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(os.environ.get("WORKER_SOURCE_DIR", Path(__file__).resolve().parents[2]))
SPEC = importlib.util.spec_from_file_location("steptrace", ROOT / "bench/steptrace.py")
steptrace = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(steptrace)

L, P, G = 2, 21, 4  # layers, points, blocks; block 3 runs no attention


def synthetic(step, gate_up_ns=3500, rope_late_ns=0, points=P):
    """Stamps (ns) where every block takes the same times, except block 1, 1 us slower in
    Q/K/V, and block 2, whose RoPE takes rope_late_ns longer; each counter is released 500 ns
    after its last arrival. An attention block's own scores (point 20, with 21 points) take
    1 us of the scores phase's 5.5."""
    t = [[[0] * G for _ in range(points)] for _ in range(L + 1)]
    now = 1_000_000 * (step + 1)
    for l in range(L):
        for b in range(G):
            t[l][0][b] = now
            t[l][1][b] = now + 2000                                # norm 2 us
            t[l][2][b] = now + 3000 + (1000 if b == 1 else 0)      # Q/K/V 1 us (2 us block 1)
        last = max(t[l][2])
        for b in range(G):
            if b < 3:  # attention blocks
                t[l][3][b] = last + 500
                for k, dt in enumerate([1600, 5500, 1100, 700, 1800]):  # phases 12..16
                    late = rope_late_ns if k == 0 and b == 2 else 0
                    t[l][12 + k][b] = (t[l][11 + k][b] if k else t[l][3][b]) + dt + late
                t[l][4][b] = t[l][16][b] + 1000
                if points > 20:
                    t[l][20][b] = t[l][12][b] + 1000
            else:
                t[l][4][b] = last + 100
        last = max(t[l][4])
        for b in range(G):
            t[l][5][b] = last + 100
            t[l][19][b] = t[l][5][b] + 400                         # Wo's input staged
            t[l][6][b] = t[l][5][b] + 1200                         # Wo 1.2 us
        last = max(t[l][6])
        for b in range(G):
            t[l][7][b] = last + 500
            t[l][8][b] = t[l][7][b] + 2300                         # norm 2.3 us
            t[l][9][b] = t[l][8][b] + gate_up_ns                   # gate+up 3.5 us
        last = max(t[l][9])
        for b in range(G):
            t[l][10][b] = last + 500
            t[l][17][b] = t[l][10][b] + 600                        # down: stage 0.6 us
            t[l][18][b] = t[l][17][b] + 400                        # quantize 0.4 us
            t[l][11][b] = t[l][10][b] + 2400                       # down 2.4 us (rows 1.4)
        now = max(t[l][11]) + 500
    for b in range(G):
        t[L][0][b] = now
        t[L][1][b] = now + 2000
        t[L][2][b] = now + 88_000                                  # LM head 88 us
    return t


class StepTraceTest(unittest.TestCase):
    def write(self, path, steps, points=P, **kw):
        with open(path, "wb") as f:
            for s in range(steps):
                f.write(struct.pack("<3Q", L, points, G))
                t = synthetic(s, points=points, **kw)
                f.write(struct.pack(f"<{(L + 1) * points * G}Q",
                                    *[t[l][p][b] for l in range(L + 1) for p in range(points)
                                      for b in range(G)]))

    def test_reads_every_step_and_recovers_the_op_times(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.bin"
            self.write(path, 3)
            recs = steptrace.read(path)
            self.assertEqual(len(recs), 3)
            self.assertEqual(recs[0][:3], (L, P, G))
            r = steptrace.analyse(recs)
            for name, us in [("norm (attn)", 2.0), ("Q/K/V", 1.0), ("Q/K/V slowest", 2.0),
                             ("Wo", 1.2), ("norm (ffn)", 2.3), ("gate+up", 3.5), ("down", 2.4),
                             ("tagged Q/K/V -> attn inputs", 0.5), ("tagged attn -> Wo stage", 0.5),
                             ("tagged Wo -> ffn norm", 0.5 + 2.3),
                             ("tagged gate+up -> down stage", 0.5 + 0.6),
                             ("tagged down -> attn norm", 0.5 + 2.0), ("attention scores", 5.5),
                             ("attention scores: own keys", 1.0),
                             ("attention scores: exchange", 4.5),
                             ("attention KQV", 1.8), ("attention reduce, out", 1.0),
                             ("down: stage", 0.6), ("down: quantize", 0.4),
                             ("down: rows", 1.4), ("LM head", 88.0),
                             # a block's own gaps: 100 ns in the attention blocks, 500 ns
                             ("issue: attn -> Wo start", 0.1), ("issue: Wo -> ffn norm start", 0.5),
                             ("issue: down -> next layer", 0.5)]:
                self.assertAlmostEqual(r[name], us, places=6, msg=name)
            # the attention (blocks 0-2 only): inputs ready -> done
            self.assertAlmostEqual(r["attention slowest"], 1.6 + 5.5 + 1.1 + 0.7 + 1.8 + 1.0)
            # the command line prints them (skipping the first step)
            out = subprocess.run([sys.executable, str(ROOT / "bench/steptrace.py"), str(path), "1"],
                                 capture_output=True, text=True, check=True).stdout
            self.assertIn("2 steps, 2 layers, 4 blocks", out)
            self.assertIn("scores", out)
            self.assertIn(["scores:", "exchange", "4.50"], [x.split() for x in out.splitlines()])
            self.assertIn("down: quantize", out)
            self.assertIn("edge down -> attn norm", out)
            self.assertIn("issue: Wo -> ffn norm start", out)

    def test_compare_gives_each_figure_of_both_and_the_difference(self):
        with tempfile.TemporaryDirectory() as tmp:
            a, b = Path(tmp) / "a.bin", Path(tmp) / "b.bin"
            self.write(a, 3)
            self.write(b, 3, gate_up_ns=2500)  # gate+up 1 us faster, everything else the same
            rows = {n: (x, y, d) for n, x, y, d in steptrace.compare(
                steptrace.analyse(steptrace.read(a)), steptrace.analyse(steptrace.read(b)))}
            self.assertAlmostEqual(rows["gate+up"][0], 3.5)
            self.assertAlmostEqual(rows["gate+up"][1], 2.5)
            self.assertAlmostEqual(rows["gate+up"][2], -1.0)
            self.assertAlmostEqual(rows["layer"][2], -1.0)  # the layer is 1 us shorter
            self.assertAlmostEqual(rows["Q/K/V"][2], 0.0)
            self.assertAlmostEqual(rows["step"][2], -2.0)  # two layers
            out = subprocess.run([sys.executable, str(ROOT / "bench/steptrace.py"), "--compare",
                                  str(a), str(b), "1"],
                                 capture_output=True, text=True, check=True).stdout
            self.assertIn(["gate+up", "3.50", "2.50", "-1.00"], [x.split() for x in out.splitlines()])

    def test_heads_give_the_skew_of_each_heads_blocks(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.bin"
            self.write(path, 3, rope_late_ns=300)  # block 2 starts scoring 0.3 us after 0 and 1
            recs = steptrace.read(path)
            one = steptrace.analyse(recs, heads=1)  # blocks 0-2: one head of 3
            self.assertAlmostEqual(one["head skew: inputs ready"], 0.0)
            self.assertAlmostEqual(one["head skew: scoring starts"], 0.3)
            self.assertAlmostEqual(one["head skew: scores done"], 0.3)
            # the median block has every score 5.5 - 0.3 us after the last one starts scoring
            self.assertAlmostEqual(one["head: last block scoring -> median has every score"], 5.2)
            three = steptrace.analyse(recs, heads=3)  # a block a head: no skew
            self.assertAlmostEqual(three["head skew: scoring starts"], 0.0)
            self.assertAlmostEqual(three["head: last block scoring -> median has every score"], 5.5)
            # the exchange's own latency: from the last block's scores out (0.3 us late in
            # block 2) to the median block's having them all
            self.assertAlmostEqual(
                one["head: last block's scores out -> median has every score"], 4.5 - 0.3)
            self.assertAlmostEqual(
                three["head: last block's scores out -> median has every score"], 4.5)
            self.assertNotIn("head skew: scoring starts", steptrace.analyse(recs))
            with self.assertRaises(ValueError):  # 3 attention blocks are not 2 equal heads
                steptrace.analyse(recs, heads=2)
            out = subprocess.run([sys.executable, str(ROOT / "bench/steptrace.py"), str(path), "1",
                                  "--heads", "1"], capture_output=True, text=True, check=True).stdout
            self.assertIn(["head", "skew:", "scoring", "starts", "0.30"],
                          [x.split() for x in out.splitlines()])
            out = subprocess.run([sys.executable, str(ROOT / "bench/steptrace.py"), "--heads", "1",
                                  "--compare", str(path), str(path), "1"],
                                 capture_output=True, text=True, check=True).stdout
            self.assertIn(["head", "skew:", "scoring", "starts", "0.30", "0.30", "+0.00"],
                          [x.split() for x in out.splitlines()])
            bad = subprocess.run([sys.executable, str(ROOT / "bench/steptrace.py"), str(path),
                                  "--heads", "x"], capture_output=True, text=True)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("--heads", bad.stderr)

    def test_a_trace_of_20_points_has_no_split_scores(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.bin"
            self.write(path, 3, points=20)
            r = steptrace.analyse(steptrace.read(path), heads=1)
            self.assertAlmostEqual(r["attention scores"], 5.5)
            self.assertNotIn("attention scores: own keys", r)
            self.assertNotIn("head: last block's scores out -> median has every score", r)

    def test_an_empty_trace_is_an_error(self):
        with self.assertRaises(ValueError):
            steptrace.analyse([])


if __name__ == "__main__":
    unittest.main()
