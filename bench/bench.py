#!/usr/bin/env python3
"""The benchmark end to end (python3 standard library only; bench/run.sh calls it).

For each model (TYPE=PATH) and numerics: engine level through decode_bench --json (decode tok/s
over 256 tokens at depth 512, prompt tok/s for 512 tokens, decode vs depth, prompt vs length,
logits hash), then through HTTP against the real worker-orcd (load to ready, time to first
token p50/p95 for 32- and 512-token prompts, inter-token latency p50/p99, decode tok/s), and
llama.cpp's llama-bench on the same files when --llamacpp-bin is given: run twice, before and
after this worker's figures (its figures move 5-20% between device calls, perf-notes v35), and
each ratio is judged against the faster of the two runs; both are in the JSON
(llamacpp_*_runs) and the report. Writes
OUT/bench-<date>.json (schema 1, one row per (type, numerics)) and OUT/bench-<date>.md.
"""

import argparse
import datetime
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Memory bandwidth of the card (GB/s, vendor figures) for the decode floor: weight bytes per
# token / bandwidth. First match wins.
BANDWIDTH_GBS = [
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM5, HBM3
]

# FP32 rate of the card (vendor TFLOPS: two per FMA) for the Q8_0 products' float-chain floor.
# First match wins.
FP32_TFLOPS = [
    ("H200 NVL", 60.0),
    ("H200", 66.9),  # SXM: 132 SMs x 128 FMA a clock x 1.98 GHz x 2
    ("H100 NVL", 60.0),
    ("H100 PCIe", 51.2),
    ("H100", 66.9),  # SXM5
]

