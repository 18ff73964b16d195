#!/usr/bin/env python3
"""Which kernels two builds of a CUDA file compile differently: kernel by kernel, the SASS bytes
(.text.KERNEL), the registers, the static shared memory and the stack of two cubins. A change
whose kernels come out byte-identical needs no A/B run on the device (their speed is already
measured), and one that moves only some kernels needs an A/B only of the models those kernels
serve (perf-notes v49: quantize_q8_0 as a call in the Q8_0 step only, whose Q8_0 steps are the
bytes of a build already measured and whose other steps are main's).

    nvcc <the build's flags: compile_commands.json> -arch=sm_90a -cubin kernels/decode_step.cu -o a.cubin
    (the same from the variant's tree) -o b.cubin
    tools/cubin_diff.py a.cubin b.cubin [--filter REGEX] [--all]

Kernels are paired by their mangled names with the anonymous namespace's per-file hash taken
out (`_GLOBAL__N__<hash>_<len>_<file>_<hash>` differs between two trees of the same file). Per
kernel it compares the .text section's bytes and its relocations (offset and type; the symbol
indices differ between files), the register count and the stack frame (.nv.info's
EIATTR_REGCOUNT and EIATTR_FRAME_SIZE records of the kernel's symbol) and the sizes of
.nv.shared.KERNEL and .nv.local.KERNEL. One line a kernel that differs (all with
--all): same / differs (what) / only in A / only in B, the .text sizes, the demangled name when
c++filt is on the PATH.

Exit status: 0 when every compared kernel is identical, 1 when any differs or is in one file
only, 2 on usage errors or a file that is not a 64-bit little-endian ELF.
"""

from __future__ import annotations

import argparse
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

SHT_NOBITS = 8
SHT_RELA = 4
EIFMT_SVAL = 4  # .nv.info record formats: 4 = a u16 size and that many bytes, else 2 bytes
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F


class Kernel:  # what is compared of one kernel
    def __init__(self) -> None:
        self.text = b""
        self.registers = -1
        self.frame = -1
        self.relocs: tuple = ()
        self.shared = 0
        self.local = 0
        self.raw_name = ""


class ElfError(Exception):
    pass


def sections(data: bytes):
    """(name, type, bytes or size, entsize) of each section of a 64-bit LE ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise ElfError("no section table")
    hdrs = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size, _link, _info, _align, ent = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        hdrs.append((name, typ, off, size, ent))
    _, _, stroff, strsize, _ = hdrs[shstrndx]
    strtab = data[stroff:stroff + strsize]
    out = []
    for name, typ, off, size, ent in hdrs:
        end = strtab.find(b"\0", name)
        sname = strtab[name:end].decode("ascii", "replace")
        body = size if typ == SHT_NOBITS else data[off:off + size]
        out.append((sname, typ, body, ent))
    return out


def symbol_names(secs) -> list[str]:
    """The names of .symtab's symbols by index (names in .strtab)."""
    by = {name: body for name, _typ, body, _ent in secs if isinstance(body, bytes)}
    tab, strs = by.get(".symtab", b""), by.get(".strtab", b"")
    out = []
    for o in range(0, len(tab) - 23, 24):
        name, = struct.unpack_from("<I", tab, o)
        out.append(strs[name:strs.find(b"\0", name)].decode("ascii", "replace"))
    return out


def info_attrs(body: bytes, attrs) -> list[tuple[int, int, int]]:
    """(attribute, symbol index, value) of .nv.info's SVAL records of the given attributes."""
    out, o = [], 0
    while o + 4 <= len(body):
        fmt, attr = body[o], body[o + 1]
        if fmt != EIFMT_SVAL:
            o += 4
            continue
        size, = struct.unpack_from("<H", body, o + 2)
        if attr in attrs and size == 8:
            sym, value = struct.unpack_from("<II", body, o + 4)
            out.append((attr, sym, value))
        o += 4 + size
    return out


