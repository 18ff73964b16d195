#!/usr/bin/env python3
"""tools/benchplot.py (issue 17) on a benchmark JSON made up here (schema 1, the shape the bench
driver writes; the numbers are synthetic, not a measurement): the SVGs are produced, are
well-formed XML, and carry every data value of the JSON as a mark; the .md links them."""

import json
import random
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOOLS))
import benchplot  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"


def synthetic_bench(null_llamacpp_for: str = "Q8_0") -> dict:
    rnd = random.Random(17)
    rows = []
    for typ, wbytes in (("F16", 988e6), ("Q8_0", 531e6), ("Q4_K_M", 398e6)):
        floor = 3350e9 / wbytes
        for numerics, speed in (("exact", 0.22), ("fast", 0.27)):
            dec = round(floor * speed, 1)
            rows.append({
                "type": typ, "numerics": numerics, "model": f"qwen2-0.5b-shape-{typ}.gguf",
                "weight_bytes": wbytes, "floor_tok_s": round(floor, 1), "decode_tok_s": dec,
                "pct_of_floor": round(100 * speed, 1),
                "prompt512_tok_s": round(rnd.uniform(8000, 16000), 1),
                "llamacpp_decode_tok_s": None if typ == null_llamacpp_for else round(dec * 0.9, 1),
                "llamacpp_prompt512_tok_s": 60000.0,
                "http_ttft32_p50_ms": 7.4, "http_ttft32_p95_ms": 8.0,
                "http_ttft512_p50_ms": 38.0, "http_ttft512_p95_ms": 40.0,
                "http_itl_p50_ms": round(1000 / dec, 3), "http_itl_p99_ms": round(1300 / dec, 3),
                "http_decode_tok_s": dec * 0.97, "load_to_ready_ms": 550.0, "logits_hash": "0123",
                "ttft32_ms": [round(rnd.gauss(7.4, 0.3), 3) for _ in range(20)],
                "itl_ms": [round(rnd.gauss(1000 / dec, 0.05), 3) for _ in range(50)],
                "decode_vs_ctx": [{"ctx": c, "tok_s": round(dec * (1 - c / 20000), 1)}
                                  for c in (128, 256, 512, 1024, 2048, 4096)],
                "prompt_vs_len": [{"len": n, "tok_s": round(dec * 12 * n / (n + 64), 1)}
                                  for n in (32, 64, 128, 256, 512)],
            })
    # One row measured without per-request samples or a context sweep.
    rows[-1]["ttft32_ms"] = None
    rows[-1]["decode_vs_ctx"] = None
    return {"schema": 1, "date": "2026-11-26", "commit": "abc1234",
            "card": "synthetic test card (not a measurement)", "driver": "0", "cuda_runtime": "0",
            "bandwidth_gbs": 3350, "llamacpp_source": "synthetic", "rows": rows}


def marks(svg: Path, cls: str) -> list[dict]:
    root = ET.parse(svg).getroot()  # raises on malformed XML
    return [e.attrib for e in root.iter() if e.get("class") == cls]


class BenchPlotTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.data = synthetic_bench()
        self.json = self.tmp / "bench-2026-11-26.json"
        self.json.write_text(json.dumps(self.data))
        self.assertEqual(benchplot.main([str(self.json)]), 0)
        self.plots = self.tmp / "bench-2026-11-26"

    def tearDown(self):
        self._tmp.cleanup()

    # REQ: WRK-D25
    def test_every_plot_is_well_formed_svg_and_linked_from_the_md(self):
        md = (self.tmp / "bench-2026-11-26.md").read_text()
        for name, _, _ in benchplot.PLOTS:
            root = ET.parse(self.plots / name).getroot()
            self.assertEqual(root.tag, NS + "svg")
            self.assertIn(f"](bench-2026-11-26/{name})", md)
        # Rerunning rewrites only the marked block: text a person added stays.
        md_path = self.tmp / "bench-2026-11-26.md"
        md_path.write_text(md.replace(benchplot.BEGIN, "A note by hand.\n\n" + benchplot.BEGIN))
        self.assertEqual(benchplot.main([str(self.json)]), 0)
        again = md_path.read_text()
        self.assertIn("A note by hand.", again)
        self.assertEqual(again.count(benchplot.BEGIN), 1)
        self.assertIn("from `bench-2026-11-26.json`", again)

    # REQ: WRK-D25
    def test_a_tagged_run_names_its_own_json_not_its_date(self):
        # Two runs of one date: bench-<date>-<tag>.json keeps its own plots and page, and the
        # page names that file (not bench-<date>.json, another run's data).
        tagged = self.tmp / "bench-2026-11-26-h200.json"
        tagged.write_text(json.dumps(self.data))
        self.assertEqual(benchplot.main([str(tagged)]), 0)
        md = (self.tmp / "bench-2026-11-26-h200.md").read_text()
        self.assertIn("from `bench-2026-11-26-h200.json`", md)
        self.assertIn("[bench-2026-11-26-h200.json](bench-2026-11-26-h200.json)", md)
        self.assertNotIn("bench-2026-11-26.json", md)
        self.assertIn("](bench-2026-11-26-h200/decode.svg)", md)

    # REQ: WRK-D25
    def test_decode_bars_hold_each_value_and_null_is_absent_not_zero(self):
        bars = marks(self.plots / "decode.svg", "bar")
        want = {(r["type"], r["numerics"], r["decode_tok_s"]) for r in self.data["rows"]}
        got = {(b["data-type"], b["data-series"], float(b["data-value"])) for b in bars
               if b["data-series"] != "llama.cpp"}
        self.assertEqual(got, want)
        llama = {b["data-type"]: float(b["data-value"]) for b in bars
                 if b["data-series"] == "llama.cpp"}
        self.assertEqual(set(llama), {"F16", "Q4_K_M"})  # Q8_0's figure is null: no bar
        floors = {f["data-type"]: float(f["data-value"])
                  for f in marks(self.plots / "decode.svg", "floor")}
        self.assertEqual(floors, {r["type"]: r["floor_tok_s"] for r in self.data["rows"]})
        # Bar heights are proportional to the values (same axis for every bar).
        h = {(b["data-type"], b["data-series"]): float(b["height"]) for b in bars}
        v = {(b["data-type"], b["data-series"]): float(b["data-value"]) for b in bars}
        ratios = [h[k] / v[k] for k in h]
        self.assertLess(max(ratios) - min(ratios), 0.01 * max(ratios))
        md = (self.tmp / "bench-2026-11-26.md").read_text()
        self.assertIn("Q8_0 llama.cpp: not measured", md)

    # REQ: WRK-D25
    def test_latency_distributions_hold_every_sample(self):
        for name, key in (("ttft.svg", "ttft32_ms"), ("itl.svg", "itl_ms")):
            pts = marks(self.plots / name, "pt")
            for r in self.data["rows"]:
                label = f"{r['type']} {r['numerics']}"
                got = sorted(float(p["data-value"]) for p in pts if p["data-row"] == label)
                self.assertEqual(got, sorted(r[key] or []), f"{name} {label}")
        # The row without samples still shows its p50 and p95.
        last = self.data["rows"][-1]
        m = [float(p["data-value"]) for p in marks(self.plots / "ttft.svg", "mark")]
        self.assertEqual(m, [last["http_ttft32_p50_ms"], last["http_ttft32_p95_ms"]])

    # REQ: WRK-D25
    def test_throughput_curves_hold_every_point(self):
        for name, key, xkey in (("decode-vs-ctx.svg", "decode_vs_ctx", "ctx"),
                                ("prompt-vs-len.svg", "prompt_vs_len", "len")):
            pts = marks(self.plots / name, "pt")
            want = sorted((f"{r['type']} {r['numerics']}", p[xkey], p["tok_s"])
                          for r in self.data["rows"] for p in (r[key] or []))
            got = sorted((p["data-row"], int(p["data-x"]), float(p["data-value"])) for p in pts)
            self.assertEqual(got, want, name)
            # x grows with the length on the log axis; y falls as tok/s grows.
            for row in {p["data-row"] for p in pts}:
                rp = sorted((int(p["data-x"]), float(p["cx"])) for p in pts
                            if p["data-row"] == row)
                self.assertEqual([c for _, c in rp], sorted(c for _, c in rp))

    # REQ: WRK-D25
    def test_a_second_run_of_the_same_date_keeps_its_own_plots_and_page(self):
        first = (self.plots / "decode.svg").read_text()
        other = synthetic_bench()
        other["rows"][0]["decode_tok_s"] = 4321.0
        tagged = self.tmp / "bench-2026-11-26-h200.json"
        tagged.write_text(json.dumps(other))
        self.assertEqual(benchplot.main([str(tagged)]), 0)
        self.assertEqual((self.plots / "decode.svg").read_text(), first)
        bars = marks(self.tmp / "bench-2026-11-26-h200" / "decode.svg", "bar")
        self.assertIn(4321.0, {float(b["data-value"]) for b in bars})
        md = (self.tmp / "bench-2026-11-26-h200.md").read_text()
        self.assertIn("](bench-2026-11-26-h200/decode.svg)", md)

    # REQ: WRK-D25
    def test_bad_schema_is_refused(self):
        bad = self.tmp / "bench-bad.json"
        bad.write_text(json.dumps({"schema": 2, "rows": []}))
        with self.assertRaises(SystemExit):
            benchplot.main([str(bad)])


if __name__ == "__main__":
    unittest.main()
