#!/usr/bin/env python3
"""reports/requirements.html (issue 17): rendered by tools/reqcov.py from a tiny repository and
checked in Debian's headless chromium by tools/report_browser.py (totals equal the JSON's, the
filter hides rows, a screenshot is written beside the test results)."""

import os
import sys
import tempfile
import unittest
from html.parser import HTMLParser
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import report_browser  # noqa: E402
import reqcov  # noqa: E402
from test_reqcov import Repo  # noqa: E402

NO_CHROMIUM = "not run: chromium not installed (ci/setup.sh installs Debian's chromium)"


def results_dir() -> Path:
    d = os.environ.get("WORKER_TEST_RESULTS_DIR")
    return Path(d) if d else Path(tempfile.gettempdir())


class RequirementsPageTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        # Mixed outcomes so every colour and both backends appear: M0-W-1 passes on both,
        # M0-W-2 passes on cpu and is not run on cuda, M0-W-3 fails on cuda.
        self.repo = Repo(self.tmp)
        self.repo.results([("Alpha", "One", "pass"), ("BetaFixture", "Two", "pass"),
                           ("Inst/GammaParam", "Three/0", "pass")])
        self.repo.results([("Alpha", "One", "pass"), ("BetaFixture", "Two", "fail"),
                           ("Inst/GammaParam", "Three/0", "skip")], backend="cuda")
        self.rc, self.rep, _ = self.repo.report(backends=("cpu", "cuda"))
        self.page = self.tmp / "out/requirements.html"
        self.json = self.tmp / "out/requirements.json"

    def tearDown(self):
        self._tmp.cleanup()

    # REQ: WRK-D24
    def test_page_is_self_contained_and_grouped_by_section(self):
        text = self.page.read_text()
        links = []

        class Links(HTMLParser):
            def handle_starttag(self, tag, attrs):
                a = dict(attrs)
                if tag == "link" or (tag in ("script", "img", "iframe") and a.get("src")):
                    links.append((tag, a))
                for k in ("href", "src"):
                    if a.get(k, "").startswith(("http:", "https:", "//")):
                        links.append((tag, a))

        Links().feed(text)
        self.assertEqual(links, [], "the page must need no external asset or network")
        for r in self.rep["requirements"]:  # one section header per spec section
            self.assertEqual(text.count(f'<th colspan="5">{reqcov.section_of(r["id"])}<'), 1)
        self.assertIn("(M0-W-13xx)", reqcov.section_of("M0-W-1330"))
        self.assertIn("(WRK-D)", reqcov.section_of("WRK-D24"))
        self.assertIn(self.rep["generated"]["commit"], text)
        self.assertIn(self.rep["generated"]["date"], text)
        self.assertEqual(text.count('<tr class="req"'), len(self.rep["requirements"]))

    # REQ: WRK-D24
    def test_browser_shows_the_json_totals_and_the_filter_hides_rows(self):
        if report_browser.find_chromium() is None:
            self.skipTest(NO_CHROMIUM)
        shot = results_dir() / "requirements-page-unit.png"
        problems = report_browser.check_page(self.page, self.json, shot)
        self.assertEqual(problems, [])
        self.assertEqual(report_browser.png_size(shot), (1400, 1600))

    # REQ: WRK-D24
    def test_browser_check_catches_a_wrong_total_and_a_dead_filter(self):
        if report_browser.find_chromium() is None:
            self.skipTest(NO_CHROMIUM)
        text = self.page.read_text()
        must = self.rep["totals"]["must_m0"]
        wrong = text.replace(f'data-total="must_m0">{must}<', f'data-total="must_m0">{must + 1}<')
        self.assertNotEqual(wrong, text)
        # And without its script the page neither counts nor filters: the check must say so.
        self.page.write_text(wrong[:wrong.rindex("<script>")] + "</body></html>\n")
        problems = report_browser.check_page(self.page, self.json, None)
        self.assertTrue(any("totals.must_m0" in p for p in problems), problems)
        self.assertTrue(any("script did not run" in p for p in problems), problems)
        self.assertTrue(any(p.startswith("filter ") for p in problems), problems)


if __name__ == "__main__":
    unittest.main()
