#!/usr/bin/env python3
"""tools/cubin_diff.py on hand-built ELF files laid out as a cubin (.text.KERNEL sections,
.rela.text.KERNEL, .nv.shared.KERNEL, .symtab / .strtab, .nv.info's REGCOUNT and FRAME_SIZE
records): identical kernels, each kind of difference, kernels paired across the anonymous
namespace's per-file hash, kernels in one file only, the filter and the exit codes."""

import importlib.util
import io
import os
import struct
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(os.environ.get("WORKER_SOURCE_DIR", Path(__file__).resolve().parents[2]))
SPEC = importlib.util.spec_from_file_location("cubin_diff", ROOT / "tools/cubin_diff.py")
cubin_diff = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cubin_diff)


def anon(name, h):
    """A mangled kernel name in file f.cu's anonymous namespace, with per-file hash h."""
    return f"_ZN6worker47_GLOBAL__N__{h}_4_f_cu_9cfea13f{len(name)}{name}Ev"


def cubin(kernels):
    """An ELF64 file with, for each kernel (name, text, regs, frame, shared, relocs), the
    sections and records cubin_diff reads."""
    secs = [("", 0, 0, b"", 0)]  # name, type, info, body (bytes, or int: NOBITS size), entsize
    syms, info = [b""], b""
    for name, text, regs, frame, shared, relocs in kernels:
        secs.append((".text." + name, 1, 0, text, 0))
        if relocs:
            body = b"".join(struct.pack("<QQq", off, (7 << 32) | typ, 0) for off, typ in relocs)
            secs.append((".rela.text." + name, 4, 0, body, 24))
        secs.append((".nv.shared." + name, 8, 0, shared, 0))
        syms.append(name.encode())
        idx = len(syms) - 1
        info += struct.pack("<BBHII", 4, 0x2F, 8, idx, regs)
        info += struct.pack("<BBHII", 4, 0x11, 8, idx, frame)
        info += struct.pack("<BBH", 3, 0x1B, 0x100)  # a 2-byte record the parser must skip
        # another attribute's 12 bytes that read as a REGCOUNT record if its size is not skipped
        info += struct.pack("<BBH", 4, 0x0A, 12) + struct.pack("<BBHII", 4, 0x2F, 8, idx, 7)
    strtab = b"\0".join(syms) + b"\0"
    offs, o = [], 0
    for s in syms:
        offs.append(o)
        o += len(s) + 1
    symtab = b"".join(struct.pack("<IBBHQQ", off, 0x12, 0, 0, 0, 0) for off in offs)
    secs += [(".nv.info", 0x70000000, 0, info, 0), (".symtab", 2, 0, symtab, 24),
             (".strtab", 3, 0, strtab, 0)]
    names = [s[0] for s in secs] + [".shstrtab"]
    shstr, noff = b"", []
    for n in names:
        noff.append(len(shstr))
        shstr += n.encode() + b"\0"
    secs.append((".shstrtab", 3, 0, shstr, 0))
    data = bytearray(64)
    hdrs = []
    for i, (_n, typ, inf, body, ent) in enumerate(secs):
        if isinstance(body, int):
            hdrs.append((noff[i], typ, 0, 0, len(data), body, 0, inf, 1, ent))
        else:
            hdrs.append((noff[i], typ, 0, 0, len(data), len(body), 0, inf, 1, ent))
            data += body
    shoff = len(data)
    for h in hdrs:
        data += struct.pack("<IIQQQQIIQQ", *h)
    data[0:16] = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, 64, len(secs), len(secs) - 1)
    return bytes(data)


BASE = [(anon("stepA", "7f748c68"), b"\x01" * 64, 254, 0, 1408, [(16, 5)]),
        (anon("stepB", "7f748c68"), b"\x02" * 96, 255, 8, 1408, [])]


class CubinDiffTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_diff(self, a, b, *args):
        pa, pb = self.dir / "a.cubin", self.dir / "b.cubin"
        pa.write_bytes(a if isinstance(a, bytes) else cubin(a))
        pb.write_bytes(b if isinstance(b, bytes) else cubin(b))
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = cubin_diff.main([str(pa), str(pb), *args])
        return rc, out.getvalue(), err.getvalue()

    def variant(self, i, **kw):
        ks = [list(k) for k in BASE]
        fields = {"text": 1, "regs": 2, "frame": 3, "shared": 4, "relocs": 5}
        for key, value in kw.items():
            ks[i][fields[key]] = value
        return [tuple(k) for k in ks]

    def test_reads_the_records(self):
        path = self.dir / "k.cubin"
        path.write_bytes(cubin(BASE))
        ks = cubin_diff.kernels(path)
        self.assertEqual(len(ks), 2)
        a = ks[cubin_diff.normalize(BASE[0][0])]
        self.assertEqual((a.registers, a.frame, a.shared, len(a.text)), (254, 0, 1408, 64))
        self.assertEqual(a.relocs, ((16, 5, 0),))
        b = ks[cubin_diff.normalize(BASE[1][0])]
        self.assertEqual((b.registers, b.frame), (255, 8))

    def test_identical_files(self):
        rc, out, _ = self.run_diff(BASE, BASE)
        self.assertEqual(rc, 0)
        self.assertIn("2 of 2 kernels identical", out)
        self.assertNotIn("differs", out)
        rc, out, _ = self.run_diff(BASE, BASE, "--all")
        self.assertEqual(out.count("same"), 2)

    def test_anonymous_namespace_hash_is_ignored(self):
        other = [(anon(n, "0badf00d"),) + k[1:] for n, k in zip(("stepA", "stepB"), BASE)]
        self.assertNotEqual(other[0][0], BASE[0][0])
        self.assertEqual(cubin_diff.normalize(other[0][0]), cubin_diff.normalize(BASE[0][0]))
        rc, out, _ = self.run_diff(BASE, other)
        self.assertEqual(rc, 0, out)

    def test_each_difference_is_named(self):
        cases = {
            "sass)": self.variant(0, text=b"\x01" * 63 + b"\x09"),
            "sass size": self.variant(0, text=b"\x01" * 80),
            "registers 254 -> 200": self.variant(0, regs=200),
            "frame 8 -> 16": self.variant(1, frame=16),
            "shared 1408 -> 2048": self.variant(1, shared=2048),
            "relocations": self.variant(0, relocs=[(24, 5)]),
        }
        for what, b in cases.items():
            with self.subTest(what=what):
                rc, out, _ = self.run_diff(BASE, b)
                self.assertEqual(rc, 1)
                self.assertIn(what, out)
                self.assertIn("1 of 2 kernels identical", out)

    def test_kernel_in_one_file_only(self):
        rc, out, _ = self.run_diff(BASE, BASE[:1])
        self.assertEqual(rc, 1)
        self.assertIn("only in A", out)
        rc, out, _ = self.run_diff(BASE[:1], BASE)
        self.assertIn("only in B", out)

    def test_filter(self):
        b = self.variant(1, regs=100)
        rc, out, _ = self.run_diff(BASE, b, "--filter", "stepA")
        self.assertEqual(rc, 0)
        self.assertIn("1 of 1 kernels identical", out)
        rc, _, err = self.run_diff(BASE, b, "--filter", "nothing")
        self.assertEqual(rc, 2)
        self.assertIn("no kernel", err)

    def test_not_an_elf(self):
        rc, _, err = self.run_diff(b"not an elf file at all" * 4, BASE)
        self.assertEqual(rc, 2)
        self.assertIn("not a 64-bit", err)


if __name__ == "__main__":
    unittest.main()
