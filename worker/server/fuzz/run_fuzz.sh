#!/bin/sh
# run_fuzz.sh FUZZER SECONDS CORPUS_DIR SEED_DIR: fuzzes for SECONDS, growing CORPUS_DIR from
# the committed seeds (read only). libFuzzer exits non-zero on any crash, leak, sanitizer
# report or timeout.
set -eu
fuzzer=$1 seconds=$2 corpus=$3 seeds=$4
mkdir -p "$corpus"
exec "$fuzzer" -max_total_time="$seconds" -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$corpus/../" "$corpus" "$seeds"
