#!/usr/bin/env python3
"""worker-orcd on a terminal and off one (issue 17): under a pseudo-terminal it draws a load
progress line (bytes, rate, ETA) and a one-line ready banner, and still writes every JSON line
whole; with stderr a pipe, stderr is the JSON lines only, with the events and fields they have
always had. Also `--version` and /health's build object. Runs the real binary of the build
(WORKER_BINARY_DIR) on the committed haiku model (cpu backend)."""

import json
import os
import pty
import re
import select
import signal
import subprocess
import time
import unittest
from pathlib import Path

from worker_paths import BUILD, HAIKU as MODEL, NOT_BUILT, ROOT, WORKER, RunningWorker, free_port

# The JSON lines of a load + SIGTERM, as the worker has always written them (D14, M0-W-1900):
# event and the field names of each line, in order.
CONTEXT = ["gpu_device", "model_ref", "worker_id"]
EXPECTED = [
    ("startup", ["backend", "bind", "inference_timeout_sec", "port", "queue_depth",
                 "worker_id_generated"]),
    ("model_load_start", ["backend"]),
    ("model_load_progress", ["percent"]),
    ("model_load_progress", ["percent"]),
    ("model_load_progress", ["percent"]),
    ("model_load_progress", ["percent"]),
    ("model_load_progress", ["percent"]),
    ("model_load_complete", ["architecture", "context_length", "duration_ms", "quant_kind",
                             "vram_bytes"]),
    ("ready", ["backend", "port", "vram_bytes"]),
    ("signal", ["action", "name", "signal"]),  # issue 15: every stop signal is logged
    ("shutdown", ["reason", "signal"]),
    ("shutdown_complete", ["duration_ms"]),
]


def check_json_lines(test: unittest.TestCase, lines: list[str]) -> None:
    events = [json.loads(line) for line in lines]
    for e in events:
        test.assertIsInstance(e, dict)
    got = [(e["event"], sorted(set(e) - {"ts", "level", "event"} - set(CONTEXT)))
           for e in events]
    test.assertEqual(got, [(ev, sorted(keys)) for ev, keys in EXPECTED])
    test.assertEqual([e["percent"] for e in events if e["event"] == "model_load_progress"],
                     [0, 25, 50, 75, 100])
    for e in events:
        test.assertEqual(list(e), sorted(e))  # nlohmann's order: sorted keys, compact
        for k in CONTEXT:
            test.assertIn(k, e)


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    buf, end = b"", time.monotonic() + timeout
    while needle not in buf and time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pty closes when the child exits
                break
            if not chunk:
                break
            buf += chunk
    return buf


