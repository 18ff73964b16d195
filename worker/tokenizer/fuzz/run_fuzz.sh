#!/bin/sh
# run_fuzz.sh FUZZER SECONDS CORPUS_DIR [SEED_DIR]: fuzzes for SECONDS from a corpus seeded
# with SEED_DIR's files. libFuzzer exits non-zero on any crash or sanitizer report.
set -eu
fuzzer=$1 seconds=$2 corpus=$3
mkdir -p "$corpus"
if [ $# -ge 4 ] && [ -d "$4" ]; then cp -f "$4"/* "$corpus/"; fi
exec "$fuzzer" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=4096 -timeout=30 "$corpus"
