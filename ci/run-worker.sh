#!/usr/bin/env bash
# The README's first command: set up, build the worker (Release) and run it on the default model.
#   ci/run-worker.sh [extra worker options]
# Environment: WORKER_MODEL (default fixtures/haiku/haiku-qwen2.gguf), WORKER_BACKEND (default:
# cuda when nvidia-smi sees a GPU and the build has CUDA, else cpu), WORKER_PORT (default 8080).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ci/setup.sh
BUILD=build-release
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; echo "run-worker: cmake configure failed" >&2; exit 1; }
echo "run-worker: building worker-orcd (first time: a few minutes)"
if ! cmake --build "$BUILD" -j "$(nproc)" --target worker-orcd >"$BUILD.build.log" 2>&1; then
  grep -E -A12 "^FAILED:|error:" "$BUILD.build.log" | head -80
  echo "run-worker: build failed (full log: $BUILD.build.log)" >&2
  exit 1
fi

MODEL="${WORKER_MODEL:-fixtures/haiku/haiku-qwen2.gguf}"
if [[ ! -f "$MODEL" ]]; then
  FALLBACK="${WORKER_SHARED_FIXTURES:-$ROOT/../shared/fixtures}/stories260K.gguf"
  echo "run-worker: note: $MODEL not found; using $FALLBACK instead"
  MODEL="$FALLBACK"
fi
if [[ -z "${WORKER_BACKEND:-}" ]]; then
  WORKER_BACKEND=cpu
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU' &&
    [[ -d "$BUILD/worker/cuda" ]]; then
    WORKER_BACKEND=cuda
  fi
fi
echo "run-worker: backend $WORKER_BACKEND, model $MODEL, port ${WORKER_PORT:-8080}"
exec "$BUILD/worker/server/worker-orcd" --model "$MODEL" --backend "$WORKER_BACKEND" \
  --port "${WORKER_PORT:-8080}" "$@"