@unittest.skipUnless(WORKER.exists(), NOT_BUILT)
class WorkerTerminalTest(unittest.TestCase):
    # REQ: WRK-D26 M0-W-1621
    def test_pseudo_terminal_shows_progress_line_and_ready_banner(self):
        port = free_port()
        pid, fd = pty.fork()
        if pid == 0:  # child: stdin/stdout/stderr are the pty's slave side
            os.execv(str(WORKER), [str(WORKER), "--model", str(MODEL), "--backend", "cpu",
                                   "--port", str(port), "--bind", "127.0.0.1"])
        try:
            out = read_until(fd, b"worker-orcd ready", 60)
            out += read_until(fd, b"\n", 2)
            os.kill(pid, signal.SIGTERM)
            out += read_until(fd, b'"shutdown_complete"', 20) + read_until(fd, b"\n", 2)
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status = os.waitpid(pid, 0)
            os.close(fd)
        text = out.decode("utf-8", "replace").replace("\r\n", "\n")
        # Each redraw starts with carriage return + erase-line; split into what was drawn.
        drawn = [seg for part in text.split("\n") for seg in part.split("\r\x1b[K") if seg]
        bar = re.compile(r"^loading haiku-qwen2\.gguf \[([#.]{24})\] +(\d+)%  "
                         r"([\d.]+ (?:B|KiB|MiB)) / ([\d.]+ MiB)  (--|[\d.]+ (?:B|KiB|MiB|GiB))"
                         r"( B)?/s  (ETA [\d.]+ s|ETA --|done in [\d.]+ s)$")
        progress = [m for m in map(bar.match, drawn) if m]
        self.assertTrue(progress, f"no progress line in {text!r}")
        self.assertEqual(progress[-1].group(2), "100")
        self.assertTrue(progress[-1].group(7).startswith("done in"))
        self.assertEqual(progress[-1].group(3), progress[-1].group(4))  # all bytes read
        self.assertTrue(any(m.group(7).startswith("ETA") for m in progress), progress)
        self.assertNotEqual(progress[-1].group(5), "--")  # a rate once bytes have moved
        banner = [s for s in drawn if s.startswith("worker-orcd ready:")]
        self.assertEqual(len(banner), 1, text)
        self.assertRegex(banner[0], r"model .+ \(haiku-qwen2\.gguf, \w+, qwen2, ctx \d+\) \| "
                         r"backend cpu \| VRAM none \(cpu\) \| http://127\.0\.0\.1:"
                         + str(port) + r" \| loaded in [\d.]+ s$")
        # The JSON lines are all still there, each whole on its own line.
        check_json_lines(self, [s for s in drawn if s.startswith("{")])
        self.assertTrue(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status)

    # REQ: WRK-D26 M0-W-1900
    def test_without_a_terminal_stderr_is_the_json_lines_only(self):
        w = RunningWorker(MODEL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        health = w.health  # loaded, serving
        out, err = w.stop()
        self.assertEqual(w.proc.returncode, 0, err)
        self.assertEqual(out, b"")
        self.assertNotIn(b"\r", err)
        self.assertNotIn(b"\x1b", err)
        self.assertTrue(err.endswith(b"\n"))
        check_json_lines(self, err.decode().splitlines())
        # /health names the build that ran (the same as --version).
        self.assertIsNotNone(health)
        b = health["build"]
        self.assertEqual(b["numerics"], "reference")  # the cpu backend is the reference
        self.assertIn(b["commit"], version_text())
        self.assertIn(b["cuda_arch"], version_text())
        self.assertIn(b["build_date"], version_text())

    # REQ: WRK-D26
    def test_version_names_commit_date_type_and_cuda_arch(self):
        v = version_text()
        m = re.fullmatch(r"worker-orcd commit ([0-9a-f]{12}|unknown), built "
                         r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) \((\w+)\), CUDA arch (.+)\n", v)
        self.assertIsNotNone(m, v)
        header_path = BUILD / "generated/build_info.h"
        header = header_path.read_text()
        if f'kDate = "{m.group(2)}"' not in header and \
                WORKER.stat().st_mtime < header_path.stat().st_mtime:
            self.skipTest("not run: build_info.h was regenerated (a reconfigure after a commit) "
                          "and worker-orcd not rebuilt since; build the worker-orcd target")
        for name, value in (("kCommit", m.group(1)), ("kDate", m.group(2)),
                            ("kType", m.group(3)), ("kCudaArch", m.group(4))):
            self.assertIn(f'{name} = "{value}"', header)
        if (BUILD / "worker/cuda").is_dir():  # the CUDA backend was built: its archs
            self.assertRegex(m.group(4), r"^\d+")
        else:
            self.assertEqual(m.group(4), "cpu-only")

    # REQ: WRK-D26
    def test_build_info_says_unknown_outside_a_git_checkout(self):
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "info.cmake"
            script.write_text(f'include("{ROOT}/cmake/WorkerBuildInfo.cmake")\n'
                              f'worker_build_info("{tmp}" "{tmp}/build_info.h")\n')
            subprocess.run(["cmake", "-P", str(script)], check=True, capture_output=True,
                           cwd=tmp, timeout=60)
            header = (Path(tmp) / "build_info.h").read_text()
        self.assertIn('kCommit = "unknown"', header)
        self.assertIn('kCudaArch = "cpu-only"', header)


def version_text() -> str:
    r = subprocess.run([str(WORKER), "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


if __name__ == "__main__":
    unittest.main()
