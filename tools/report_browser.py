#!/usr/bin/env python3
"""Checks reports/requirements.html in a real headless browser (Debian's chromium), as a person
would look at it: the page renders with its script run, the totals it shows equal
requirements.json's, the filter (set through the URL fragment, as a link would) hides rows, and
a screenshot is written.

  report_browser.py PAGE.html REPORT.json --screenshot OUT.png

Exit status 1 with one line per problem. python3 standard library + chromium only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio", "--disable-dev-shm-usage"]


def find_chromium() -> str | None:
    env = os.environ.get("WORKER_CHROMIUM")
    if env:
        return env
    for name in ("/usr/bin/chromium", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(args: list[str], timeout: float = 60) -> str:
    """Runs chromium once with a fresh profile; returns stdout (the DOM for --dump-dom)."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("chromium not found (ci/setup.sh installs Debian's chromium)")
    with tempfile.TemporaryDirectory(prefix="reqcov-chromium-") as profile:
        r = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args],
                           capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"chromium exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


class Dom(HTMLParser):
    """What the checks need from a dumped DOM: data-total figures, requirement rows (with
    their hidden flag), and a few elements by id."""

    def __init__(self, text: str):
        super().__init__()
        self.totals: dict[str, str] = {}
        self.rows: list[dict] = []
        self.by_id: dict[str, dict] = {}
        self.text_of: dict[str, str] = {}
        self._capture: list[tuple[str, str]] = []  # (kind, key) while inside
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-total" in a:
            self._capture.append(("total", a["data-total"]))
            self.totals[a["data-total"]] = ""
        elif a.get("id") in ("gate", "commit", "shown"):
            self._capture.append(("id", a["id"]))
            self.text_of[a["id"]] = ""
        else:
            self._capture.append(("", ""))
        if a.get("id"):
            self.by_id[a["id"]] = a
        if tag == "tr" and "req" in (a.get("class") or "").split():
            self.rows.append({"id": a.get("id"), "hidden": "hidden" in a, "cpu": a.get("data-cpu"),
                              "cuda": a.get("data-cuda"), "text": a.get("data-text", "")})

    def handle_endtag(self, tag):
        if self._capture:
            self._capture.pop()

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_data(self, data):
        for kind, key in self._capture:
            if kind == "total":
                self.totals[key] += data
            elif kind == "id":
                self.text_of[key] += data


def lookup(totals: dict, dotted: str):
    v = totals
    for part in dotted.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


REQUIRED_TOTALS = ["requirements", "covered", "must_m0", "must_m0_covered", "ratchet",
                   "tests_declared"] + [f"per_backend.{b}.{s}" for b in ("cpu", "cuda")
                                        for s in ("pass", "fail", "not-run", "no-test")]


def png_size(path: Path) -> tuple[int, int] | None:
    data = path.read_bytes()[:24]
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


def dump(page: Path, fragment: str = "") -> Dom:
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    return Dom(chromium(["--virtual-time-budget=3000", "--dump-dom", url]))


def check_page(page: Path, report: Path, screenshot: Path | None) -> list[str]:
    rep = json.loads(report.read_text(encoding="utf-8"))
    problems = []
    reqs = rep["requirements"]

    # 1. Unfiltered: every figure shown equals the JSON's, every row visible.
    dom = dump(page)
    if not dom.text_of.get("shown"):
        problems.append("the page script did not run (the 'showing N of M' line is empty)")
    for key in REQUIRED_TOTALS:
        if key not in dom.totals:
            problems.append(f"the page shows no figure for totals.{key}")
    for key, shown in sorted(dom.totals.items()):
        want = lookup(rep["totals"], key)
        if want is None:
            problems.append(f"the page shows totals.{key} = {shown!r}, which the JSON lacks")
        elif shown.strip() != str(want):
            problems.append(f"totals.{key}: page shows {shown.strip()!r}, JSON has {want}")
    if [r["id"] for r in dom.rows] != [r["id"] for r in reqs]:
        problems.append(f"the page lists {len(dom.rows)} requirement rows, the JSON "
                        f"{len(reqs)} (or in another order)")
    for r, row in zip(reqs, dom.rows):
        if (row["cpu"], row["cuda"]) != (r["status"]["cpu"], r["status"]["cuda"]):
            problems.append(f"{r['id']}: page status cpu={row['cpu']} cuda={row['cuda']}, "
                            f"JSON {r['status']}")
    if any(row["hidden"] for row in dom.rows):
        problems.append("rows are hidden without a filter")
    if dom.text_of.get("gate", "").strip() != f"GATE {rep['gate'].upper()}":
        problems.append(f"gate shown {dom.text_of.get('gate')!r}, JSON {rep['gate']}")
    gen = rep.get("generated", {})
    if dom.text_of.get("commit", "").strip() != gen.get("commit"):
        problems.append(f"commit shown {dom.text_of.get('commit')!r}, JSON {gen.get('commit')}")

    # 2. Status + backend filter: exactly the rows with that status on that backend.
    for backend, status in (("cuda", "not-run"),):
        dom = dump(page, f"status={status}&backend={backend}")
        visible = [row["id"] for row in dom.rows if not row["hidden"]]
        want = [r["id"] for r in reqs if r["status"][backend] == status]
        if visible != want:
            problems.append(f"filter status={status} backend={backend}: {len(visible)} rows "
                            f"visible, {len(want)} expected")
        if len(want) != lookup(rep["totals"], f"per_backend.{backend}.{status}"):
            problems.append(f"JSON rows with {backend} {status} disagree with its totals")
        shown = dom.by_id.get("shown", {}).get("data-shown")
        if shown != str(len(want)):
            problems.append(f"filter status={status} backend={backend}: counter says {shown}, "
                            f"expected {len(want)}")

    # 3. Text filter: one ID's rows only (its own, and any whose tests or title mention it).
    needle = reqs[0]["id"] if reqs else "x"
    dom = dump(page, f"q={needle}")
    visible = [row["id"] for row in dom.rows if not row["hidden"]]
    want = [r["id"] for r in reqs
            if needle.lower() in " ".join([r["id"], r["title"]] +
                                          [t["test"] for t in r["tests"]]).lower()]
    if visible != want or (len(reqs) > 1 and len(visible) >= len(reqs)):
        problems.append(f"filter q={needle}: visible {visible[:5]}..., expected {want[:5]}")

    # 4. Screenshot (the top of the page: header, totals, ratchet, first sections).
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        if screenshot.exists():
            screenshot.unlink()
        chromium(["--virtual-time-budget=3000", "--window-size=1400,1600",
                  f"--screenshot={screenshot.resolve()}", page.resolve().as_uri()])
        if not screenshot.exists() or png_size(screenshot) != (1400, 1600):
            problems.append(f"no 1400x1600 PNG screenshot written to {screenshot}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("page", type=Path)
    ap.add_argument("report", type=Path)
    ap.add_argument("--screenshot", type=Path)
    args = ap.parse_args()
    try:
        problems = check_page(args.page, args.report, args.screenshot)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        problems = [str(e)]
    for p in problems:
        print(f"report_browser: {args.page}: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"report_browser: {args.page}: renders, totals equal {args.report.name}, filter "
          "hides rows" + (f", screenshot {args.screenshot}" if args.screenshot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
