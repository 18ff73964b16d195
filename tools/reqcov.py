#!/usr/bin/env python3
"""Requirement coverage: joins `// REQ:` declarations in test sources with gtest XML results.

Every test declares the requirement IDs it checks on the line(s) directly above its
TEST/TEST_F/TEST_P macro:

    // REQ: M0-W-1311 WRK-D6
    TEST(ServerSse, EventOrder) { ... }

Subcommands (python3 standard library only):
  report    write reports/requirements.{md,json,html} and apply the GATE (exit 1 when it fails)
  scan      list declared tests (optionally only those citing one ID, or as a gtest filter)
  ratchet   print (or --write) the MUST/M0 IDs that no test covers yet
  spec-md   regenerate spec/REQUIREMENTS.md from spec/requirements.json (--check: verify)
  html      re-render requirements.html from an existing requirements.json

The gate fails when: a test cites an unknown ID; a `// REQ:` line is not directly above a
test macro; a MUST requirement in M0 scope has no test and is not in spec/ratchet.txt; a
test covering a MUST/M0 requirement failed on any backend; a ratchet ID is now covered
(the ratchet only shrinks); the ratchet names an unknown or non-MUST/M0 ID.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("cpu", "cuda")
SOURCE_SUFFIXES = (".cpp", ".cc", ".cu")

# Outcome of one test (or one requirement) on one backend.
PASS, FAIL, NOT_RUN, NO_RESULT, NO_TEST = "pass", "fail", "not-run", "no-result", "no-test"

REQ_LINE = re.compile(r"^\s*//\s*REQ:(.*)$")
PY_REQ_LINE = re.compile(r"^\s*#\s*REQ:(.*)$")
PY_CLASS = re.compile(r"^class\s+(\w+)\s*[(:]")
PY_TEST_DEF = re.compile(r"^\s+def\s+(test\w*)\s*\(")
TEST_MACRO = re.compile(
    r"^\s*(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
TEST_MACRO_START = re.compile(r"^\s*(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\s*\(")


@dataclass
class DeclaredTest:
    suite: str
    name: str
    macro: str
    file: str  # relative to the root
    line: int
    ids: list[str] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)  # backend -> outcome

    @property
    def full_name(self) -> str:
        return f"{self.suite}.{self.name}"


@dataclass
class ScanResult:
    tests: list[DeclaredTest]
    errors: list[str]  # malformed annotations (orphan REQ lines)


# ---------------------------------------------------------------- spec


def load_spec(path: Path) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    reqs = data["requirements"]
    seen = set()
    for r in reqs:
        for key in ("id", "title", "level", "scope", "statement"):
            if key not in r:
                raise SystemExit(f"reqcov: {path}: requirement {r.get('id', '?')} lacks '{key}'")
        if r["id"] in seen:
            raise SystemExit(f"reqcov: {path}: duplicate requirement id {r['id']}")
        if r["level"] not in ("MUST", "SHOULD", "MAY"):
            raise SystemExit(f"reqcov: {path}: {r['id']}: level must be MUST/SHOULD/MAY")
        if r["scope"] not in ("M0", "M1", "deferred"):
            raise SystemExit(f"reqcov: {path}: {r['id']}: scope must be M0/M1/deferred")
        if r["scope"] == "deferred" and not r.get("reason"):
            raise SystemExit(f"reqcov: {path}: {r['id']}: a deferred requirement needs a reason")
        seen.add(r["id"])
    return reqs


def is_gated(req: dict) -> bool:
    return req["level"] == "MUST" and req["scope"] == "M0"


def load_ratchet(path: Path) -> list[tuple[str, int]]:
    """IDs (with line numbers) of spec/ratchet.txt; '#' starts a comment."""
    out = []
    if not path.exists():
        return out
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = raw.split("#", 1)[0].strip()
        if text:
            out.append((text.split()[0], lineno))
    return out


# ---------------------------------------------------------------- scan


def test_source_files(root: Path) -> list[Path]:
    """worker/**/tests/*, kernels/**, conformance/**, fixtures/**/tests/* C++/CUDA sources."""
    files = []
    for top in ("worker", "kernels", "conformance", "fixtures"):
        base = root / top
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "node_modules" and
                                 not d.startswith("."))
            rel_dir = Path(dirpath).relative_to(root)
            in_tests = "tests" in rel_dir.parts
            if top in ("worker", "fixtures") and not in_tests:
                continue
            for fn in sorted(filenames):
                if fn.endswith(SOURCE_SUFFIXES):
                    files.append(Path(dirpath) / fn)
    # The tools' own python tests (unittest; tools/tests/run_tests.py writes gtest-style XML).
    files += sorted((root / "tools/tests").glob("*.py")) if (root / "tools/tests").is_dir() else []
    return files


def scan_python_file(rel: str, text: str) -> tuple[list[DeclaredTest], list[str]]:
    """'# REQ:' lines directly above 'def test_*' (decorators may sit between) in a class."""
    tests, errors = [], []
    pending: list[str] = []
    pending_line = 0
    cls = None
    for i, line in enumerate(text.splitlines()):
        m = PY_REQ_LINE.match(line)
        if m:
            if not pending:
                pending_line = i + 1
            pending.extend(split_ids(m.group(1)))
            continue
        c = PY_CLASS.match(line)
        if c:
            cls = c.group(1)
        d = PY_TEST_DEF.match(line)
        if d and cls:
            tests.append(DeclaredTest(suite=cls, name=d.group(1), macro="unittest", file=rel,
                                      line=i + 1, ids=list(dict.fromkeys(pending))))
            pending = []
            continue
        if pending and not line.strip().startswith("@"):
            errors.append(f"{rel}:{pending_line}: '# REQ:' line is not directly above a "
                          "'def test_...' method (it declares nothing)")
            pending = []
    return tests, errors


def split_ids(text: str) -> list[str]:
    return [t for t in re.split(r"[\s,]+", text.strip()) if t]


def is_test_source(rel: str) -> bool:
    """Same selection as test_source_files, for a path relative to the root."""
    parts = rel.split("/")
    if parts[:2] == ["tools", "tests"] and len(parts) == 3 and rel.endswith(".py"):
        return True
    if not rel.endswith(SOURCE_SUFFIXES) or "node_modules" in parts:
        return False
    if parts[0] in ("kernels", "conformance"):
        return True
    return parts[0] in ("worker", "fixtures") and "tests" in parts[1:-1]


def scan_file(path: Path, rel: str, text: str | None = None
              ) -> tuple[list[DeclaredTest], list[str]]:
    tests, errors = [], []
    if text is None:
        text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    pending: list[str] = []
    pending_line = 0
    for i, line in enumerate(lines):
        m = REQ_LINE.match(line)
        if m:
            if not pending:
                pending_line = i + 1
            ids = split_ids(m.group(1))
            if not ids:
                errors.append(f"{rel}:{i + 1}: empty '// REQ:' line")
            pending.extend(ids)
            continue
        if TEST_MACRO_START.match(line):
            # The macro's arguments may wrap onto the next lines.
            joined = " ".join(lines[i:i + 3])
            t = TEST_MACRO.match(joined)
            if not t:
                errors.append(f"{rel}:{i + 1}: cannot parse test macro: {line.strip()}")
                pending = []
                continue
            tests.append(DeclaredTest(suite=t.group(2), name=t.group(3), macro=t.group(1),
                                      file=rel, line=i + 1, ids=list(dict.fromkeys(pending))))
            pending = []
            continue
        if pending:
            errors.append(f"{rel}:{pending_line}: '// REQ:' line is not directly above a "
                          "TEST/TEST_F/TEST_P macro (it declares nothing)")
            pending = []
    if pending:
        errors.append(f"{rel}:{pending_line}: '// REQ:' line at end of file declares nothing")
    return tests, errors


def scan(root: Path, rev: str | None = None) -> ScanResult:
    """Scan the working tree, or with rev the files committed at that git revision."""
    tests, errors = [], []
    if rev is None:
        sources = [(f.relative_to(root).as_posix(), None) for f in test_source_files(root)]
    else:
        import subprocess
        names = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--name-only", rev],
                               check=True, capture_output=True, text=True).stdout.split("\n")
        sources = []
        for rel in sorted(n for n in names if n and is_test_source(n)):
            blob = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{rel}"], check=True,
                                  capture_output=True).stdout
            sources.append((rel, blob.decode("utf-8", errors="replace")))
    for rel, text in sources:
        if rel.endswith(".py"):
            if text is None:
                text = (root / rel).read_text(encoding="utf-8", errors="replace")
            t, e = scan_python_file(rel, text)
        else:
            t, e = scan_file(root / rel, rel, text)
        tests.extend(t)
        errors.extend(e)
    return ScanResult(tests=tests, errors=errors)


# ---------------------------------------------------------------- gtest XML


def testcase_outcome(tc: ET.Element) -> str:
    if tc.find("failure") is not None or tc.find("error") is not None:
        return FAIL
    if tc.find("skipped") is not None:
        return NOT_RUN
    if tc.get("result") in ("skipped", "suppressed") or tc.get("status") == "notrun":
        return NOT_RUN
    return PASS


def load_results(result_dir: Path, warnings: list[str]) -> list[tuple[str, str, str]]:
    """(classname, name, outcome) for every testcase of every *.xml under result_dir."""
    out = []
    if not result_dir.is_dir():
        warnings.append(f"results folder {result_dir} does not exist")
        return out
    for xml in sorted(result_dir.rglob("*.xml")):
        try:
            tree = ET.parse(xml)
        except ET.ParseError as e:
            # A crashed test binary leaves a truncated file; CTest reports that crash itself.
            warnings.append(f"cannot parse test results {xml}: {e}")
            continue
        for tc in tree.iter("testcase"):
            out.append((tc.get("classname", ""), tc.get("name", ""), testcase_outcome(tc)))
    return out


def matches(test: DeclaredTest, classname: str, name: str) -> bool:
    # TEST/TEST_F: "Suite" + "Name"; TEST_P: "Prefix/Suite" + "Name/3";
    # TYPED_TEST: "Suite/0" + "Name"; TYPED_TEST_P: "Prefix/Suite/0" + "Name".
    return test.suite in classname.split("/") and name.split("/")[0] == test.name


def combine(outcomes: list[str]) -> str:
    if not outcomes:
        return NO_RESULT
    if FAIL in outcomes:
        return FAIL
    if PASS in outcomes:
        return PASS
    return NOT_RUN


def attach_results(tests: list[DeclaredTest], backend: str, results) -> None:
    index: dict[str, list[tuple[str, str, str]]] = {}
    for cls, name, outcome in results or []:
        index.setdefault(name.split("/")[0], []).append((cls, name, outcome))
    for t in tests:
        if results is None:
            t.results[backend] = NOT_RUN
            continue
        found = [o for cls, name, o in index.get(t.name, []) if matches(t, cls, name)]
        t.results[backend] = combine(found)


def requirement_status(outcomes: list[str]) -> str:
    if not outcomes:
        return NO_TEST
    if FAIL in outcomes:
        return FAIL
    if PASS in outcomes:
        return PASS
    return NOT_RUN


# ---------------------------------------------------------------- report + gate


def build_report(root: Path, spec_path: Path, ratchet_path: Path,
                 result_dirs: dict[str, Path], coverage_summary: Path | None) -> dict:
    reqs = load_spec(spec_path)
    by_id = {r["id"]: r for r in reqs}
    sc = scan(root)
    errors = list(sc.errors)
    warnings = []

    for backend in BACKENDS:
        rd = result_dirs.get(backend)
        attach_results(sc.tests, backend, load_results(rd, warnings) if rd else None)

    for t in sc.tests:
        for i in t.ids:
            if i not in by_id:
                errors.append(f"{t.file}:{t.line}: test {t.full_name} cites unknown "
                              f"requirement ID '{i}' (see spec/requirements.json)")

    names: dict[str, list[DeclaredTest]] = {}
    for t in sc.tests:
        names.setdefault(t.full_name, []).append(t)
    for n, ts in sorted(names.items()):
        if len(ts) > 1:
            where = ", ".join(f"{t.file}:{t.line}" for t in ts)
            warnings.append(f"test name {n} is defined more than once ({where}); "
                            "its results cannot be told apart")

    tests_by_id: dict[str, list[DeclaredTest]] = {r["id"]: [] for r in reqs}
    for t in sc.tests:
        for i in t.ids:
            if i in tests_by_id:
                tests_by_id[i].append(t)

    ratchet = load_ratchet(ratchet_path)
    ratchet_ids = [i for i, _ in ratchet]
    try:
        rel = ratchet_path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = ratchet_path.as_posix()
    for rid, lineno in ratchet:
        if rid not in by_id:
            errors.append(f"{rel}:{lineno}: ratchet names unknown ID '{rid}'")
        elif not is_gated(by_id[rid]):
            errors.append(f"{rel}:{lineno}: ratchet names {rid}, which is not a MUST "
                          f"requirement in M0 scope; remove it from the ratchet")
        elif tests_by_id[rid]:
            first = tests_by_id[rid][0]
            errors.append(f"{rel}:{lineno}: {rid} is now covered (e.g. {first.full_name} at "
                          f"{first.file}:{first.line}); remove it from {rel} "
                          "(the ratchet may only shrink)")

    rows = []
    for r in reqs:
        rid = r["id"]
        ts = sorted(tests_by_id[rid], key=lambda t: (t.file, t.line))
        status = {b: requirement_status([t.results[b] for t in ts]) for b in BACKENDS}
        gated = is_gated(r)
        if gated and not ts and rid not in ratchet_ids:
            errors.append(f"{rid} ({r['title']}) is a MUST requirement in M0 scope and no "
                          "test covers it (add a test with '// REQ: " + rid + "'; the "
                          "ratchet spec/ratchet.txt may not grow to hide it)")
        if gated:
            for t in ts:
                for b in BACKENDS:
                    if t.results[b] == FAIL:
                        errors.append(f"{rid}: test {t.full_name} ({t.file}:{t.line}) "
                                      f"FAILED on {b}")
            if ts and all(status[b] in (NOT_RUN, NO_RESULT) for b in BACKENDS):
                warnings.append(f"{rid}: has tests, but none of them ran on any backend")
        rows.append({
            "id": rid, "title": r["title"], "level": r["level"], "scope": r["scope"],
            "gated": gated, "in_ratchet": rid in ratchet_ids, "status": status,
            "tests": [{"test": t.full_name, "file": t.file, "line": t.line,
                       "results": dict(t.results)} for t in ts],
        })

    for t in sc.tests:
        if t.ids and result_dirs.get("cpu") and t.results["cpu"] == NO_RESULT:
            warnings.append(f"{t.full_name} ({t.file}:{t.line}) declares requirements but has "
                            "no cpu result (not built or not registered with CTest?)")

    cov_lines, cov_source = [], None
    if coverage_summary is not None:
        if coverage_summary.exists():
            for line in coverage_summary.read_text(encoding="utf-8").splitlines():
                if re.match(r"^\s*(lines|functions|branches)\.*:", line):
                    cov_lines.append(line.strip())
                elif line.startswith("#") and cov_source is None:
                    cov_source = line.lstrip("# ").strip()  # which commit/date measured it
        if not cov_lines:
            warnings.append(f"coverage summary {coverage_summary} holds no lcov summary line")

    def count(pred):
        return sum(1 for row in rows if pred(row))

    gated_rows = [row for row in rows if row["gated"]]
    totals = {
        "requirements": len(rows),
        "by_scope": {s: count(lambda r, s=s: r["scope"] == s) for s in ("M0", "M1", "deferred")},
        "by_level": {lv: count(lambda r, lv=lv: r["level"] == lv)
                     for lv in ("MUST", "SHOULD", "MAY")},
        "must_m0": len(gated_rows),
        "must_m0_covered": sum(1 for r in gated_rows if r["tests"]),
        "covered": count(lambda r: bool(r["tests"])),
        "tests_declared": len(sc.tests),
        "tests_with_req": sum(1 for t in sc.tests if t.ids),
        "ratchet": len(ratchet_ids),
        "per_backend": {
            b: {st: count(lambda r, b=b, st=st: r["status"][b] == st)
                for st in (PASS, FAIL, NOT_RUN, NO_TEST)} for b in BACKENDS},
        "tests_per_backend": {
            b: {st: sum(1 for t in sc.tests if t.results[b] == st)
                for st in (PASS, FAIL, NOT_RUN, NO_RESULT)} for b in BACKENDS},
    }
    return {
        "gate": "pass" if not errors else "fail",
        "errors": errors,
        "warnings": warnings,
        "results": {b: (result_dirs[b].as_posix() if result_dirs.get(b) else None)
                    for b in BACKENDS},
        "coverage_summary": cov_lines,
        "coverage_source": cov_source,
        "ratchet": ratchet_ids,
        "totals": totals,
        "requirements": rows,
    }


STATUS_MD = {PASS: "pass", FAIL: "**FAIL**", NOT_RUN: "not run", NO_RESULT: "no result",
             NO_TEST: "no test"}


def md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def render_report_md(rep: dict, root: Path) -> str:
    t = rep["totals"]
    out = ["# Requirement coverage", "",
           "Generated by `tools/reqcov.py report` (run by `ci/test.sh`); do not edit by hand.",
           "Sources: `// REQ:` lines above each test, gtest XML results per backend, "
           "`spec/requirements.json`, `spec/ratchet.txt`.", ""]
    out.append(f"**Gate: {rep['gate'].upper()}**")
    out.append("")
    for b in BACKENDS:
        src = rep["results"][b]
        if src:
            try:
                src = Path(src).resolve().relative_to(root.resolve()).as_posix()
            except ValueError:
                pass
        note = " (the committed GPU run; see its report in reports/ for commit, card, date)" \
            if b == "cuda" and src else ""
        out.append(f"- {b} results: " + (f"`{src}`{note}" if src
                                         else "none given (column = not run)"))
    out.append("")
    out += ["## Totals", "",
            f"- requirement IDs: {t['requirements']} (scope M0 {t['by_scope']['M0']}, "
            f"M1 {t['by_scope']['M1']}, deferred {t['by_scope']['deferred']}; "
            f"MUST {t['by_level']['MUST']}, SHOULD {t['by_level']['SHOULD']}, "
            f"MAY {t['by_level']['MAY']})",
            f"- IDs with at least one test: {t['covered']}",
            f"- MUST requirements in M0 scope: {t['must_m0']}, covered by a test: "
            f"{t['must_m0_covered']}, still in the ratchet: {t['ratchet']}",
            f"- tests found: {t['tests_declared']} ({t['tests_with_req']} declare requirement "
            "IDs)"]
    for b in BACKENDS:
        pb, tb = t["per_backend"][b], t["tests_per_backend"][b]
        out.append(f"- {b}: IDs pass {pb[PASS]}, fail {pb[FAIL]}, not run {pb[NOT_RUN]}, "
                   f"no test {pb[NO_TEST]}; tests pass {tb[PASS]}, fail {tb[FAIL]}, "
                   f"not run {tb[NOT_RUN]}, no result {tb[NO_RESULT]}")
    cov = "; ".join(rep["coverage_summary"])
    if cov and rep.get("coverage_source"):
        cov += f" ({md_escape(rep['coverage_source'])})"
    out.append("- line coverage (lcov, CPU build): " +
               (cov or "not measured (`WORKER_COVERAGE=1 ci/test.sh`)"))
    out.append("")
    if rep["errors"]:
        out += ["## Gate errors", ""] + [f"- {md_escape(e)}" for e in rep["errors"]] + [""]
    if rep["warnings"]:
        out += ["## Warnings", ""] + [f"- {md_escape(w)}" for w in rep["warnings"]] + [""]
    out += ["## Ratchet (MUST/M0 IDs still allowed to be uncovered; it may only shrink)", ""]
    titles = {r["id"]: r["title"] for r in rep["requirements"]}
    out += [f"- {i}: {md_escape(titles.get(i, '(unknown ID)'))}"
            for i in rep["ratchet"]] or ["- (empty)"]
    out += ["", "## Requirements", "",
            "| ID | Level | Scope | Title | Tests | cpu | cuda |",
            "|---|---|---|---|---|---|---|"]
    for r in rep["requirements"]:
        mark = " (ratchet)" if r["in_ratchet"] else ""
        out.append(f"| {r['id']} | {r['level']} | {r['scope']} | {md_escape(r['title'])} | "
                   f"{len(r['tests'])}{mark} | {STATUS_MD[r['status']['cpu']]} | "
                   f"{STATUS_MD[r['status']['cuda']]} |")
    out += ["", "## Tests per requirement", ""]
    for r in rep["requirements"]:
        if not r["tests"]:
            continue
        out.append(f"### {r['id']}: {md_escape(r['title'])}")
        out.append("")
        for tt in r["tests"]:
            res = ", ".join(f"{b} {STATUS_MD[tt['results'][b]]}" for b in BACKENDS)
            out.append(f"- `{tt['test']}` ({tt['file']}:{tt['line']}): {res}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------- HTML page

# Specification sections, by ID prefix (M0-W-NNxx: the hundreds of the spec's numbering).
SECTIONS = [
    ("M0-SYS-", "System-level requirements (M0-SYS)"),
    ("M0-W-10", "Model lifetime, VRAM, determinism, layering (M0-W-10xx)"),
    ("M0-W-11", "Startup and command line (M0-W-11xx)"),
    ("M0-W-12", "Model loading: GGUF, adapters, weights (M0-W-12xx)"),
    ("M0-W-13", "HTTP API, SSE, tokenizer (M0-W-13xx)"),
    ("M0-W-14", "CUDA context, forward pass, kernels (M0-W-14xx)"),
    ("M0-W-15", "Error handling (M0-W-15xx)"),
    ("M0-W-16", "Performance (M0-W-16xx)"),
    ("M0-W-17", "Build system (M0-W-17xx)"),
    ("M0-W-18", "Testing (M0-W-18xx)"),
    ("M0-W-19", "Observability and logging (M0-W-19xx)"),
    ("WRK-D", "Project decisions (WRK-D)"),
]
STATUS_LABEL = {PASS: "pass", FAIL: "FAIL", NOT_RUN: "not run", NO_RESULT: "no result",
                NO_TEST: "uncovered"}
STATUS_ICON = {PASS: "\u2713", FAIL: "\u2717", NOT_RUN: "\u2013", NO_RESULT: "?", NO_TEST: "\u2205"}


def section_of(rid: str) -> str:
    for prefix, name in SECTIONS:
        if rid.startswith(prefix):
            return name
    return "Other"


def git_identity(root: Path) -> dict:
    """Commit (with '+dirty' for uncommitted changes) of the tree the report is made from."""
    import subprocess

    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "--short=12", "HEAD") or "unknown (not a git checkout)"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return {"commit": commit}


HTML_CSS = """
:root{--pass:#1a7f37;--pass-bg:#dafbe1;--fail:#cf222e;--fail-bg:#ffebe9;--nr:#9a6700;
--nr-bg:#fff8c5;--nt:#57606a;--nt-bg:#eaeef2;--line:#d0d7de;--muted:#57606a}
*{box-sizing:border-box}
body{font:14px/1.45 "DejaVu Sans",system-ui,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:14px 24px;display:flex;align-items:center;gap:18px;
flex-wrap:wrap}
header h1{font-size:20px;margin:0;font-weight:600}
header .meta{color:#c9d1d9;font-size:13px}
header code{color:#fff}
.gate{font-weight:700;padding:3px 12px;border-radius:14px;font-size:14px;letter-spacing:.5px}
.gate.pass{background:var(--pass)}.gate.fail{background:var(--fail)}
main{padding:16px 24px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-bottom:12px}
.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:10px 14px;
min-width:150px}
.card h2{font-size:12px;text-transform:uppercase;letter-spacing:.6px;color:var(--muted);
margin:0 0 4px;font-weight:600}
.card .big{font-size:26px;font-weight:700}
.card .sub{color:var(--muted);font-size:12px}
.bar{display:flex;height:10px;border-radius:5px;overflow:hidden;margin:6px 0 4px;width:260px;
background:var(--nt-bg)}
.bar span{display:block;height:100%}
.counts{display:flex;gap:10px;font-size:13px;flex-wrap:wrap}
.dot{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;
vertical-align:-1px}
.pass .dot,.dot.pass{background:var(--pass)}.fail .dot,.dot.fail{background:var(--fail)}
.not-run .dot,.dot.not-run{background:#d4a72c}.no-test .dot,.dot.no-test{background:#8c959f}
details.box{background:#fff;border:1px solid var(--line);border-radius:8px;padding:8px 14px;
margin-bottom:12px}
details.box summary{cursor:pointer;font-weight:600}
.filters{position:sticky;top:0;z-index:2;background:#f6f8fa;padding:8px 0;display:flex;gap:10px;
align-items:center;flex-wrap:wrap;border-bottom:1px solid var(--line);margin-bottom:8px}
.filters input,.filters select{font:inherit;padding:5px 8px;border:1px solid var(--line);
border-radius:6px;background:#fff}
.filters input{width:320px}
#shown{color:var(--muted)}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid var(--line)}
th,td{border-bottom:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
thead th{background:#eaeef2;font-size:12px;text-transform:uppercase;letter-spacing:.5px}
tr.section th{background:#ddf4ff;font-size:14px;text-transform:none;letter-spacing:0}
tr.section .sc{font-weight:400;color:var(--muted);margin-left:10px;font-size:12px}
td.id{font-family:"DejaVu Sans Mono",monospace;white-space:nowrap;font-size:13px}
td.lv{font-size:12px;color:var(--muted);white-space:nowrap}
td.st{width:210px;padding:0}
td.st details{padding:5px 8px}
td.st summary{cursor:pointer;font-weight:600;list-style:none}
td.st summary::-webkit-details-marker{display:none}
td.st.pass{background:var(--pass-bg);color:var(--pass)}
td.st.fail{background:var(--fail-bg);color:var(--fail)}
td.st.not-run{background:var(--nr-bg);color:var(--nr)}
td.st.no-test{background:repeating-linear-gradient(135deg,var(--nt-bg) 0 6px,#f6f8fa 6px 12px);
color:var(--nt)}
td.st ul{margin:6px 0 2px;padding-left:16px;color:#1f2328;font-weight:400;font-size:12px}
td.st li{margin-bottom:3px}
td.st li code{font-size:11px;word-break:break-all}
td.st .sub{color:var(--muted);font-size:11px}
.r{font-weight:600;font-size:11px;padding:0 4px;border-radius:3px}
.r.pass{color:var(--pass)}.r.fail{color:#fff;background:var(--fail)}.r.not-run{color:var(--nr)}
.r.no-result{color:var(--muted)}
.tag{font-size:11px;padding:0 5px;border-radius:3px;background:#fff8c5;color:#9a6700;
margin-left:4px}
table.only-cpu .col-cuda,table.only-cuda .col-cpu{display:none}
tr[hidden]{display:none}
footer{color:var(--muted);font-size:12px;padding:8px 24px 24px}
"""

# The filter: text (ID, title, test names), status, backend; mirrored in the URL fragment
# (#q=...&status=...&backend=...) so a link (and the headless-browser test) can set it.
HTML_JS = """
(function(){
var q=document.getElementById('q'),st=document.getElementById('status'),
be=document.getElementById('backend'),tbl=document.getElementById('reqs'),
shown=document.getElementById('shown');
function fromHash(){var p=new URLSearchParams(location.hash.slice(1));
q.value=p.get('q')||'';st.value=p.get('status')||'';be.value=p.get('backend')||'';}
function toHash(){var p=new URLSearchParams();if(q.value)p.set('q',q.value);
if(st.value)p.set('status',st.value);if(be.value)p.set('backend',be.value);
history.replaceState(null,'','#'+p.toString());}
function apply(){
var text=q.value.trim().toLowerCase(),s=st.value,b=be.value,n=0,total=0;
tbl.className=b?'only-'+b:'';
var bodies=tbl.tBodies;
for(var i=0;i<bodies.length;i++){var rows=bodies[i].querySelectorAll('tr.req'),k=0;
for(var j=0;j<rows.length;j++){var r=rows[j],ok=true;total++;
if(text&&r.getAttribute('data-text').indexOf(text)<0)ok=false;
if(ok&&s){var c=r.getAttribute('data-cpu'),u=r.getAttribute('data-cuda');
ok=b==='cpu'?c===s:b==='cuda'?u===s:(c===s||u===s);}
r.hidden=!ok;if(ok){n++;k++;}}
bodies[i].hidden=k===0;}
shown.textContent='showing '+n+' of '+total+' requirements';
shown.setAttribute('data-shown',n);}
fromHash();apply();
[q,st,be].forEach(function(e){e.addEventListener('input',function(){toHash();apply();});});
window.addEventListener('hashchange',function(){fromHash();apply();});
})();
"""


def render_report_html(rep: dict) -> str:
    """One self-contained page (no external assets): totals, ratchet, gate problems, and a
    row per requirement grouped by specification section with coloured cpu/cuda cells."""
    from html import escape as h
    t = rep["totals"]
    gate = rep["gate"]
    generated = rep["generated"]

    def num(key: str, value) -> str:
        # data-total names the JSON path of the figure (the browser test compares them).
        return f'<span data-total="{h(key)}">{value}</span>'

    def backend_card(b: str) -> str:
        pb, tb = t["per_backend"][b], t["tests_per_backend"][b]
        n = max(1, t["requirements"])
        segs = "".join(
            f'<span class="dot-{st}" style="width:{100.0 * pb[st] / n:.2f}%;background:'
            f'{col}" title="{STATUS_LABEL[st]}: {pb[st]}"></span>'
            for st, col in ((PASS, "#1a7f37"), (FAIL, "#cf222e"), (NOT_RUN, "#d4a72c"),
                            (NO_TEST, "#8c959f")))
        ids = "".join(f'<span class="{st}"><span class="dot"></span>{STATUS_LABEL[st]} '
                      f'{num(f"per_backend.{b}.{st}", pb[st])}</span>'
                      for st in (PASS, FAIL, NOT_RUN, NO_TEST))
        src = rep["results"].get(b)
        return (f'<div class="card" id="card-{b}"><h2>{b} backend: requirement IDs</h2>'
                f'<div class="bar">{segs}</div><div class="counts">{ids}</div>'
                f'<div class="sub">tests: pass {num(f"tests_per_backend.{b}.pass", tb[PASS])}, '
                f'fail {num(f"tests_per_backend.{b}.fail", tb[FAIL])}, '
                f'not run {num(f"tests_per_backend.{b}.not-run", tb[NOT_RUN])}, '
                f'no result {num(f"tests_per_backend.{b}.no-result", tb[NO_RESULT])}'
                f'<br>results: {h(src) if src else "none given"}</div></div>')

    ratchet_txt = (", ".join(h(i) for i in rep["ratchet"]) if rep["ratchet"]
                   else "empty: every MUST requirement in M0 scope has a test")
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>worker-orcd requirement coverage ({h(generated['commit'])})</title>",
        f"<style>{HTML_CSS}</style></head><body>",
        "<header><h1>worker-orcd: requirement coverage</h1>",
        f'<span class="gate {gate}" id="gate">GATE {gate.upper()}</span>',
        f'<span class="meta">commit <code id="commit">{h(generated["commit"])}</code> '
        f'&middot; generated <span id="date">{h(generated["date"])}</span> by '
        "<code>tools/reqcov.py report</code></span></header><main>",
        '<div class="cards">',
        f'<div class="card"><h2>MUST / M0 covered</h2><div class="big">'
        f'{num("must_m0_covered", t["must_m0_covered"])} / {num("must_m0", t["must_m0"])}'
        f'</div><div class="sub">ratchet (still allowed uncovered): '
        f'{num("ratchet", t["ratchet"])}</div></div>',
        f'<div class="card"><h2>Requirement IDs</h2><div class="big">'
        f'{num("requirements", t["requirements"])}</div><div class="sub">with a test: '
        f'{num("covered", t["covered"])}<br>M0 {t["by_scope"]["M0"]}, M1 {t["by_scope"]["M1"]}'
        f', deferred {t["by_scope"]["deferred"]}</div></div>',
        f'<div class="card"><h2>Tests</h2><div class="big">'
        f'{num("tests_declared", t["tests_declared"])}</div><div class="sub">declaring IDs: '
        f'{num("tests_with_req", t["tests_with_req"])}</div></div>',
        backend_card("cpu"), backend_card("cuda"), "</div>",
        f'<details class="box" id="ratchet" open><summary>Ratchet ({t["ratchet"]} IDs; it may '
        f"only shrink)</summary><p>{ratchet_txt}</p></details>",
    ]
    if rep["errors"]:
        out.append(f'<details class="box" open><summary>Gate errors ({len(rep["errors"])})'
                   "</summary><ul>" + "".join(f"<li>{h(e)}</li>" for e in rep["errors"]) +
                   "</ul></details>")
    if rep["warnings"]:
        out.append(f'<details class="box"><summary>Warnings ({len(rep["warnings"])})</summary>'
                   "<ul>" + "".join(f"<li>{h(w)}</li>" for w in rep["warnings"]) +
                   "</ul></details>")
    if rep["coverage_summary"]:
        src = f' ({h(rep["coverage_source"])})' if rep.get("coverage_source") else ""
        out.append('<details class="box"><summary>Line coverage (lcov, CPU build)</summary><p>' +
                   "; ".join(h(c) for c in rep["coverage_summary"]) + src + "</p></details>")
    out += [
        '<div class="filters"><input id="q" type="search" placeholder="Filter: ID, title or '
        'test name" aria-label="filter text">',
        '<select id="status" aria-label="status"><option value="">any status</option>' +
        "".join(f'<option value="{st}">{STATUS_LABEL[st]}</option>'
                for st in (PASS, FAIL, NOT_RUN, NO_TEST)) + "</select>",
        '<select id="backend" aria-label="backend"><option value="">cpu + cuda</option>'
        '<option value="cpu">cpu only</option><option value="cuda">cuda only</option></select>',
        '<span id="shown"></span></div>',
        '<table id="reqs"><thead><tr><th>ID</th><th>Level / scope</th><th>Title</th>'
        '<th class="col-cpu">cpu</th><th class="col-cuda">cuda</th></tr></thead>',
    ]
    groups: dict[str, list[dict]] = {}
    for r in rep["requirements"]:
        groups.setdefault(section_of(r["id"]), []).append(r)
    for name, rows in groups.items():
        npass = {b: sum(1 for r in rows if r["status"][b] == PASS) for b in BACKENDS}
        out.append(f'<tbody><tr class="section"><th colspan="5">{h(name)}<span class="sc">'
                   f'{len(rows)} IDs &middot; cpu pass {npass["cpu"]}, cuda pass '
                   f'{npass["cuda"]}</span></th></tr>')
        for r in rows:
            text = " ".join([r["id"], r["title"]] + [tt["test"] for tt in r["tests"]]).lower()
            cells = []
            for b in BACKENDS:
                st = r["status"][b]
                n_ok = sum(1 for tt in r["tests"] if tt["results"][b] == PASS)
                label = f"{STATUS_ICON[st]} {STATUS_LABEL[st]}"
                if r["tests"]:
                    label += f" ({n_ok}/{len(r['tests'])})"
                    items = "".join(
                        f'<li><code>{h(tt["test"])}</code> <span class="r '
                        f'{tt["results"][b]}">{STATUS_LABEL[tt["results"][b]]}</span><br>'
                        f'<span class="sub">{h(tt["file"])}:{tt["line"]}</span></li>'
                        for tt in r["tests"])
                    body = (f'<details><summary title="{n_ok} of {len(r["tests"])} tests '
                            f'passed on {b}">{label}</summary><ul>{items}</ul></details>')
                else:
                    body = f"<details><summary>{label}</summary><ul><li>no test declares " \
                           f"this ID</li></ul></details>"
                cells.append(f'<td class="st {st} col-{b}" data-backend="{b}">{body}</td>')
            tags = '<span class="tag">ratchet</span>' if r["in_ratchet"] else ""
            out.append(
                f'<tr class="req" id="{h(r["id"])}" data-cpu="{r["status"]["cpu"]}" '
                f'data-cuda="{r["status"]["cuda"]}" data-text="{h(text)}">'
                f'<td class="id">{h(r["id"])}</td><td class="lv">{r["level"]} / {r["scope"]}'
                f'</td><td>{h(r["title"])}{tags}</td>{"".join(cells)}</tr>')
        out.append("</tbody>")
    out += ["</table></main>",
            "<footer>Sources: <code>// REQ:</code> lines above each test, gtest XML results per "
            "backend, spec/requirements.json, spec/ratchet.txt. Click a cpu/cuda cell to list "
            "its tests and their last result. Same data: requirements.json, requirements.md."
            "</footer>", f"<script>{HTML_JS}</script></body></html>"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- spec-md


def render_spec_md(spec_path: Path) -> str:
    data = json.loads(spec_path.read_text(encoding="utf-8"))
    reqs = load_spec(spec_path)
    out = ["# Requirements", "",
           "Generated from `spec/requirements.json` by `tools/reqcov.py spec-md`; edit the JSON, "
           "then regenerate (a test checks that both agree).", ""]
    if data.get("preamble"):
        out += [data["preamble"], ""]
    out += ["| ID | Level | Scope | Title |", "|---|---|---|---|"]
    for r in reqs:
        out.append(f"| [{r['id']}](#{r['id'].lower().replace('.', '')}) | {r['level']} | "
                   f"{r['scope']} | {md_escape(r['title'])} |")
    out.append("")
    for r in reqs:
        out.append(f"## {r['id']}")
        out.append("")
        out.append(f"**{r['title']}** ({r['level']}, scope {r['scope']})")
        out.append("")
        out.append(r["statement"])
        out.append("")
        if r.get("reason"):
            out.append(f"Deferred because: {r['reason']}")
            out.append("")
        if r.get("source"):
            out.append(f"Source: {r['source']}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------- CLI


def parse_results_args(items: list[str]) -> dict[str, Path]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"reqcov: --results wants BACKEND=DIR, got '{item}'")
        b, d = item.split("=", 1)
        if b not in BACKENDS:
            raise SystemExit(f"reqcov: unknown backend '{b}' (expected one of {BACKENDS})")
        out[b] = Path(d)
    return out


def cmd_report(args) -> int:
    root = Path(args.root)
    rep = build_report(root, Path(args.spec or root / "spec/requirements.json"),
                       Path(args.ratchet or root / "spec/ratchet.txt"),
                       parse_results_args(args.results),
                       Path(args.coverage_summary) if args.coverage_summary else None)
    rep["generated"] = git_identity(root)
    rep["generated"]["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out_dir = Path(args.out_dir or root / "reports")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "requirements.json").write_text(json.dumps(rep, indent=1) + "\n",
                                               encoding="utf-8")
    (out_dir / "requirements.md").write_text(render_report_md(rep, root), encoding="utf-8")
    (out_dir / "requirements.html").write_text(render_report_html(rep), encoding="utf-8")
    t = rep["totals"]
    print(f"reqcov: {t['requirements']} requirement IDs, {t['covered']} with tests; MUST/M0 "
          f"{t['must_m0_covered']}/{t['must_m0']} covered, ratchet {t['ratchet']}; "
          f"report in {out_dir}/requirements.md")
    for w in rep["warnings"]:
        print(f"reqcov: warning: {w}")
    if rep["errors"]:
        for e in rep["errors"]:
            print(f"reqcov: GATE: {e}", file=sys.stderr)
        print(f"reqcov: GATE FAILED ({len(rep['errors'])} problems)", file=sys.stderr)
        return 1
    print("reqcov: gate passed")
    return 0


def cmd_html(args) -> int:
    """Re-renders the page from an existing report JSON (e.g. one merged from a GPU run)."""
    src = Path(args.json)
    rep = json.loads(src.read_text(encoding="utf-8"))
    if "generated" not in rep:  # written before the page existed: name what renders it now
        rep["generated"] = git_identity(Path(args.root))
        rep["generated"]["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        src.write_text(json.dumps(rep, indent=1) + "\n", encoding="utf-8")
    out = Path(args.out) if args.out else src.with_suffix(".html")
    out.write_text(render_report_html(rep), encoding="utf-8")
    return 0


def cmd_scan(args) -> int:
    root = Path(args.root)
    sc = scan(root)
    tests = [t for t in sc.tests if not args.id or args.id in t.ids]
    if args.gtest_filter:
        # TEST_P/TYPED_TEST instances carry prefixes and suffixes: match them all.
        pats = []
        for t in tests:
            pats += [f"{t.suite}.{t.name}", f"*/{t.suite}.{t.name}/*", f"{t.suite}/*.{t.name}",
                     f"*/{t.suite}/*.{t.name}", f"*/{t.suite}.{t.name}"]
        print(":".join(dict.fromkeys(pats)))
    elif args.json:
        print(json.dumps([{"test": t.full_name, "file": t.file, "line": t.line, "ids": t.ids}
                          for t in tests], indent=1))
    else:
        for t in tests:
            print(f"{t.file}:{t.line}\t{t.full_name}\t{' '.join(t.ids)}")
    for e in sc.errors:
        print(f"reqcov: {e}", file=sys.stderr)
    return 0 if tests or not args.id else 1


