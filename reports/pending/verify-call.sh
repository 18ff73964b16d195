#!/bin/bash
# Session 46's second device call: quantize_q8_0 as a call in the Q8_0 step only (p1,
# q8-noinline.patch; the first call measured the all-types version at Q8_0 +2.1%, Q4_K_M -2.5%)
# and the same with hsum16-from8 (p2, the review's mend, neutral alone), A/B against main on
# F16 / Q8_0 / Q4_K_M; then ci/gpu-verify.sh on p2's tree with what is left of the call.
# Here first: ci/gpu-prebuild.sh --patch reports/pending/q8-noinline.patch
#   --patch reports/pending/q8-noinline+hsum16.patch            (call with timeout_s 595; CALL_S=S for a shorter call)
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
t0=$(date +%s)
timeout 200 ci/gpu-ab.sh --no-prev --reps 1 --models f16,q8_0,q4_k_m \
  --patch reports/pending/q8-noinline.patch --patch reports/pending/q8-noinline+hsum16.patch 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | grep -vE "^  (head|issue)" | tee "$OUT/ab.log"
for b in new p1 p2; do  # SASS instructions of each KvF16 step (call 1: new Q8_0 13,848, all-types noinline 12,880)
  cuobjdump -sass "/tmp/ab-$b/bench/decode_bench" 2>/dev/null |
    awk '/Function :/{f=$3} /^ +\/\*[0-9a-f]+\*\// {n[f]++} END {for (k in n) if (k ~ /decode_step_kernel/ && k ~ /KvF16/) print n[k], k}' |
    sed -E "s/^([0-9]+) .*GgmlTypeE([0-9]+)E.*/$b type \2: \1/" | sort
done
left=$(( ${CALL_S:-588} - ($(date +%s) - t0) ))
echo "== verify p2 (budget ${left}s)"
cd /tmp/ab-src-p2 && ci/gpu-verify.sh --build /tmp/ab-p2 --budget "$left" 2>&1 | tee "$OUT/verify.log" | tail -40