CTX_SWEEP = [128, 256, 512, 1024, 2048, 4096]
LEN_SWEEP = [32, 64, 128, 256, 512]


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    v = sorted(values)
    if not v:
        return None
    k = max(0, min(len(v) - 1, int(-(-p * len(v) // 100)) - 1))
    return v[k]


def card_value(table, card):
    """The value of the first (name, value) of table whose name the card's name holds; None."""
    for key, value in table:
        if key in card:
            return value
    return None


# ---------------------------------------------------------------------------------------------
# Issue 14's "Q8_0 exact >= 60% of its float-chain floor" (perf-notes v21's count). A prompt's
# Q8_0 products take the reference's Q0-lane order: per 32-element block and output, 8 lane
# integers (4 int8 products each, exact in any order), each fma'd into its lane's float chain
# with the block's scale product (one FMUL a block): 1.125 FP32 operations per lane integer, at
# the card's FMA rate, is the floor. The products' time is kernel_bench's at the shapes it times
# (the 0.5B model's, as the bench's files), summed over a layer's calls as the engine makes them
# at 512 tokens (kernels/linear.cu): Q/K/V in one qgemm launch, else three linear() calls; Wo;
# gate + up in one launch, else two; down.
KB_E, KB_F, KB_QD, KB_KD = 896, 4864, 896, 128  # kernel_bench's n_embd, n_ff, q and kv widths
FLOAT_OPS_PER_LANE = 1.125
PRODUCTS_TOKENS = 512


def products_floor(rows, card, n_tok=PRODUCTS_TOKENS):
    """From kernel_bench --json rows of one weight type: {us_per_layer (the products of a layer
    for n_tok tokens), floor_us_per_layer, pct (floor / measured, %)}; None when a call's row
    is missing or the card's FP32 rate is unknown."""
    tflops = card_value(FP32_TFLOPS, card or "")
    us = {(r.get("op"), r.get("shape")): r.get("us") for r in rows if r.get("n_tok") == n_tok}

    def get(op, r, c):
        return us.get((op, f"{r}x{c}"))

    def total(parts):
        return None if any(p is None for p in parts) else sum(parts)

    qkd = KB_QD + 2 * KB_KD
    qkv = get("qgemm qkv", qkd, KB_E)
    if qkv is None:
        qkv = total([get("linear", KB_QD, KB_E), get("linear", KB_KD, KB_E),
                     get("linear", KB_KD, KB_E)])
    gu = get("qgemm gate+up", 2 * KB_F, KB_E)
    if gu is None:
        gu = total([get("linear", KB_F, KB_E)] * 2)
    layer = total([qkv, get("linear", KB_E, KB_QD), gu, get("linear", KB_E, KB_F)])
    if layer is None or tflops is None or layer <= 0:
        return None
    macs = qkd * KB_E + KB_E * KB_QD + 2 * KB_F * KB_E + KB_E * KB_F  # a token's, one layer
    floor_us = FLOAT_OPS_PER_LANE * macs / 4 / (tflops * 1e12 / 2) * 1e6 * n_tok
    return {"us_per_layer": layer, "floor_us_per_layer": floor_us, "pct": 100.0 * floor_us / layer}


def kernel_products(kernel_bench, card, logdir, typ="Q8_0"):
    """products_floor of kernel_bench's run for typ at 512 tokens; None (logged) on failure."""
    cmd = [kernel_bench, "--json", "--type", typ, "--n-tok", str(PRODUCTS_TOKENS)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"kernel_bench: {e}: the products' floor fraction is not measured")
        return None
    (Path(logdir) / "kernel_bench.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        log(f"kernel_bench failed ({r.returncode}): the products' floor fraction is not measured")
        return None
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    res = products_floor(rows, card)
    if res is None:
        log("kernel_bench: a product's row or the card's FP32 rate is missing: not measured")
    return res


def device_info(backend):
    if backend != "cuda" or not shutil.which("nvidia-smi"):
        return {"card": "cpu" if backend == "cpu" else "unknown", "driver": None}
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    if not out:
        return {"card": "unknown", "driver": None}
    name, driver = [s.strip() for s in out[0].split(",", 1)]
    return {"card": name, "driver": driver}


def git_commit(root):
    """The measured tree: BENCH_COMMIT, else git's HEAD with "-dirty" when tracked files differ
    from it (a device call's copy of a working tree can carry a HEAD older than the tree)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    head = r.stdout.strip()
    if not head:
        return "unknown"
    d = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True)
    return head + ("-dirty" if d.returncode == 0 and d.stdout.strip() else "")


# ---------------------------------------------------------------------------------------------
# engine level


def engine_level(decode_bench, backend, path, numerics, c):
    cmd = [decode_bench, "--json", "--backend", backend, "--model", path,
           "--numerics", numerics, "--decode", str(c["decode"]), "--prefill", str(c["depth"]),
           "--reps", str(c["reps"]), "--sweep-decode", str(c["sweep_decode"]),
           "--ctx-sweep", ",".join(map(str, c["ctx_sweep"])),
           "--len-sweep", ",".join(map(str, c["len_sweep"]))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"decode_bench failed ({r.returncode}): {' '.join(cmd)}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if len(rows) != 1:
        raise RuntimeError(f"decode_bench printed {len(rows)} JSON rows, expected 1")
    return rows[0]


# ---------------------------------------------------------------------------------------------
# HTTP


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """The real worker-orcd, started for one (model, numerics); load-to-ready measured from the
    spawn to the first 200 of /health."""

    def __init__(self, binary, model, backend, numerics, ctx, log_path, poll=None):
        # poll: the client polls its socket (Response); by default on the CUDA backend only
        self.port, self.poll = free_port(), backend == "cuda" if poll is None else poll
        cmd = [binary, "--model", model, "--port", str(self.port), "--bind", "127.0.0.1",
               "--backend", backend, "--ctx-size", str(ctx)]
        if backend == "cuda":
            cmd += ["--numerics", numerics]
        self.log = open(log_path, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = t0 + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker-orcd exited with {self.proc.returncode} (log {log_path})")
            if time.perf_counter() > deadline:
                self.stop()
                raise RuntimeError(f"worker-orcd not ready after 120 s (log {log_path})")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                if resp.status == 200:
                    self.load_ms = (time.perf_counter() - t0) * 1000.0
                    self.health = json.loads(body)
                    return
            except OSError:
                pass
            time.sleep(0.005)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def execute(self, prompt, max_tokens, job_id):
        """One /execute; returns (prompt_tokens, ttft_ms, [token event times in ms], end data).
        Times are from the request's first byte sent (connection already open)."""
        body = json.dumps({"job_id": job_id, "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0}).encode()
        req = (f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
               f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            r = Response(sock, 120.0, poll=self.poll)
            t0 = time.perf_counter()
            r.send(req)
            status, headers = r.head()
            if status != 200:
                raise RuntimeError(f"/execute answered {status}: {r.body(headers)[:300]!r}")
            prompt_tokens, times, end, event, data = None, [], None, None, []
            for line, at in r.lines(headers):
                line = line.decode("utf-8", "replace").rstrip("\r")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line == "" and event is not None:
                    payload = json.loads("\n".join(data)) if data else {}
                    if event == "started":
                        prompt_tokens = payload.get("prompt_tokens")
                    elif event == "token":
                        times.append((at - t0) * 1000.0)
                    elif event in ("end", "error"):
                        end = dict(payload, event=event)
                        break
                    event, data = None, []
        if end is None or end["event"] != "end":
            raise RuntimeError(f"/execute did not end cleanly: {end}")
        return prompt_tokens, (times[0] if times else None), times, end


class Response:
    """One HTTP/1.1 exchange on a socket. poll: the socket is non-blocking and the client polls
    it, never sleeping in recv, so its own wake-up from an idle CPU does not add to the times it
    takes (perf-notes v32, the GPU host: with a blocking recv, ~1% of the inter-token gaps came
    out ~0.15-0.25 ms long, most followed by a short one, while the worker's delivery was even).
    Used for the CUDA backend; on the CPU backend a polling client would take a core from the
    engine, so it sleeps in recv. Each piece of the body comes with the time of the recv that
    completed it."""

    def __init__(self, sock, timeout_s, poll):
        if poll:
            sock.setblocking(False)
        else:
            sock.settimeout(timeout_s)
        self.sock, self.buf, self.at = sock, b"", None
        self.deadline = time.perf_counter() + timeout_s

    def _late(self):
        if time.perf_counter() > self.deadline:
            raise TimeoutError("worker-orcd did not answer in time")

    def send(self, data):
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view):]
            except BlockingIOError:
                self._late()

    def _more(self):
        while True:
            try:
                d = self.sock.recv(65536)
            except BlockingIOError:
                self._late()
                continue
            self.at = time.perf_counter()
            self.buf += d
            return bool(d)

    def _until(self, sep):
        while (i := self.buf.find(sep)) < 0:
            if not self._more():
                raise ConnectionError("worker-orcd closed the connection mid-response")
        out, self.buf = self.buf[:i], self.buf[i + len(sep):]
        return out

    def _take(self, n):
        while len(self.buf) < n:
            if not self._more():
                raise ConnectionError("worker-orcd closed the connection mid-response")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self):
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        headers = {}
        for h in lines[1:]:
            k, _, v = h.partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(lines[0].split()[1]), headers

    def _pieces(self, headers):
        """(bytes, time) of the body as it arrives: chunked, sized or up to the close."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while (n := int(self._until(b"\r\n").split(b";")[0], 16)) > 0:
                yield self._take(n), self.at
                self._until(b"\r\n")
        elif "content-length" in headers:
            yield self._take(int(headers["content-length"])), self.at
        else:
            while self.buf or self._more():
                out, self.buf = self.buf, b""
                yield out, self.at

    def body(self, headers):
        return b"".join(p for p, _ in self._pieces(headers))

    def lines(self, headers):
        """(line without its \\n, time its last byte arrived) of the body."""
        rest = b""
        for piece, at in self._pieces(headers):
            rest += piece
            *whole, rest = rest.split(b"\n")
            for line in whole:
                yield line, at
        if rest:
            yield rest, self.at


def calibrate(worker, target, word, tag):
    """A text the model's tokenizer turns into exactly `target` prompt tokens (or the nearest
    found): ' word' repeated (the count fitted from two probes) as far as it stays <= target,
    then short pieces appended one by one."""
    def count(text):
        n, _, _, _ = worker.execute(text, 1, f"{tag}-cal-{time.monotonic_ns()}")
        return n
    a, b = count(word * 8), count(word * 16)
    slope = max((b - a) / 8.0, 1e-9)
    k = max(1, round(8 + (target - a) / slope))
    n = count(word * k)
    while n > target and k > 1:
        k = max(1, k - max(1, round((n - target) / slope)))
        n = count(word * k)
    text = word * k
    for piece in (" a", " b", " c", " d", " e", " f", " g", " h", " i", " j", " k", " l"):
        if n >= target:
            break
        m = count(text + piece)
        if m <= target:
            text, n = text + piece, m
    return text, n


def http_level(binary, backend, path, numerics, c, logdir, tag):
    w = Worker(binary, path, backend, numerics, c["http_ctx"], logdir / f"worker-{tag}.log")
    try:
        res = {"load_to_ready_ms": w.load_ms, "cuda_runtime": w.health.get("cuda_runtime_version")}
        prompts = {}
        for n in {c["short"], c["long"], c["depth"]}:
            prompts[n] = calibrate(w, n, c["word"], tag)
        for key, n in (("ttft32", c["short"]), ("ttft512", c["long"])):
            text, got = prompts[n]
            ttft, server = [], []
            for i in range(c["http_warmup"] + c["ttft_reps"]):
                _, t, _, end = w.execute(text, 2, f"{tag}-ttft{n}-{i}")
                if i >= c["http_warmup"] and t is not None:
                    ttft.append(t)
                    if end.get("first_token_ms") is not None:
                        server.append(float(end["first_token_ms"]))
            res[key] = {"target": n, "prompt_tokens": got, "ms": ttft, "server_ms": server}
        text, _ = prompts[c["depth"]]
        itl, rates, counts = [], [], []
        for i in range(c["decode_reps"]):
            _, _, times, end = w.execute(text, c["decode"], f"{tag}-decode-{i}")
            counts.append(len(times))
            if len(times) >= 2:
                itl += [b - a for a, b in zip(times, times[1:])]
                rates.append((len(times) - 1) / ((times[-1] - times[0]) / 1000.0))
        res["itl_ms"] = itl
        res["decode_tokens"] = counts
        res["http_decode_tok_s"] = sorted(rates)[len(rates) // 2] if rates else None
        return res
    finally:
        w.stop()


# ---------------------------------------------------------------------------------------------
# llama.cpp


def llamacpp(bin_dir, models, logdir, tag="llama-bench"):
    """llama-bench with run-peer.sh's settings (-p 512 -n 256 -d 0,512 -fa 1 -r 3), JSON out
    (kept as logdir/TAG.json). Returns {file name: {"decode": tok/s at depth 512, "prompt512":
    tok/s}} (llama-bench's mean over its repetitions)."""
    exe = Path(bin_dir) / "llama-bench"
    cmd = [str(exe)]
    for m in models:
        cmd += ["-m", m]
    cmd += ["-p", "512", "-n", "256", "-d", "0,512", "-fa", "1", "-r", "3", "-o", "json"]
    log(f"{tag}: " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    (logdir / f"{tag}.json").write_text(r.stdout)
    (logdir / f"{tag}.stderr").write_text(r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}); see {logdir}/{tag}.stderr")
    out = {}
    for t in json.loads(r.stdout):
        name = Path(t["model_filename"]).name
        e = out.setdefault(name, {"decode": None, "prompt512": None})
        if t.get("n_gen") == 256 and t.get("n_prompt") == 0 and t.get("n_depth") == 512:
            e["decode"] = t["avg_ts"]
        if t.get("n_prompt") == 512 and t.get("n_gen") == 0 and t.get("n_depth", 0) == 0:
            e["prompt512"] = t["avg_ts"]
    return out


def best_of_runs(runs):
    """llama.cpp's figures from several llama-bench runs of one call (before and after this
    worker's): per file and figure the fastest run's (the one this worker's ratio is judged
    against: the conservative choice) and every run's, in order (None where a run lacks it).
    Returns {file name: {"decode": best, "prompt512": best, "decode_runs": [...],
    "prompt512_runs": [...]}}."""
    out = {}
    for name in sorted({n for r in runs for n in r}):
        e = {}
        for k in ("decode", "prompt512"):
            vals = [r.get(name, {}).get(k) for r in runs]
            have = [v for v in vals if v is not None]
            e[k] = max(have) if have else None
            e[k + "_runs"] = vals
        out[name] = e
    return out


# ---------------------------------------------------------------------------------------------
# report


def fmt(x, nd=0):
    if x is None:
        return "-"
    return f"{x:,.{nd}f}"


def quotient(a, b):
    """a / b, or None when either is missing (or b is 0)."""
    return a / b if a and b else None


def ratio(a, b):
    q = quotient(a, b)
    return f"{q:.2f}" if q is not None else "-"


# Issue 14's acceptance on this run's numbers: (criterion, row, measured, target, status), status
# "met", "missed" or "not measured" (a llama.cpp ratio without llama-bench in the run; the Q8_0
# products' share of their float-chain floor without kernel_bench). The per-type targets apply
# to the rows of those types; the HTTP ones to every exact row.
def acceptance(doc):
    out = []

    def add(what, r, value, target, ok, shown, absent="-"):
        status = "not measured" if value is None else ("met" if ok(value) else "missed")
        out.append({"criterion": what, "type": r["type"], "numerics": r["numerics"],
                    "measured": None if value is None else round(value, 4), "target": target,
                    "status": status, "shown": absent if value is None else shown(value)})

    for r in doc["rows"]:
        t, num = r["type"], r["numerics"]
        dec = quotient(r["decode_tok_s"], r["llamacpp_decode_tok_s"])
        pr = quotient(r["prompt512_tok_s"], r["llamacpp_prompt512_tok_s"])
        if num == "exact" and t in ("F16", "Q8_0", "Q4_K_M"):
            add("decode >= 2.0x llama.cpp", r, dec, ">= 2.00x", lambda v: v >= 2.0,
                lambda v: f"{v:.2f}x")
        if num == "exact" and t == "F16":
            add("prompt 512 >= 45k tok/s", r, r["prompt512_tok_s"], ">= 45,000",
                lambda v: v >= 45000, lambda v: f"{v:,.0f}")
        if num == "exact" and t == "Q8_0":
            add("prompt 512 >= 1.0x llama.cpp", r, pr, ">= 1.00x", lambda v: v >= 1.0,
                lambda v: f"{v:.2f}x")
            # The issue's second Q8_0 prompt target: the products' own time (kernel_bench)
            add("prompt 512 products >= 60% of the float-chain floor", r,
                r.get("products512_pct_of_float_floor"), ">= 60%", lambda v: v >= 60.0,
                lambda v: f"{v:.1f}%", absent="no kernel_bench in this run")
        if (num == "exact" and t == "Q4_K_M") or (num == "fast" and t == "F16"):
            add("prompt 512 >= 2.0x llama.cpp", r, pr, ">= 2.00x", lambda v: v >= 2.0,
                lambda v: f"{v:.2f}x")
        if num != "exact":
            continue
        add("HTTP TTFT 32-token prompt p50 <= 3 ms", r, r["http_ttft32_p50_ms"], "<= 3.00 ms",
            lambda v: v <= 3.0, lambda v: f"{v:.2f} ms")
        itl = quotient(r["http_itl_p99_ms"], r["http_itl_p50_ms"])
        add("inter-token p99 <= 1.2x p50", r, itl, "<= 1.20x", lambda v: v <= 1.2,
            lambda v: f"{v:.2f}x")
        near = quotient(r["http_decode_tok_s"], r["decode_tok_s"])
        add("HTTP decode within 5% of the engine", r, near, ">= 0.95x", lambda v: v >= 0.95,
            lambda v: f"{v:.3f}x")
    return out


def write_markdown(doc, path, smoke):
    L = []
    L.append(f"# Benchmark {doc['date']}" + (" (smoke run: small counts, not figures)" if smoke else ""))
    L.append("")
    L.append(f"Commit {doc['commit']}, card {doc['card']}, driver {doc['driver'] or '-'}, "
             f"CUDA runtime {doc['cuda_runtime'] or '-'}, bandwidth {fmt(doc['bandwidth_gbs'])} GB/s "
             f"(floor = bandwidth / weight bytes per token). llama.cpp: {doc['llamacpp_source']}. "
             f"Written by `bench/run.sh` (bench/bench.py); {doc['settings']}. HTTP times are the "
             f"client's (python, loopback; on the GPU it polls its socket rather than sleeping "
             f"in recv): TTFT from the request to the first `token` event (in "
             f"brackets the server's part: `first_token_ms` of the `end` event, from generate()'s "
             f"entry to the first token sampled, p50; the rest is HTTP, the hand-offs between "
             f"threads and the client), ITL "
             f"between consecutive `token` events (events the server writes together arrive "
             f"together), HTTP decode = tokens after the first / first-to-last token time.")
    L.append("")
    acc = doc.get("acceptance") or []
    if acc:
        met = sum(1 for x in acc if x["status"] == "met")
        L.append(f"Issue 14's targets on this run: {met} of {len(acc)} met "
                 f"({sum(1 for x in acc if x['status'] == 'missed')} missed, "
                 f"{sum(1 for x in acc if x['status'] == 'not measured')} not measured).")
        L.append("")
        L.append("| target | type | numerics | measured | wanted | |")
        L.append("|" + "---|" * 6)
        for x in acc:
            mark = {"met": "met", "missed": "**missed**", "not measured": "not measured"}[x["status"]]
            L.append(f"| {x['criterion']} | {x['type']} | {x['numerics']} | {x['shown']} "
                     f"| {x['target']} | {mark} |")
        L.append("")
    for r in doc["rows"]:
        if r.get("products512_pct_of_float_floor") is not None:
            L.append(f"{r['type']} {r['numerics']} products of a 512-token prompt (kernel_bench, the "
                     f"engine's calls of one layer): {r['products512_us_per_layer']:,.1f} us "
                     f"against a float-chain floor of {r['products512_floor_us_per_layer']:,.1f} us "
                     f"({FLOAT_OPS_PER_LANE} FP32 operations per 4-product lane integer at the "
                     f"card's FP32 rate): {r['products512_pct_of_float_floor']:.1f}%.")
            L.append("")
    L.append("| type | numerics | decode tok/s | % of floor | llama.cpp decode | ratio | prompt 512 tok/s "
             "| llama.cpp prompt | ratio | TTFT 32 p50/p95 ms | TTFT 512 p50/p95 ms | ITL p50/p99 ms "
             "| HTTP decode tok/s | load to ready ms | logits hash |")
    L.append("|" + "---|" * 15)
    for r in doc["rows"]:
        L.append(
            f"| {r['type']} | {r['numerics']} | {fmt(r['decode_tok_s'])} | {fmt(r['pct_of_floor'], 1)} "
            f"| {fmt(r['llamacpp_decode_tok_s'])} | {ratio(r['decode_tok_s'], r['llamacpp_decode_tok_s'])} "
            f"| {fmt(r['prompt512_tok_s'])} | {fmt(r['llamacpp_prompt512_tok_s'])} "
            f"| {ratio(r['prompt512_tok_s'], r['llamacpp_prompt512_tok_s'])} "
            f"| {fmt(r['http_ttft32_p50_ms'], 2)} / {fmt(r['http_ttft32_p95_ms'], 2)} "
            f"({fmt(r.get('server_first_token32_p50_ms'), 2)}) "
            f"| {fmt(r['http_ttft512_p50_ms'], 2)} / {fmt(r['http_ttft512_p95_ms'], 2)} "
            f"({fmt(r.get('server_first_token512_p50_ms'), 2)}) "
            f"| {fmt(r['http_itl_p50_ms'], 3)} / {fmt(r['http_itl_p99_ms'], 3)} "
            f"| {fmt(r['http_decode_tok_s'])} | {fmt(r['load_to_ready_ms'])} | `{r['logits_hash']}` |")
    L.append("")
    runs = {}  # llama.cpp's runs of this call, a line per weight file (not per numerics)
    for r in doc["rows"]:
        if r.get("llamacpp_decode_runs") is not None:
            runs.setdefault(r["type"], (r["llamacpp_decode_runs"], r["llamacpp_prompt512_runs"]))
    if runs:
        L.append("llama.cpp's runs in this call, in order (the table takes the faster of each "
                 "figure): " + "; ".join(
                     f"{t} decode {' / '.join(fmt(v) for v in d)}, prompt 512 "
                     f"{' / '.join(fmt(v) for v in p)}" for t, (d, p) in runs.items()) + ".")
        L.append("")
    if doc["rows"]:
        ctxs = [p["ctx"] for p in doc["rows"][0]["decode_vs_ctx"]]
        lens = [p["len"] for p in doc["rows"][0]["prompt_vs_len"]]
        L.append("Decode tok/s by context depth:")
        L.append("")
        L.append("| type | numerics | " + " | ".join(str(c) for c in ctxs) + " |")
        L.append("|" + "---|" * (2 + len(ctxs)))
        for r in doc["rows"]:
            L.append(f"| {r['type']} | {r['numerics']} | " +
                     " | ".join(fmt(p["tok_s"]) for p in r["decode_vs_ctx"]) + " |")
        L.append("")
        L.append("Prompt tok/s by prompt length:")
        L.append("")
        L.append("| type | numerics | " + " | ".join(str(n) for n in lens) + " |")
        L.append("|" + "---|" * (2 + len(lens)))
        for r in doc["rows"]:
            L.append(f"| {r['type']} | {r['numerics']} | " +
                     " | ".join(fmt(p["tok_s"]) for p in r["prompt_vs_len"]) + " |")
        L.append("")
    notes = [f"- {r['type']} {r['numerics']}: {n}" for r in doc["rows"] for n in r.get("notes", [])]
    if notes:
        L.append("Notes:")
        L.append("")
        L += notes
        L.append("")
    path.write_text("\n".join(L))


REQUIRED = ["type", "numerics", "model", "weight_bytes", "decode_tok_s", "prompt512_tok_s",
            "logits_hash", "http_ttft32_p50_ms", "http_ttft32_p95_ms", "http_ttft512_p50_ms",
            "http_ttft512_p95_ms", "http_itl_p50_ms", "http_itl_p99_ms", "http_decode_tok_s",
            "load_to_ready_ms", "decode_vs_ctx", "prompt_vs_len"]


def validate(doc, expect_rows):
    """The file's contract (schema 1): raises on a missing or unmeasured field."""
    for k in ("schema", "date", "commit", "card", "driver", "cuda_runtime", "bandwidth_gbs",
              "llamacpp_source", "rows"):
        if k not in doc:
            raise ValueError(f"missing top-level field {k}")
    if doc["schema"] != 1 or len(doc["rows"]) != expect_rows:
        raise ValueError(f"schema {doc['schema']}, {len(doc['rows'])} rows (expected {expect_rows})")
    for r in doc["rows"]:
        for k in REQUIRED:
            if r.get(k) is None:
                raise ValueError(f"row {r.get('type')} {r.get('numerics')}: {k} not measured")
        for k in ("floor_tok_s", "pct_of_floor", "llamacpp_decode_tok_s", "llamacpp_prompt512_tok_s"):
            if k not in r:
                raise ValueError(f"row {r['type']} {r['numerics']}: no field {k}")
        if len(r["logits_hash"]) != 16:
            raise ValueError("logits hash is not 16 hex digits")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, metavar="TYPE=PATH")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--numerics", default="exact,fast")
    ap.add_argument("--worker", required=True, help="worker-orcd binary")
    ap.add_argument("--decode-bench", required=True, help="decode_bench binary")
    ap.add_argument("--out", required=True, help="folder for bench-<date>.json/.md and logs")
    ap.add_argument("--llamacpp-bin", help="folder holding llama-bench (omit: not measured)")
    ap.add_argument("--kernel-bench", help="kernel_bench binary: the Q8_0 products' float-chain "
                    "floor fraction (omit: not measured)")
    ap.add_argument("--smoke", action="store_true", help="small counts (CI: exercises the driver)")
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    a = ap.parse_args()

    root = Path(__file__).resolve().parent.parent
    out = Path(a.out)
    logdir = out / "bench-logs"
    logdir.mkdir(parents=True, exist_ok=True)
    numerics = ["exact"] if a.backend == "cpu" else a.numerics.split(",")
    if a.smoke:
        c = dict(decode=16, depth=32, reps=1, sweep_decode=4, ctx_sweep=[16, 32], len_sweep=[8, 16],
                 http_ctx=256, ttft_reps=3, http_warmup=1, decode_reps=1, word=" hello",
                 short=8, long=32)  # the smoke's "32" and "512" prompts: 8 and 32 tokens
    else:
        c = dict(decode=256, depth=512, reps=3, sweep_decode=64, ctx_sweep=CTX_SWEEP,
                 len_sweep=LEN_SWEEP, http_ctx=1024, ttft_reps=30, http_warmup=3, decode_reps=3,
                 word=" hello", short=32, long=512)
    settings = (f"engine: decode {c['decode']} tokens at depth {c['depth']}, median of {c['reps']}; "
                f"HTTP: {c['ttft_reps']} requests per TTFT figure, {c['decode_reps']} x "
                f"{c['decode']}-token decodes after a {c['depth']}-token prompt")
    dev = device_info(a.backend)
    bw = card_value(BANDWIDTH_GBS, dev["card"]) if a.backend == "cuda" else None
    lc_runs = []
    lc_source = "not measured"
    lc_files = [m.split("=", 1)[1] for m in a.model]
    if a.llamacpp_bin:  # once now and once after this worker's figures (below)
        lc_runs.append(llamacpp(a.llamacpp_bin, lc_files, logdir, "llama-bench-1"))

    products = None
    if a.kernel_bench and a.backend == "cuda":
        log("kernel_bench: the Q8_0 products at 512 tokens")
        products = kernel_products(a.kernel_bench, dev["card"], logdir)
        if products:
            log(f"kernel_bench: {products['us_per_layer']:.1f} us a layer, floor "
                f"{products['floor_us_per_layer']:.1f}: {products['pct']:.1f}%")

    rows, cuda_runtime = [], None
    t_start = time.perf_counter()
    for spec in a.model:
        typ, path = spec.split("=", 1)
        for num in numerics:
            tag = f"{typ}-{num}"
            log(f"{tag}: engine level ({Path(path).name})")
            e = engine_level(a.decode_bench, a.backend, path, num, c)
            log(f"{tag}: decode {e['decode_tok_s']:.1f} tok/s, prompt {e['prompt_tok_s']:.0f} tok/s, "
                f"hash {e['logits_hash']}; HTTP")
            h = http_level(a.worker, a.backend, path, num, c, logdir, tag)
            cuda_runtime = cuda_runtime or h.get("cuda_runtime")
            floor = bw * 1e9 / e["weight_bytes"] if bw else None
            t32, t512 = h["ttft32"]["ms"], h["ttft512"]["ms"]
            notes = []
            for key in ("ttft32", "ttft512"):
                if h[key]["prompt_tokens"] != h[key]["target"]:
                    notes.append(f"{key}: the prompt is {h[key]['prompt_tokens']} tokens, "
                                 f"not {h[key]['target']}")
            if any(k < c["decode"] for k in h["decode_tokens"]):
                notes.append(f"HTTP decode stopped early (EOS) after {h['decode_tokens']} tokens")
            row = {
                "type": typ, "numerics": num, "model": Path(path).name,
                "weight_bytes": e["weight_bytes"], "floor_tok_s": floor,
                "decode_tok_s": e["decode_tok_s"],
                "pct_of_floor": 100.0 * e["decode_tok_s"] / floor if floor else None,
                "prompt512_tok_s": e["prompt_tok_s"],
                "llamacpp_decode_tok_s": None, "llamacpp_prompt512_tok_s": None,  # below
                "http_ttft32_p50_ms": percentile(t32, 50), "http_ttft32_p95_ms": percentile(t32, 95),
                "http_ttft512_p50_ms": percentile(t512, 50),
                "http_ttft512_p95_ms": percentile(t512, 95),
                "server_first_token32_p50_ms": percentile(h["ttft32"]["server_ms"], 50),
                "server_first_token512_p50_ms": percentile(h["ttft512"]["server_ms"], 50),
                "http_itl_p50_ms": percentile(h["itl_ms"], 50),
                "http_itl_p99_ms": percentile(h["itl_ms"], 99),
                "http_decode_tok_s": h["http_decode_tok_s"],
                "load_to_ready_ms": h["load_to_ready_ms"], "logits_hash": e["logits_hash"],
                "ttft32_ms": [round(x, 3) for x in t32], "ttft512_ms": [round(x, 3) for x in t512],
                "itl_ms": [round(x, 4) for x in h["itl_ms"]],
                "decode_vs_ctx": e["decode_vs_ctx"], "prompt_vs_len": e["prompt_vs_len"],
                "prompt_tokens": {"32": h["ttft32"]["prompt_tokens"], "512": h["ttft512"]["prompt_tokens"]},
                "notes": notes,
            }
            if typ == "Q8_0" and num == "exact":
                row["products512_us_per_layer"] = products and products["us_per_layer"]
                row["products512_floor_us_per_layer"] = products and products["floor_us_per_layer"]
                row["products512_pct_of_float_floor"] = products and products["pct"]
            rows.append(row)
            log(f"{tag}: TTFT32 p50 {fmt(row['http_ttft32_p50_ms'], 2)} ms, ITL p50 "
                f"{fmt(row['http_itl_p50_ms'], 3)} ms, HTTP decode {fmt(row['http_decode_tok_s'])} tok/s, "
                f"load {fmt(row['load_to_ready_ms'])} ms; {time.perf_counter() - t_start:.0f} s so far")
    if a.llamacpp_bin:
        try:
            lc_runs.append(llamacpp(a.llamacpp_bin, lc_files, logdir, "llama-bench-2"))
            lc_source = ("measured in this run, twice: before and after this worker's figures; "
                         "each figure is the faster of the two runs (llama-bench -fa 1 -r 3, "
                         "decode at depth 512)")
        except RuntimeError as err:  # keep this worker's figures and the first run's
            log(f"llama-bench-2: {err}")
            lc_source = ("measured in this run once, before this worker's figures (the second "
                         f"run, after them, failed: {err}) (llama-bench -fa 1 -r 3, decode at "
                         "depth 512)")
    lc = best_of_runs(lc_runs)
    for row in rows:
        lcr = lc.get(row["model"], {})
        row["llamacpp_decode_tok_s"] = lcr.get("decode")
        row["llamacpp_prompt512_tok_s"] = lcr.get("prompt512")
        if lc_runs:
            row["llamacpp_decode_runs"] = lcr.get("decode_runs", [None] * len(lc_runs))
            row["llamacpp_prompt512_runs"] = lcr.get("prompt512_runs", [None] * len(lc_runs))
    doc = {"schema": 1, "date": a.date, "commit": git_commit(root), "card": dev["card"],
           "driver": dev["driver"], "cuda_runtime": cuda_runtime, "bandwidth_gbs": bw,
           "llamacpp_source": lc_source, "settings": settings, "smoke": a.smoke, "rows": rows}
    validate(doc, len(a.model) * len(numerics))
    doc["acceptance"] = acceptance(doc)
    jpath, mpath = out / f"bench-{a.date}.json", out / f"bench-{a.date}.md"
    jpath.write_text(json.dumps(doc, indent=1) + "\n")
    write_markdown(doc, mpath, a.smoke)
    log(f"wrote {jpath} and {mpath} in {time.perf_counter() - t_start:.0f} s")
    print(mpath.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