def cmd_ratchet(args) -> int:
    root = Path(args.root)
    reqs = load_spec(Path(args.spec or root / "spec/requirements.json"))
    covered = {i for t in scan(root, args.at).tests for i in t.ids}
    lines = ["# MUST requirements in M0 scope that no test covers yet. This list may only",
             "# shrink: tools/reqcov.py report fails when an ID here gains a test (remove it",
             "# then) and when a MUST/M0 ID without a test is missing here. Regenerate with",
             "# `tools/reqcov.py ratchet --write` only to shrink it.", ""]
    for r in reqs:
        if is_gated(r) and r["id"] not in covered:
            lines.append(f"{r['id']}  # {r['title']}")
    text = "\n".join(lines) + "\n"
    if args.write:
        Path(args.ratchet or root / "spec/ratchet.txt").write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def cmd_spec_md(args) -> int:
    root = Path(args.root)
    spec = Path(args.spec or root / "spec/requirements.json")
    md = Path(args.out or root / "spec/REQUIREMENTS.md")
    text = render_spec_md(spec)
    if args.check:
        if not md.exists() or md.read_text(encoding="utf-8") != text:
            print(f"reqcov: {md} is out of date with {spec}; run tools/reqcov.py spec-md",
                  file=sys.stderr)
            return 1
        return 0
    md.write_text(text, encoding="utf-8")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=str(DEFAULT_ROOT), help="repository root")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("report", help="write reports/requirements.{md,json,html}, apply the gate")
    r.add_argument("--results", action="append", metavar="BACKEND=DIR",
                   help="gtest XML folder for a backend (cpu, cuda); repeatable")
    r.add_argument("--coverage-summary", metavar="FILE", help="lcov --summary output")
    r.add_argument("--spec")
    r.add_argument("--ratchet")
    r.add_argument("--out-dir")
    r.set_defaults(func=cmd_report)

    hp = sub.add_parser("html", help="re-render requirements.html from a report JSON")
    hp.add_argument("json", help="a requirements.json written by 'report'")
    hp.add_argument("--out", help="default: the JSON's name with .html")
    hp.set_defaults(func=cmd_html)

    s = sub.add_parser("scan", help="list declared tests")
    s.add_argument("--id", help="only tests citing this requirement ID")
    s.add_argument("--gtest-filter", action="store_true", help="print a --gtest_filter value")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_scan)

    rt = sub.add_parser("ratchet", help="list MUST/M0 IDs without tests")
    rt.add_argument("--write", action="store_true", help="overwrite spec/ratchet.txt")
    rt.add_argument("--at", metavar="REV", help="scan the test sources committed at this git "
                    "revision (e.g. HEAD) instead of the working tree")
    rt.add_argument("--spec")
    rt.add_argument("--ratchet")
    rt.set_defaults(func=cmd_ratchet)

    m = sub.add_parser("spec-md", help="regenerate spec/REQUIREMENTS.md from the JSON")
    m.add_argument("--check", action="store_true", help="only verify it is up to date")
    m.add_argument("--spec")
    m.add_argument("--out")
    m.set_defaults(func=cmd_spec_md)

    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
