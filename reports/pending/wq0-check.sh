#!/bin/bash
# On the GPU machine, one call (~6-8 min cold): reports/pending/wq0.patch (the Q0 tensor-core
# tile on wgmma, written in session 33 without a device: compiled for sm_90a + compute_90, no
# spills, 116-119 registers; NOT RUN) against the working tree:
#   1. ci/gpu-ab.sh --no-prev --patch wq0.patch on q8_0 / q4_k_m (decode_bench prompt 512 and
#      decode; the logits hashes must equal new's), building exact_qgemm_tests and kernel_bench too
#   2. the patched exact_qgemm_tests: WgmmaProbe (one wgmma against the host product; on failure
#      it says whether the descriptor's strides swapped would be right) and TensorCore* (the tile
#      bitwise against the dp4a tile and the CPU reference on every shape)
#   3. kernel_bench --type Q8_0 --n-tok 512, new and patched (a layer's products, us)
#   4. compute-sanitizer memcheck and racecheck on the patched TensorCore* test (quick set)
# Run: cp reports/pending/wq0.patch .carry/ && bash reports/pending/wq0-check.sh > $OUT/wq0.txt 2>&1
# Carry [".carry", ".deps/llama.cpp/models/ggml-vocab-qwen2.gguf"] (ci/gpu-carry.sh first).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
patch=$root/.carry/wq0.patch
[ -f "$patch" ] || { echo "wq0-check: $patch missing (cp reports/pending/wq0.patch .carry/)"; exit 2; }
t0=$(date +%s)
say() { echo "[wq0 +$(( $(date +%s) - t0 ))s] $*"; }
ci/gpu-ab.sh --no-prev --reps 2 --models q8_0,q4_k_m --targets "exact_qgemm_tests kernel_bench" \
  --patch "$patch" 2>&1 | tail -25
export LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir)
bin() { find "$1" -name "$2" -type f -perm -u+x | head -1; }
QN=$(bin /tmp/ab-new exact_qgemm_tests) QP=$(bin /tmp/ab-p1 exact_qgemm_tests)
KN=$(bin /tmp/ab-new kernel_bench) KP=$(bin /tmp/ab-p1 kernel_bench)
[ -n "$QP" ] || { say "FAILED: no patched exact_qgemm_tests (the build: /tmp/ab-p1.log)"; grep -E 'error' /tmp/ab-p1.log | head; exit 1; }
say "tests (patched)"
timeout 240 "$QP" --gtest_filter='*WgmmaProbe*:*TensorCore*' 2>&1 | grep -E '^\[  |Failure|differ|want|FAIL|mismatch' | head -40
say "kernel_bench Q8_0 512 (new, patched, new, patched)"
for k in "$KN" "$KP" "$KN" "$KP"; do
  [ -n "$k" ] && timeout 60 "$k" --type Q8_0 --n-tok 512 2>&1 | tail -12
done
say "memcheck (patched, quick)"
WORKER_KERNEL_TEST_QUICK=1 timeout 120 compute-sanitizer --tool memcheck "$QP" \
  --gtest_filter='*WgmmaProbe*:*TensorCore*' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED' | head
say "racecheck (patched, quick)"
WORKER_KERNEL_TEST_QUICK=1 timeout 150 compute-sanitizer --tool racecheck "$QP" \
  --gtest_filter='*TensorCore*' 2>&1 | grep -E 'RACECHECK SUMMARY|PASSED|FAILED' | head
say "done"
