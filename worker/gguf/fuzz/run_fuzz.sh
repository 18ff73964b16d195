#!/bin/sh
# run_fuzz.sh FUZZER SECONDS CORPUS_DIR: seeds the corpus with small real GGUF files, then
# fuzzes for SECONDS. libFuzzer exits non-zero on any crash or sanitizer report.
set -eu
fuzzer=$1 seconds=$2 corpus=$3
src=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$corpus"
shared=${WORKER_SHARED_FIXTURES:-$src/../shared/fixtures}
gen=${WORKER_GENERATED_FIXTURES:-$src/fixtures/generated}
for f in "$shared/stories260K.gguf" "$gen"/llama-g1-q4_0.gguf "$gen"/qwen2-g1-q4_k.gguf; do
  [ -f "$f" ] && cp -f "$f" "$corpus/"
done
exec "$fuzzer" -max_total_time="$seconds" -max_len=1048576 -rss_limit_mb=2048 -timeout=10 "$corpus"
