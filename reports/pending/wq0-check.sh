#!/bin/bash
# On the GPU machine, two calls: reports/pending/wq0.patch (the Q0 tensor-core
# tile on wgmma, written in session 33 without a device: compiled for sm_90a + compute_90, no
# spills, 112-117 registers for <32, 4>, 183-194 for <64, 2>; NOT RUN) against the working tree:
#   1. ci/gpu-ab.sh --no-prev --patch wq0.patch on q8_0 / q4_k_m (decode_bench prompt 512 and
#      decode; the logits hashes must equal new's), building exact_qgemm_tests and kernel_bench too
#   2. the patched exact_qgemm_tests: WgmmaProbe (one wgmma against the host product; on failure
#      it says whether the descriptor's strides swapped would be right) and TensorCore* (the tile
#      bitwise against the dp4a tile and the CPU reference on every shape), with the default tile
#      <32, 4> and (the quick shape set) with WORKER_WQ0_N=64 (<64, 2>)
#   3. kernel_bench --type Q8_0 --n-tok 512, new and patched, both tiles (a layer's products, us),
#      and the patched decode_bench with WORKER_WQ0_N=64 (its prompt 512 beside gpu-ab's lines)
#   4. compute-sanitizer memcheck and racecheck on the patched TensorCore* test (quick set), both
#      tiles
# Run (two calls: 1-3 take ~7-9 min cold, 4 ~4 min on the warm machine, whose builds it reuses):
#   cp reports/pending/wq0.patch .carry/ && bash reports/pending/wq0-check.sh ab > $OUT/wq0.txt 2>&1
#   bash reports/pending/wq0-check.sh san > $OUT/wq0-san.txt 2>&1
# Carry [".carry", ".deps/llama.cpp/models/ggml-vocab-qwen2.gguf"] (ci/gpu-carry.sh first).
set -uo pipefail
phase=${1:-ab}  # ab: steps 1-3; san: step 4
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
patch=$root/.carry/wq0.patch
[ -f "$patch" ] || { echo "wq0-check: $patch missing (cp reports/pending/wq0.patch .carry/)"; exit 2; }
t0=$(date +%s)
say() { echo "[wq0 +$(( $(date +%s) - t0 ))s] $*"; }
[ "$phase" = ab ] && ci/gpu-ab.sh --no-prev --reps 2 --models q8_0,q4_k_m --targets "exact_qgemm_tests kernel_bench" \
  --patch "$patch" 2>&1 | tail -25
export LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir)
bin() { find "$1" -name "$2" -type f -perm -u+x | head -1; }
QN=$(bin /tmp/ab-new exact_qgemm_tests) QP=$(bin /tmp/ab-p1 exact_qgemm_tests)
KN=$(bin /tmp/ab-new kernel_bench) KP=$(bin /tmp/ab-p1 kernel_bench)
[ -n "$QP" ] || { say "FAILED: no patched exact_qgemm_tests (the build: /tmp/ab-p1.log)"; grep -E 'error' /tmp/ab-p1.log | head; exit 1; }
if [ "$phase" = ab ]; then
say "tests (patched, <32, 4>)"
timeout 200 "$QP" --gtest_filter='*WgmmaProbe*:*TensorCore*:ExactQgemmHost.Wq0*' 2>&1 |
  grep -E '^\[  |Failure|differ|want|FAIL|mismatch' | head -30
say "tests (patched, WORKER_WQ0_N=64: <64, 2>, the quick shape set)"
WORKER_WQ0_N=64 WORKER_KERNEL_TEST_QUICK=1 timeout 120 "$QP" --gtest_filter='*TensorCore*' 2>&1 |
  grep -E '^\[  |Failure|differ|want|FAIL|mismatch' | head -30
say "kernel_bench Q8_0 512 (new, patched 32, patched 64, new, patched 32, patched 64)"
for r in 1 2; do
  [ -n "$KN" ] && timeout 60 "$KN" --type Q8_0 --n-tok 512 2>&1 | tail -8
  for n in 32 64; do
    [ -n "$KP" ] && WORKER_WQ0_N=$n timeout 60 "$KP" --type Q8_0 --n-tok 512 2>&1 | tail -8
  done
done
say "decode_bench (patched, WORKER_WQ0_N=64): compare with gpu-ab's p1 lines"
G=${WORKER_GENERATED_FIXTURES:-/tmp/ab-fixtures}
WORKER_WQ0_N=64 timeout 150 /tmp/ab-p1/bench/decode_bench --model "$G/qwen2-0.5b-q8_0.gguf" \
  --model "$G/qwen2-0.5b-q4_k_m.gguf" --prefill 512 --decode 256 --reps 2 --numerics exact 2>&1 |
  awk '/\.gguf/ {print "p1-64", $1, "decode", $4, "prompt", $8, "hash", $11}'
fi
[ "$phase" = san ] && for n in 32 64; do
  say "memcheck (patched, quick, WORKER_WQ0_N=$n)"
  WORKER_WQ0_N=$n WORKER_KERNEL_TEST_QUICK=1 timeout 100 compute-sanitizer --tool memcheck "$QP" \
    --gtest_filter='*WgmmaProbe*:*TensorCore*' 2>&1 | grep -E 'ERROR SUMMARY|PASSED|FAILED' | head
  say "racecheck (patched, quick, WORKER_WQ0_N=$n)"
  WORKER_WQ0_N=$n WORKER_KERNEL_TEST_QUICK=1 timeout 120 compute-sanitizer --tool racecheck "$QP" \
    --gtest_filter='*TensorCore*' 2>&1 | grep -E 'RACECHECK SUMMARY|PASSED|FAILED' | head
done
say "done"
