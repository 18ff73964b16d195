#!/bin/bash
# On the GPU machine: builds worker-orcd and the GPU test binaries (Release, sm_90a) from the
# working tree, with the dependencies ci/gpu-carry.sh packed into .carry/deps.tar.gz.
#   ci/gpu-build.sh BUILD_DIR [TARGET ...]      (default targets: everything)
# Afterwards: export LD_LIBRARY_PATH="$(ci/gpu-build.sh --libdir)" to run the binaries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=/tmp/worker-deps
libdir=$deps/usr/lib/x86_64-linux-gnu
if [ "${1:-}" = --libdir ]; then echo "$libdir"; exit 0; fi
build=${1:?usage: ci/gpu-build.sh BUILD_DIR [TARGET ...]}
shift
# Unpacked once per machine; two builds started together (ci/gpu-ab.sh builds both trees at
# once) take turns through a mkdir lock, and each unpacks into its own folder that is renamed
# into place, so no build ever sees a half-written tree.
if [ ! -d "$deps/usr" ]; then
  for _ in $(seq 300); do mkdir /tmp/worker-deps.lock 2>/dev/null && break; sleep 1; done
  trap 'rmdir /tmp/worker-deps.lock 2>/dev/null' EXIT
  if [ ! -d "$deps/usr" ]; then
    mkdir -p "$deps" "$deps.part.$$"
    tar xzf "$root/.carry/deps.tar.gz" -C "$deps.part.$$"
    mv "$deps.part.$$/usr" "$deps/usr"
    rm -rf "$deps.part.$$"
  fi
  rmdir /tmp/worker-deps.lock
  trap - EXIT
fi
export LD_LIBRARY_PATH="$libdir:${LD_LIBRARY_PATH:-}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWORKER_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$libdir" \
  -DPKG_CONFIG_EXECUTABLE=/nonexistent -DWORKER_PYTHON="$(command -v python3)" \
  > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
if [ $# -gt 0 ]; then
  cmake --build "$build" -j "$(nproc)" --target "$@"
else
  cmake --build "$build" -j "$(nproc)"
fi
