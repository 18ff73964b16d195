#!/usr/bin/env python3
"""Runs the tools' python unittests and writes their results as gtest-style XML (--xml FILE), so
tools/reqcov.py reads them like the C++ tests: skipped = not run, failure/error = fail."""

import argparse
import sys
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path


class RecordingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []  # (class, method, outcome, message, seconds)
        self._t0 = 0.0

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, message=""):
        cls, method = type(test).__name__, getattr(test, "_testMethodName", str(test))
        self.records.append((cls, method, outcome, message, time.monotonic() - self._t0))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail", "unexpected success")


def write_xml(path: Path, records) -> None:
    root = ET.Element("testsuites", name="AllTests", tests=str(len(records)))
    suites = {}
    for cls, method, outcome, message, secs in records:
        suite = suites.get(cls)
        if suite is None:
            suite = suites[cls] = ET.SubElement(root, "testsuite", name=cls)
        tc = ET.SubElement(suite, "testcase", name=method, classname=cls, time=f"{secs:.3f}",
                           status="run", result="skipped" if outcome == "skip" else "completed")
        if outcome == "fail":
            ET.SubElement(tc, "failure", message=message.splitlines()[-1] if message else "")
        elif outcome == "skip":
            ET.SubElement(tc, "skipped", message=message)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="UTF-8", xml_declaration=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--xml", help="write gtest-style XML results here")
    ap.add_argument("-k", dest="pattern", help="only tests whose name contains this")
    args = ap.parse_args()
    here = Path(__file__).resolve().parent
    loader = unittest.TestLoader()
    if args.pattern:
        loader.testNamePatterns = [f"*{args.pattern}*"]
    suite = loader.discover(str(here), pattern="test_*.py", top_level_dir=str(here))
    runner = unittest.TextTestRunner(verbosity=2, resultclass=RecordingResult)
    result = runner.run(suite)
    if args.xml:
        write_xml(Path(args.xml), result.records)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
