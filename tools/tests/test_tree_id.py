#!/usr/bin/env python3
"""ci/tree-id.sh, the key under which ci/gpu-prebuild.sh packs a binary and ci/gpu-ab.sh looks it
up: the same tree gives the same id, any change to a source the build reads gives another, files
the build does not read (and __pycache__) do not count, and a variant's patch is part of its id.
A wrong id here would let a device call measure a binary of other code."""

import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

ROOT = Path(os.environ.get("WORKER_SOURCE_DIR", Path(__file__).resolve().parents[2]))


class TreeIdTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="worker-treeid-")
        self.tree = Path(self._tmp.name) / "tree"
        for d in ("cmake", "kernels", "worker/engine", "bench", "ci", "reports"):
            (self.tree / d).mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "ci" / "tree-id.sh", self.tree / "ci" / "tree-id.sh")
        files = {
            "CMakeLists.txt": "project(x)\n",
            "cmake/a.cmake": "set(A 1)\n",
            "kernels/k.cu": "__global__ void k() {}\n",
            "worker/engine/e.cpp": "int e() { return 1; }\n",
            "bench/b.py": "print(1)\n",
            "reports/notes.md": "notes\n",
        }
        for name, text in files.items():
            (self.tree / name).write_text(text)
        self.patch = Path(self._tmp.name) / "p.patch"
        self.patch.write_text("--- a/kernels/k.cu\n+++ b/kernels/k.cu\n")

    def tearDown(self):
        self._tmp.cleanup()

    def tid(self, *patches: Path) -> str:
        out = subprocess.run(["bash", str(self.tree / "ci" / "tree-id.sh"), *map(str, patches)],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        self.assertRegex(out, r"^[0-9a-f]{64}$")
        return out

    def test_same_tree_same_id(self):
        self.assertEqual(self.tid(), self.tid())

    def test_each_source_directory_counts(self):
        base = self.tid()
        for name in ("CMakeLists.txt", "cmake/a.cmake", "kernels/k.cu", "worker/engine/e.cpp",
                     "bench/b.py"):
            p = self.tree / name
            old = p.read_text()
            p.write_text(old + " ")
            self.assertNotEqual(self.tid(), base, name)
            p.write_text(old)
            self.assertEqual(self.tid(), base, name)

    def test_a_new_or_renamed_file_counts(self):
        base = self.tid()
        (self.tree / "kernels" / "new.cuh").write_text("")
        self.assertNotEqual(self.tid(), base)
        (self.tree / "kernels" / "new.cuh").unlink()
        (self.tree / "kernels" / "k.cu").rename(self.tree / "kernels" / "k2.cu")
        self.assertNotEqual(self.tid(), base)

    def test_what_the_build_does_not_read_does_not_count(self):
        base = self.tid()
        (self.tree / "reports" / "notes.md").write_text("other notes\n")
        cache = self.tree / "bench" / "__pycache__"
        cache.mkdir()
        (cache / "b.cpython-311.pyc").write_bytes(b"\x00\x01")
        (self.tree / "bench" / "c.pyc").write_bytes(b"\x02")
        self.assertEqual(self.tid(), base)

    def test_a_variants_patch_is_part_of_its_id(self):
        base = self.tid()
        with_patch = self.tid(self.patch)
        self.assertNotEqual(with_patch, base)
        self.patch.write_text(self.patch.read_text() + "@@ -1 +1 @@\n")
        self.assertNotEqual(self.tid(self.patch), with_patch)

    def test_the_id_does_not_depend_on_the_working_directory(self):
        a = self.tid()
        b = subprocess.run(["bash", "ci/tree-id.sh"], cwd=self.tree, capture_output=True,
                           text=True, timeout=60, check=True).stdout.strip()
        self.assertEqual(a, b)


if __name__ == "__main__":
    unittest.main()
