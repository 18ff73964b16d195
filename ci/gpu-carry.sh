#!/bin/bash
# Packs what the GPU machine lacks for a build of worker-orcd and its tests (it has nvcc,
# cuBLAS, CMake and ninja, but none of the Debian development packages): the headers, static
# test libraries, cpp-httplib's shared library and its brotli dependencies, and the CMake
# package files, into .carry/deps.tar.gz (ignored by git; name `.carry` in the device call's
# carry list). ci/gpu-build.sh unpacks and uses it there. Also copies ../shared/fixtures into
# .carry/shared-fixtures (../shared does not travel; ci/gpu-run.sh and ci/gpu-ab.sh use the
# copy there), and with --prev COMMIT packs that commit's tree into .carry/prev.tar.gz for
# ci/gpu-ab.sh's same-call A/B.
#   ci/gpu-carry.sh [--prev COMMIT]
# The device call then carries: [".carry", ".deps/llama.cpp/models/ggml-vocab-qwen2.gguf"]
# (the vocabulary fixtures/generate_all.sh builds the Qwen-shaped models from).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prev=""
while [ $# -gt 0 ]; do
  case $1 in
    --prev) prev=$2; shift ;;
    *) echo "usage: $0 [--prev COMMIT]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$root/.carry"
lib=usr/lib/x86_64-linux-gnu
(cd / && tar czf "$root/.carry/deps.tar.gz" \
  usr/include/nlohmann usr/include/gtest usr/include/gmock usr/include/httplib.h \
  usr/include/openssl usr/include/x86_64-linux-gnu/openssl usr/include/zlib.h usr/include/zconf.h \
  usr/include/brotli usr/share/cmake/nlohmann_json $lib/cmake/GTest \
  $lib/libgtest.a $lib/libgtest_main.a $lib/libgmock.a $lib/libgmock_main.a \
  $lib/libcpp-httplib.so* $lib/libbrotlicommon.so.1* $lib/libbrotlidec.so.1* $lib/libbrotlienc.so.1*)
echo "gpu-carry: $(du -h "$root/.carry/deps.tar.gz" | cut -f1) in .carry/deps.tar.gz"
shared=${WORKER_SHARED_FIXTURES:-$root/../shared/fixtures}
if [ -d "$shared" ]; then
  rm -rf "$root/.carry/shared-fixtures"
  cp -r "$shared" "$root/.carry/shared-fixtures"
  chmod -R u+w "$root/.carry/shared-fixtures"
  echo "gpu-carry: $shared copied to .carry/shared-fixtures"
else
  echo "gpu-carry: warning: $shared not found (stories260K: the engine tests and generate_all.sh need it)" >&2
fi
if [ -n "$prev" ]; then
  git -C "$root" archive --format=tar.gz -o "$root/.carry/prev.tar.gz" "$prev"
  git -C "$root" rev-parse --short "$prev" > "$root/.carry/prev-commit"
  echo "gpu-carry: $(cat "$root/.carry/prev-commit") packed into .carry/prev.tar.gz"
fi
git -C "$root" rev-parse --short HEAD > "$root/.carry/commit"
[ -f "$root/.deps/llama.cpp/models/ggml-vocab-qwen2.gguf" ] ||
  echo "gpu-carry: warning: .deps/llama.cpp/models/ggml-vocab-qwen2.gguf missing (run ci/setup.sh)" >&2
echo "gpu-carry: carry [\".carry\", \".deps/llama.cpp/models/ggml-vocab-qwen2.gguf\"]"