def normalize(name: str) -> str:
    """The mangled name without the anonymous namespace's per-file hashes."""
    out, pos = [], 0
    for m in re.finditer(r"_GLOBAL__N__[0-9a-f]+_(\d+)_", name):
        if m.start() < pos:
            continue
        n = int(m.group(1))
        rest = name[m.end():]
        tail = re.match(r"_[0-9a-f]+", rest[n:])
        if tail is None:
            continue
        out.append(name[pos:m.start()] + "_GLOBAL__N_" + rest[:n])
        pos = m.end() + n + tail.end()
    out.append(name[pos:])
    return "".join(out)


def kernels(path: Path) -> dict[str, Kernel]:
    ks: dict[str, Kernel] = {}

    def get(sym: str) -> Kernel:
        k = ks.setdefault(normalize(sym), Kernel())
        k.raw_name = sym
        return k

    secs = sections(path.read_bytes())
    syms = symbol_names(secs)
    for name, typ, body, ent in secs:
        if name == ".nv.info":
            for attr, sym, value in info_attrs(body, (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE)):
                if sym < len(syms) and syms[sym]:
                    k = get(syms[sym])
                    if attr == EIATTR_REGCOUNT:
                        k.registers = value
                    else:
                        k.frame = value
        elif name.startswith(".text."):
            get(name[len(".text."):]).text = body
        elif name.startswith((".rel.text.", ".rela.text.")):
            sym = name.split(".text.", 1)[1]
            size = ent or (24 if typ == SHT_RELA else 16)
            rel = []
            for o in range(0, len(body) - size + 1, size):
                off, rinfo = struct.unpack_from("<QQ", body, o)
                addend = struct.unpack_from("<q", body, o + 16)[0] if typ == SHT_RELA else 0
                rel.append((off, rinfo & 0xFFFFFFFF, addend))
            get(sym).relocs = tuple(rel)
        elif name.startswith(".nv.shared."):
            get(name[len(".nv.shared."):]).shared = body if isinstance(body, int) else len(body)
        elif name.startswith(".nv.local."):
            get(name[len(".nv.local."):]).local = body if isinstance(body, int) else len(body)
    return {n: k for n, k in ks.items() if k.text}


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {n: n for n in names}
    res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True,
                         check=False)
    lines = res.stdout.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def compare(a: Kernel, b: Kernel) -> list[str]:
    what = []
    if a.text != b.text:
        what.append("sass" if len(a.text) == len(b.text) else "sass size")
    if a.relocs != b.relocs:
        what.append("relocations")
    if a.registers != b.registers:
        what.append(f"registers {a.registers} -> {b.registers}")
    if a.frame != b.frame:
        what.append(f"frame {a.frame} -> {b.frame}")
    if a.shared != b.shared:
        what.append(f"shared {a.shared} -> {b.shared}")
    if a.local != b.local:
        what.append(f"local {a.local} -> {b.local}")
    return what


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--filter", help="only kernels whose mangled name matches this regex")
    ap.add_argument("--all", action="store_true", help="also list the identical kernels")
    args = ap.parse_args(argv)
    try:
        ka, kb = kernels(args.a), kernels(args.b)
        flt = re.compile(args.filter) if args.filter else None
    except (OSError, ElfError, re.error) as e:
        print(f"cubin_diff: {e}", file=sys.stderr)
        return 2
    names = sorted(n for n in set(ka) | set(kb) if flt is None or flt.search(n))
    if not names:
        print("cubin_diff: no kernel to compare", file=sys.stderr)
        return 2
    pretty = demangle([(ka.get(n) or kb.get(n)).raw_name for n in names])
    differ = 0
    for n in names:
        a, b = ka.get(n), kb.get(n)
        if a is None or b is None:
            status, sizes = ("only in B", f"- / {len(b.text)}") if a is None else \
                ("only in A", f"{len(a.text)} / -")
        else:
            what = compare(a, b)
            status = "differs (" + ", ".join(what) + ")" if what else "same"
            sizes = f"{len(a.text)} / {len(b.text)}"
        if status != "same":
            differ += 1
        if status != "same" or args.all:
            print(f"{status:<28} {sizes:>17}  {pretty[(a or b).raw_name]}")
    print(f"cubin_diff: {len(names) - differ} of {len(names)} kernels identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
