"""What the tests that run the real worker binary share: the source and build folders (ctest
passes WORKER_SOURCE_DIR / WORKER_BINARY_DIR), the binary, the committed haiku model, the
skip reason when the binary is not built, and a free loopback port."""

import os
import socket
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
