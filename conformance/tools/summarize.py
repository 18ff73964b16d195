#!/usr/bin/env python3
"""Summarizes a conformance run (gtest XML + JSON artifacts in a test-results folder) as
Markdown: per suite pass/fail/skip counts, failures, and the measured numbers the tests
record (RecordProperty), e.g. cancel latency and /health p99.
Usage: summarize.py RESULTS_DIR [--backend cpu] > reports/conformance-cpu.md"""
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET


def main():
    res = sys.argv[1]
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "cpu"
    rows, numbers, failures = [], [], []
    for path in sorted(glob.glob(os.path.join(res, "conformance_*.xml"))):
        suite = os.path.basename(path)[:-4]
        n = {"passed": 0, "failed": 0, "skipped": 0}
        for tc in ET.parse(path).getroot().iter("testcase"):
            name = f'{tc.get("classname")}.{tc.get("name")}'
            if tc.find("failure") is not None:
                n["failed"] += 1
                msg = tc.find("failure").get("message", "").splitlines()
                failures.append((suite, name, " / ".join(m for m in msg[:3])[:300]))
            elif tc.get("result") == "skipped" or tc.find("skipped") is not None:
                n["skipped"] += 1
            else:
                n["passed"] += 1
            for p in tc.iter("property"):
                numbers.append((name, p.get("name"), p.get("value")))
        rows.append((suite, n))
    print(f"# Conformance run, backend `{backend}`\n")
    print("| Suite | passed | failed | not run |\n|---|---|---|---|")
    for suite, n in rows:
        print(f'| {suite} | {n["passed"]} | {n["failed"]} | {n["skipped"]} |')
    if numbers:
        print("\n## Measured (generous bounds in the tests; precise figures belong to bench/)\n")
        print("| Test | Quantity | Value |\n|---|---|---|")
        for name, k, v in numbers:
            print(f"| {name} | {k} | {v} |")
    for f in sorted(glob.glob(os.path.join(res, "health_latency_*.json"))):
        print(f"\n`{os.path.basename(f)}`: `{json.dumps(json.load(open(f)))}`")
    if failures:
        print("\n## Failures\n")
        for suite, name, msg in failures:
            print(f"- `{suite}` {name}: {msg}")


if __name__ == "__main__":
    main()
