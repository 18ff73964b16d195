#!/usr/bin/env python3
"""`worker-orcd verify` as a person uses it (issue 18, WRK-D18): a stream saved with curl from
the real worker (cpu backend, stories260K) verifies as identical; on a terminal a progress line
counts the steps, off one stderr stays quiet; a tampered stream exits 1 naming the step; an
unreadable one exits 2."""

import json
import os
import pty
import select
import subprocess
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

from worker_paths import NOT_BUILT, ROOT, WORKER, RunningWorker

SHARED = Path(os.environ.get("WORKER_SHARED_FIXTURES", ROOT.parent / "shared/fixtures"))
MODEL = SHARED / "stories260K.gguf"


def run_in_pty(argv, timeout=120):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    out, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


@unittest.skipUnless(WORKER.exists(), NOT_BUILT)
class VerifyTerminalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        w = RunningWorker(MODEL)
        try:
            body = json.dumps({"job_id": "verify-tty", "prompt": "Once upon a time",
                               "max_tokens": 40, "temperature": 0.8, "top_p": 0.9,
                               "seed": 1234}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{w.port}/execute", data=body,
                                         headers={"Content-Type": "application/json"})
            cls.stream = urllib.request.urlopen(req, timeout=60).read().decode()
        finally:
            w.stop()
        cls.stream_file = Path(cls.tmp.name) / "stream.txt"
        cls.stream_file.write_text(cls.stream)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def end_event(self):
        ends = [json.loads(line[5:]) for line in self.stream.splitlines()
                if line.startswith("data:") and '"type":"end"' in line]
        self.assertEqual(len(ends), 1, self.stream)
        return ends[0]

    # REQ: WRK-D18
    def test_saved_stream_verifies_with_a_progress_line_on_a_terminal(self):
        n = len(self.end_event()["receipt"]["tokens"])
        self.assertGreater(n, 5)
        code, out = run_in_pty([str(WORKER), "verify", str(self.stream_file), "--model", str(MODEL)])
        self.assertEqual(code, 0, out)
        self.assertIn(f"\rverify: step {n}/{n}", out)
        self.assertIn("tok/s", out)
        self.assertIn(f"identical: {n} steps replayed on the CPU reference", out)

    # REQ: WRK-D18
    def test_off_a_terminal_only_the_answer_is_printed(self):
        r = subprocess.run([str(WORKER), "verify", str(self.stream_file), "--model", str(MODEL)],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertTrue(r.stdout.startswith("identical: "), r.stdout)

    # REQ: WRK-D18
    def test_tampered_and_unreadable_receipts(self):
        end = self.end_event()
        end["receipt"]["tokens"][5] += 1
        bad = Path(self.tmp.name) / "tampered.json"
        bad.write_text(json.dumps(end))
        r = subprocess.run([str(WORKER), "verify", str(bad), "--model", str(MODEL)],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("DIFFERS: step 5: token receipt", r.stdout)
        junk = Path(self.tmp.name) / "junk.txt"
        junk.write_text("not a receipt\n")
        r = subprocess.run([str(WORKER), "verify", str(junk), "--model", str(MODEL)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("verify:", r.stderr)
        r = subprocess.run([str(WORKER), "verify", str(self.stream_file)], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
