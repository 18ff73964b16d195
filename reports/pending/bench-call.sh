#!/bin/bash
# The same-call bench (issue 14's figures against llama.cpp) of main, for a session with device
# time to spare after ncu-call.sh. Here first: llama-bench built with ../shared/peer/build-peer.sh
# and xz-compressed into build-peer-xz/llama-bench.xz (ignored; 41 MB; session 44 made one), and
# .carry from ci/gpu-carry.sh. The call carries
#   [".carry", ".deps/llama.cpp/models/ggml-vocab-qwen2.gguf", "build-peer-xz"]
# and runs `BENCH_COMMIT=$(git rev-parse --short HEAD) bash reports/pending/bench-call.sh` with
# the commit filled in here (the device's .git may be stale). ~250 s: the build (~90 s), the
# 0.5B files, bench/run.sh --llamacpp (llama-bench twice, this worker exact and fast, HTTP).
set -eo pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
mkdir -p build-peer-bin
if command -v xz > /dev/null; then xz -dc build-peer-xz/llama-bench.xz > build-peer-bin/llama-bench
else python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" \
  build-peer-xz/llama-bench.xz build-peer-bin/llama-bench; fi
chmod +x build-peer-bin/llama-bench
ci/gpu-build.sh /tmp/bench-build worker-orcd decode_bench kernel_bench > /tmp/bench-build.log 2>&1 ||
  { tail -20 /tmp/bench-build.log; exit 1; }
LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir); export LD_LIBRARY_PATH
WORKER_GENERATED_FIXTURES=/tmp/ab-fixtures bench/run.sh --out "$OUT" --llamacpp --build-dir /tmp/bench-build 2>&1 |
  tail -60
