#!/bin/bash
# One device call when device time is short (session 45): the A/B of main against norm-lean
# (p1) and norm-lean + hsum16-from8 (p2) on F16 / Q8_0 / Q4_K_M, then ncu's stall reasons of
# one decode step for main and p1 on Q4_K_M (instruction fetch: "no_instruction"), then
# ci/gpu-verify.sh on p2's tree with what is left of the call. From the repo root on the GPU
# machine, .carry from ci/gpu-carry.sh; ~580 s.
# Here first: ci/gpu-prebuild.sh --patch reports/pending/norm-lean.patch
#   --patch reports/pending/norm-lean+hsum16.patch (the verify still builds p2's tests there)
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
t0=$(date +%s)
timeout 290 ci/gpu-ab.sh --no-prev --reps 1 --models f16,q8_0,q4_k_m \
  --patch reports/pending/norm-lean.patch --patch reports/pending/norm-lean+hsum16.patch 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | grep -vE "^  (head|issue)" | tee "$OUT/ab.log"
LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir); export LD_LIBRARY_PATH
for b in new p1; do
  timeout 40 ncu --kernel-name regex:decode_step_kernel --launch-skip 8 --launch-count 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum' \
    "/tmp/ab-$b/bench/decode_bench" --model /tmp/ab-fixtures/qwen2-0.5b-q4_k_m.gguf \
    --prefill 512 --decode 16 --reps 1 > "/tmp/ncu-$b.log" 2>&1
  echo "== ncu $b q4_k_m rc=$?"
  grep -E "stalled|duration|inst_executed" "/tmp/ncu-$b.log" | awk '{print $NF, $1}' | sort -g -r | head -10
  grep -iE "error|==ERR" "/tmp/ncu-$b.log" | head -3
done
left=$(( 585 - ($(date +%s) - t0) ))
echo "== verify p2 (budget ${left}s)"
cd /tmp/ab-src-p2 && ci/gpu-verify.sh --build /tmp/ab-p2 --budget "$left" 2>&1 | tail -40
