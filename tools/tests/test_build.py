#!/usr/bin/env python3
"""Checks of the build and of the layer boundaries, on the real repository:
- the CMake build configures CPU-only and (when nvcc + cuBLAS exist) with CUDA;
- the HTTP/host layer (worker/server) never touches CUDA and reaches the backends only through
  the engine interface."""

import os
import re
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

ROOT = Path(os.environ.get("WORKER_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def nvcc_present() -> bool:
    return Path("/usr/local/cuda/bin/nvcc").exists() or shutil.which("nvcc") is not None


def configure(build: Path, *args: str) -> subprocess.CompletedProcess:
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    return subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *gen, *args],
                          capture_output=True, text=True, timeout=600)


@unittest.skipUnless(shutil.which("cmake"), "cmake not installed")
class BuildConfigTest(unittest.TestCase):
    """Configure-only (a full build is what ci/test.sh does); each configure takes ~15 s."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="worker-cfg-")
        tmp = Path(cls._tmp.name)
        cls.off_dir, cls.auto_dir = tmp / "off", tmp / "auto"
        cls.off = configure(cls.off_dir, "-DWORKER_CUDA=OFF")
        cls.auto = configure(cls.auto_dir, "-DWORKER_CUDA=AUTO")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @staticmethod
    def ninja_text(build: Path) -> str:
        f = build / "build.ninja"
        return f.read_text(errors="replace") if f.exists() else ""

    # REQ: M0-W-1700 M0-W-1701
    def test_cpu_only_configure_has_no_cuda_targets(self):
        self.assertEqual(self.off.returncode, 0, self.off.stdout + self.off.stderr)
        self.assertIn("worker-orcd: CUDA backend OFF", self.off.stdout)
        ninja = self.ninja_text(self.off_dir)
        self.assertIn("worker-orcd", ninja)
        self.assertNotIn("libworker_cuda.a", ninja)
        self.assertNotIn("libworker_kernels.a", ninja)
        self.assertNotRegex(ninja, r"\bnvcc\b")

    # REQ: M0-W-1700 M0-W-1701
    def test_auto_configure_builds_cuda_exactly_when_the_toolkit_is_present(self):
        self.assertEqual(self.auto.returncode, 0, self.auto.stdout + self.auto.stderr)
        if nvcc_present():
            self.assertIn("worker-orcd: CUDA backend ON", self.auto.stdout)
            self.assertIn("libworker_cuda.a", self.ninja_text(self.auto_dir))
        else:
            self.assertIn("worker-orcd: CUDA backend OFF", self.auto.stdout)

    # REQ: M0-W-1702
    def test_cuda_build_settings(self):
        if "CUDA backend ON" not in self.auto.stdout:
            self.skipTest("not run: no CUDA toolkit (nvcc + cuBLAS) on this machine")
        self.assertRegex(self.auto.stdout, r"archs 90a-real;90-virtual")
        ninja = self.ninja_text(self.auto_dir)
        self.assertIn("libworker_kernels.a", ninja)  # static kernel + backend libraries
        self.assertIn("libworker_cuda.a", ninja)
        self.assertRegex(ninja, r"libcublas|-lcublas")
        self.assertRegex(ninja, r"libcudart|-lcudart")
        self.assertRegex(ninja, r"sm_90a|arch=compute_90a")
        self.assertRegex(ninja, r"compute_90\b|arch=compute_90,code=compute_90")
        cache = (self.auto_dir / "CMakeCache.txt").read_text(errors="replace")
        self.assertRegex(cache, r"WORKER_CUDA:STRING=AUTO")
        # C++20 host code, CUDA 17 device code.
        self.assertRegex(ninja, r"-std=(c|gnu)\+\+20")
        self.assertRegex(ninja, r"-std=(c|gnu)\+\+17")


# Direct CUDA use: runtime/driver/cuBLAS calls and headers, and the project's CUDA-side headers.
CUDA_CALL = re.compile(r"\b(cuda[A-Z]\w*|cublas[A-Z]\w*|cu[A-Z][a-z]\w*)\s*\(")
CUDA_INCLUDE = re.compile(r'#\s*include\s*[<"](cuda[^">]*|cublas[^">]*|kernels/[^">]*|'
                          r'cuda/[^">]*)[">]')
# Backend implementations the host layer must not reach around the Engine interface.
BACKEND_INCLUDE = re.compile(r'#\s*include\s*"(engine/cpu/[^"]*|cuda/[^"]*|kernels/[^"]*)"')


def host_sources():
    d = ROOT / "worker/server"
    return sorted(p for p in d.glob("*") if p.suffix in (".cpp", ".h", ".cc", ".hpp"))


def strip_comments_and_strings(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def cuda_uses(text: str) -> list[str]:
    found = [m.group(1) for m in CUDA_INCLUDE.finditer(text)]
    found += [m.group(1) for m in CUDA_CALL.finditer(strip_comments_and_strings(text))]
    return found


class HostLayerBoundaryTest(unittest.TestCase):
    def test_detector_finds_cuda_use(self):
        # The checks below are only as good as this detector: show it catches the real thing.
        self.assertEqual(cuda_uses('#include <cuda_runtime.h>\n'), ["cuda_runtime.h"])
        self.assertEqual(cuda_uses("void f(){ cudaMalloc(&p, 4); }"), ["cudaMalloc"])
        self.assertEqual(cuda_uses("x = cublasSgemm (h);"), ["cublasSgemm"])
        self.assertEqual(cuda_uses('log("cudaMalloc(failed)"); // cudaFree(p)\n'), [])
        self.assertTrue(BACKEND_INCLUDE.search('#include "engine/cpu/cpu_engine.h"'))

    # REQ: M0-W-1050 M0-SYS-2.5.1
    def test_server_sources_never_touch_cuda(self):
        files = host_sources()
        self.assertTrue(any(p.name == "http_server.cpp" for p in files) or files,
                        "worker/server has no sources")
        bad = {p.name: cuda_uses(p.read_text(errors="replace")) for p in files}
        self.assertEqual({k: v for k, v in bad.items() if v}, {})
        cmake = (ROOT / "worker/server/CMakeLists.txt").read_text()
        m = re.search(r"target_link_libraries\(\s*worker_server\b(.*?)\)", cmake, re.S)
        self.assertIsNotNone(m, "worker_server's link libraries not found")
        self.assertNotRegex(m.group(1), r"CUDA::|worker_cuda|worker_kernels")

    # REQ: M0-W-1052
    def test_server_reaches_backends_only_through_the_engine_interface(self):
        bad = {}
        for p in host_sources():
            hits = [m.group(1) for m in BACKEND_INCLUDE.finditer(p.read_text(errors="replace"))]
            if hits:
                bad[p.name] = hits
        self.assertEqual(bad, {})


CUDA_OWNERS = ("worker/cuda/", "kernels/", "bench/")
FORBIDDEN_MEMORY = re.compile(r"\b(cudaMallocManaged|cudaHostGetDevicePointer|cudaHostAllocMapped|"
                              r"cudaHostRegisterMapped|cudaMemAdvise|cudaMemPrefetchAsync)\b")


def project_sources():
    exts = (".cpp", ".h", ".cc", ".hpp", ".cu", ".cuh")
    for top in ("worker", "kernels", "bench", "conformance"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in exts and "/build" not in str(p):
                yield p


class CudaLayerOwnershipTest(unittest.TestCase):
    # REQ: M0-W-1051 M0-SYS-2.5.1
    def test_cuda_calls_live_only_in_the_cuda_backend_and_kernels(self):
        owners_with_calls = set()
        outside = {}
        for p in project_sources():
            rel = p.relative_to(ROOT).as_posix()
            text = p.read_text(errors="replace")
            # CUDA API calls and CUDA/cuBLAS system headers (the factory may name the cuda
            # backend's own header: that is the Engine boundary, not CUDA use).
            uses = [u for u in cuda_uses(text) if not u.startswith(("cuda/", "kernels/"))]
            if rel.startswith(CUDA_OWNERS):
                if uses:
                    owners_with_calls.add(rel.split("/")[0] + "/" + rel.split("/")[1])
            elif uses:
                outside[rel] = sorted(set(uses))[:5]
        self.assertEqual(outside, {}, "CUDA API used outside worker/cuda, kernels and bench")
        # The owning layer really does the device work: device selection, allocation, copies.
        cuda_text = "\n".join(p.read_text(errors="replace") for p in project_sources()
                              if p.relative_to(ROOT).as_posix().startswith(CUDA_OWNERS[:2]))
        for call in ("cudaSetDevice(", "cudaMalloc(", "cudaFree(", "cudaMemcpyAsync(",
                     "cudaPointerGetAttributes(", "cudaStreamCreate"):
            self.assertTrue(call in cuda_text, f"{call} not found in the CUDA layer")

    # REQ: M0-SYS-2.2.1 M0-W-1010
    def test_no_managed_or_mapped_host_memory_anywhere(self):
        bad = {}
        for p in project_sources():
            if "/tests/" in p.as_posix():
                continue  # tests allocate managed memory on purpose to prove the residency check
            hits = FORBIDDEN_MEMORY.findall(strip_comments_and_strings(p.read_text(errors="replace")))
            if hits:
                bad[p.relative_to(ROOT).as_posix()] = sorted(set(hits))
        self.assertEqual(bad, {})

REPRO_IDS = {"M0-W-1826", "M0-SYS-2.3.1", "WRK-D15"}


class ReadmeReproducibilityTest(unittest.TestCase):
    # REQ: M0-W-1040
    def test_readme_lists_models_with_existing_reproducibility_tests(self):
        import sys
        sys.path.insert(0, str(ROOT / "tools"))
        import reqcov
        text = (ROOT / "README.md").read_text()
        m = re.search(r"^## Reproducibility\n(.*?)(^## |\Z)", text, re.S | re.M)
        self.assertIsNotNone(m, "README has no '## Reproducibility' section")
        rows = [ln for ln in m.group(1).splitlines()
                if ln.startswith("| `") or ln.startswith("| generated")]
        self.assertGreaterEqual(len(rows), 1, "no model rows in the reproducibility table")
        declared = {t.full_name: set(t.ids) for t in reqcov.scan(ROOT).tests}
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            self.assertEqual(len(cells), 2, row)
            models = re.findall(r"`([^`]+\.gguf)`", cells[0])
            tests = re.findall(r"`([A-Za-z0-9_]+\.[A-Za-z0-9_]+)`", cells[1])
            self.assertTrue(models and tests, row)
            for t in tests:
                self.assertTrue(t in declared, f"README names {t}, which no test source defines")
                self.assertTrue(declared[t] & REPRO_IDS,
                                f"{t} does not declare a reproducibility requirement")
        # Every test that declares same-device reproducibility is listed somewhere.
        listed = set(re.findall(r"`([A-Za-z0-9_]+\.[A-Za-z0-9_]+)`", m.group(1)))
        for name, ids in declared.items():
            if "M0-W-1826" in ids:
                self.assertTrue(name in listed, f"{name} checks M0-W-1826 but README omits it")


if __name__ == "__main__":
    unittest.main()
