#!/usr/bin/env python3
"""The stream's event poll (worker/server/job_runner.h, EventChannel::set_spin; on by default on
the CUDA backend, WORKER_EVENT_SPIN_US sets it): with the poll on, a real /execute stream still
carries `started`, every token in order and one `end`, the same text as with the poll off; an
invalid value is refused with a warning line and the worker still serves. Runs the real binary
of the build (WORKER_BINARY_DIR) on the committed haiku model (cpu backend, which polls only
when the variable asks)."""

import http.client
import json
import subprocess
import unittest

from worker_paths import HAIKU as MODEL, NOT_BUILT, WORKER, RunningWorker


def execute(port: int, job_id: str):
    """(event names in order, token events' data) of one greedy /execute stream."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"job_id": job_id, "prompt": "a haiku about the sea", "max_tokens": 24,
                       "temperature": 0})
    c.request("POST", "/execute", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise AssertionError(f"/execute answered {r.status}")
    names, tokens, event = [], [], None
    for raw in r.read().decode("utf-8").split("\n"):
        if raw.startswith("event:"):
            event = raw[6:].strip()
        elif raw.startswith("data:") and event is not None:
            names.append(event)
            if event == "token":
                tokens.append(json.loads(raw[5:].strip()))
            event = None
    c.close()
    return names, tokens


def start(spin: str) -> RunningWorker:
    return RunningWorker(MODEL, env={"WORKER_EVENT_SPIN_US": spin}, stderr=subprocess.PIPE)


def json_lines(err: bytes):
    out = []
    for line in err.decode("utf-8", "replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


@unittest.skipUnless(WORKER.exists() and MODEL.exists(), NOT_BUILT)
class EventSpinTest(unittest.TestCase):
    # REQ: M0-W-1310 M0-W-1311
    def test_poll_on_streams_every_token_in_order_as_with_it_off(self):
        texts = {}
        for spin in ("2000", "0"):
            w = start(spin)
            try:
                for k in range(2):  # the second stream starts inside the poll's window
                    names, tokens = execute(w.port, f"spin-{spin}-{k}")
                    self.assertEqual(names[0], "started", names)
                    self.assertEqual(names[-1], "end", names)
                    self.assertEqual(names.count("end"), 1, names)
                    self.assertEqual(set(names[1:-1]), {"token"}, names)
                    self.assertEqual([t["i"] for t in tokens], list(range(len(tokens))))
                    self.assertGreater(len(tokens), 0)
                    texts.setdefault(spin, []).append("".join(t["t"] for t in tokens))
            finally:
                _, err = w.stop()
            self.assertFalse([e for e in json_lines(err) if e.get("event") == "event_spin_ignored"])
        self.assertEqual(texts["2000"], texts["0"])  # greedy: the same text, poll or not
        self.assertEqual(texts["2000"][0], texts["2000"][1])

    # REQ: M0-W-1900
    def test_an_invalid_value_is_refused_with_a_warning(self):
        w = start("2ms")
        try:
            names, _ = execute(w.port, "spin-invalid")
            self.assertEqual(names[-1], "end", names)
        finally:
            _, err = w.stop()
        warned = [e for e in json_lines(err) if e.get("event") == "event_spin_ignored"]
        self.assertEqual(len(warned), 1, err[-2000:])
        self.assertEqual(warned[0]["WORKER_EVENT_SPIN_US"], "2ms")
        self.assertEqual(warned[0]["level"], "warn")


if __name__ == "__main__":
    unittest.main()
