#!/usr/bin/env python3
"""bench/absummary.py on run lines in ci/gpu-ab.sh's format: medians, changes against new,
the hash check, and lines that are not runs."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(os.environ.get("WORKER_SOURCE_DIR", Path(__file__).resolve().parents[2]))
SPEC = importlib.util.spec_from_file_location("absummary", ROOT / "bench/absummary.py")
absummary = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(absummary)


def run(build, model, decode, prompt, h, exact="yes"):
    return (f"{build:4s} qwen2-0.5b-{model}.gguf      exact {exact} graph yes decode   {decode}"
            f"  prompt    {prompt}  hash {h}")


LINES = [
    "[gpu-ab +161s] built and generated",
    run("new", "f16", "1377.0", "31764", "ca5a17c00d0f5b83"),
    run("new", "q8_0", "1505.7", "47189", "0811f5e4fe9d47d3"),
    run("p1", "f16", "1402.5", "31753", "ca5a17c00d0f5b83"),
    run("p1", "q8_0", "1493.3", "47057", "0811f5e4fe9d47d3"),
    run("p2", "f16", "1300.0", "31000", "ffffffffffffffff"),
    run("p2", "f16", "1310.0", "31100", "ffffffffffffffff"),
    run("p2", "f16", "1400.0", "31200", "ffffffffffffffff"),
    run("p1", "f16", "1402.8", "31678", "ca5a17c00d0f5b83"),
    run("p1", "q8_0", "1493.7", "47236", "0811f5e4fe9d47d3"),
    run("new", "f16", "1373.2", "31668", "ca5a17c00d0f5b83"),
    run("new", "q8_0", "1503.0", "47230", "0811f5e4fe9d47d3"),
    "[gpu-ab +194s] step trace f16: new -> p1 (us)",
    "  layer                                        26.60     28.61     +2.00",
]


class AbSummaryTest(unittest.TestCase):
    def row(self, out, build, model):
        rows = [r for r in out if r.split()[:2] == [build, f"qwen2-0.5b-{model}"]]
        self.assertEqual(len(rows), 1, out)
        return rows[0]

    def test_medians_changes_and_hashes(self):
        out = absummary.summary(LINES)
        new = self.row(out, "new", "f16").split()
        self.assertEqual(new[3:5], ["2", "1375.1"])  # median of 1377.0 and 1373.2
        self.assertEqual(new[-1], "ca5a17c00d0f5b83")
        p1 = self.row(out, "p1", "f16").split()
        self.assertEqual(p1[4:6], ["1402.7", "+2.0%"])  # 1402.65 / 1375.1
        self.assertEqual(p1[-2:], ["=", "new"])
        q8 = self.row(out, "p1", "q8_0").split()
        self.assertEqual(q8[4:6], ["1493.5", "-0.7%"])
        p2 = self.row(out, "p2", "f16")
        self.assertIn("1310.0", p2)  # median of three
        self.assertIn("DIFFERS FROM NEW: ffffffffffffffff", p2)
        self.assertEqual([r.split()[0] for r in out[2:]], ["new", "p1", "p2", "new", "p1"])

    def test_a_build_whose_runs_disagree(self):
        out = absummary.summary([run("new", "f16", "1.0", "2", "aaaa"),
                                 run("new", "f16", "1.0", "2", "bbbb")])
        self.assertIn("DIFFERS BETWEEN RUNS: aaaa bbbb", self.row(out, "new", "f16"))

    def test_numerics_apart(self):
        out = absummary.summary([run("new", "f16", "100.0", "2", "aaaa"),
                                 run("new", "f16", "200.0", "4", "bbbb", exact="no"),
                                 run("p1", "f16", "110.0", "2", "aaaa"),
                                 run("p1", "f16", "180.0", "4", "bbbb", exact="no")])
        rows = [r.split() for r in out[2:]]
        self.assertEqual([(r[0], r[2], r[5]) for r in rows if r[0] == "p1"],
                         [("p1", "exact", "+10.0%"), ("p1", "fast", "-10.0%")])

    def test_no_base_and_no_runs(self):
        out = absummary.summary([run("p1", "f16", "10.0", "20", "aaaa")])
        self.assertTrue(self.row(out, "p1", "f16").endswith("aaaa"))
        self.assertEqual(absummary.summary(["nothing here", ""]), ["absummary: no run lines"])

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "runs.txt"
            f.write_text("\n".join(LINES) + "\n", encoding="utf-8")
            r = subprocess.run([sys.executable, str(ROOT / "bench/absummary.py"), str(f)],
                               capture_output=True, text=True, check=False)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("DIFFERS FROM NEW", r.stdout)
            r = subprocess.run([sys.executable, str(ROOT / "bench/absummary.py")],
                               capture_output=True, text=True, check=False)
            self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
