#!/bin/sh
# run_fuzz.sh FUZZER SECONDS CORPUS_DIR: seeds the corpus with small valid models (made by
# fixtures/gen_model.py: one llama/SPM and one qwen2/BPE, a few tens of KB, so each run is
# fast) and fuzzes for SECONDS. libFuzzer exits non-zero on any crash, leak, sanitizer
# report or timeout.
set -eu
fuzzer=$1 seconds=$2 corpus=$3
src=$(cd "$(dirname "$0")/../../.." && pwd)
shared=${WORKER_SHARED_FIXTURES:-$src/../shared/fixtures}
mkdir -p "$corpus"
gen="/usr/bin/python3 $src/fixtures/gen_model.py --n-embd 32 --n-head 2 --n-head-kv 1 --n-ff 64 --n-layer 1 --seed 1"
[ -f "$corpus/seed-llama.gguf" ] ||
  $gen --arch llama --type q8_0 --vocab "$shared/stories260K.gguf" --out "$corpus/seed-llama.gguf"
[ -f "$corpus/seed-qwen2.gguf" ] ||
  $gen --arch qwen2 --type q4_0 --vocab "$src/.deps/llama.cpp/models/ggml-vocab-qwen2.gguf" \
    --vocab-limit 200 --out "$corpus/seed-qwen2.gguf"
exec "$fuzzer" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 "$corpus"
