#!/bin/bash
# ab-verify.sh cut to ~420 s for a call with little device time left: the A/B of main against
# norm-lean + hsum16-from8 (p1) on F16 / Q8_0 / Q4_K_M, then ci/gpu-verify.sh on p1's tree
# with what is left (tests first, then memcheck, then racecheck).
# Here first: ci/gpu-prebuild.sh --patch reports/pending/norm-lean+hsum16.patch
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
t0=$(date +%s)
timeout 230 ci/gpu-ab.sh --no-prev --reps 1 --models f16,q8_0,q4_k_m \
  --patch reports/pending/norm-lean+hsum16.patch 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | grep -vE "^  (head|issue)" | tee "$OUT/ab.log"
left=$(( ${BUDGET:-420} - ($(date +%s) - t0) ))
echo "== verify p1 (budget ${left}s)"
cd /tmp/ab-src-p1 && ci/gpu-verify.sh --build /tmp/ab-p1 --budget "$left" 2>&1 | tail -40
