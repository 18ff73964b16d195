"""What the tests that run the real worker binary share: the source and build folders (ctest
passes WORKER_SOURCE_DIR / WORKER_BINARY_DIR), the binary, the committed haiku model, the
skip reason when the binary is not built, a free loopback port, and RunningWorker (the binary
started on a model and waited for until /health says healthy)."""

import http.client
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(os.environ.get("WORKER_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("WORKER_BINARY_DIR", ROOT / "build"))
WORKER = BUILD / "worker/server/worker-orcd"
HAIKU = ROOT / "fixtures/haiku/haiku-qwen2.gguf"
NOT_BUILT = f"not run: {WORKER} not built (run from ctest after the build)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningWorker:
    """worker-orcd serving `model` on the cpu backend on a free loopback port. The constructor
    returns once /health answers 200 with status "healthy" (health: that body) and raises
    AssertionError when the process exits first or `timeout` seconds pass; env adds variables to
    the environment; stdout / stderr are Popen targets (subprocess.PIPE to read them from
    stop()). stop() sends SIGTERM, waits (kills after 30 s) and returns (stdout, stderr)."""

    def __init__(self, model=HAIKU, env=None, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, timeout=60.0):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(WORKER), "--model", str(model), "--backend", "cpu", "--port", str(self.port),
             "--bind", "127.0.0.1"], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            env=dict(os.environ, **(env or {})))
        self.health = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                r = c.getresponse()
                body = json.loads(r.read())
                c.close()
                if r.status == 200 and body.get("status") == "healthy":
                    self.health = body
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        code = self.proc.poll()
        _, err = self.stop()
        why = f"exited with {code}" if code is not None else f"not healthy within {timeout} s"
        raise AssertionError(f"worker-orcd {why}: {(err or b'')[-2000:]!r}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.communicate()
