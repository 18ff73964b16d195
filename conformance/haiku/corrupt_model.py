#!/usr/bin/python3
"""Writes a copy of a GGUF model with deliberately corrupted weights, for the haiku
mutation check (issue 7, acceptance 2): the anti-cheat test must FAIL against it.

The corruption keeps every value a valid number of its type (no NaN/Inf from random
bytes): within every tensor, whole quantization blocks (or single values for float types)
are permuted with a fixed seed. The model still runs and emits tokens, but not the trained
ones. (Permuting only the embedding, attention-output and FFN-down tensors was too weak:
that model still favoured the number words it was trained on, and at a one-word minute
such as "twenty" its output held the word exactly once in 2 of 3 runs on an H100.)

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
        raise SystemExit("no tensor found to corrupt")
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dst)
    print(f"corrupted {changed} tensors -> {dst}")


if __name__ == "__main__":
    main()
