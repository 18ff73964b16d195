#!/usr/bin/python3
"""Writes a copy of a GGUF model with deliberately corrupted weights, for the haiku
mutation check (issue 7, acceptance 2): the anti-cheat test must FAIL against it.

The corruption keeps every value a valid number of its type (no NaN/Inf from random
bytes): within the token embedding (and output) and each attention-output and FFN-down tensor, whole quantization blocks
(or single values for float types) are permuted with a fixed seed. The model still runs
and emits fluent-looking tokens, but not the trained ones.

Usage: corrupt_model.py IN.gguf OUT.gguf
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures"))
from gguf_reader import GgufReader, TYPE_SIZES  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = GgufReader(src)
    data = bytearray(r.buf)
    rng = random.Random(20261125)
    changed = 0
    for t in r.tensors:
        if not (t.name.endswith("attn_output.weight") or t.name.endswith("ffn_down.weight")
                or t.name == "token_embd.weight" or t.name == "output.weight"):
            continue
        if t.ggml_type not in TYPE_SIZES:
            raise SystemExit(f"{t.name}: unsupported type {t.ggml_type}")
        _, block_bytes = TYPE_SIZES[t.ggml_type]
        start = r.data_offset + t.offset
        raw = r.tensor_bytes(t)
        n_blocks = len(raw) // block_bytes
        order = list(range(n_blocks))
        rng.shuffle(order)
        shuffled = b"".join(raw[i * block_bytes:(i + 1) * block_bytes] for i in order)
        data[start:start + len(raw)] = shuffled
        changed += 1
    if changed == 0:
        raise SystemExit("no attn_output/ffn_down tensor found to corrupt")
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dst)
    print(f"corrupted {changed} tensors -> {dst}")


if __name__ == "__main__":
    main()
