#!/bin/bash
# The device call these patches wait for (perf-notes v46). On the GPU machine, from the repo root,
# with trace-scores-out.patch applied to the working tree (git apply) and .carry made by
# ci/gpu-carry.sh: new = the tree (the step's trace point 20: an attention block's own scores out,
# before the exchange), p1 = + score-two-threads.patch (two threads a key for the staged scores);
# decode A/B on the three 0.5B files, both steps' traces with the exchange split (steptrace
# --heads), then p1's bitwise checks (attention_exact_tests; cuda_engine_tests' ExactParity in
# both cache modes, DecodeStepTrace, Stories260K on the small fixtures).
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
(WORKER_GENERATED_FIXTURES=/tmp/gen sh fixtures/generate_all.sh > /tmp/gen-small.log 2>&1; echo "rc $?" >> /tmp/gen-small.log) &
timeout 300 ci/gpu-ab.sh --no-prev --reps 1 --patch reports/pending/score-two-threads.patch \
  --trace f16,q8_0 --heads 14 --targets "cuda_engine_tests attention_exact_tests" 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | tee "$OUT/ab.log"
wait
tail -1 /tmp/gen-small.log
LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir); export LD_LIBRARY_PATH
for b in p1; do
  AT=$(find /tmp/ab-$b -name attention_exact_tests -type f -perm -u+x | head -1)
  CE=$(find /tmp/ab-$b -name cuda_engine_tests -type f -perm -u+x | head -1)
  WORKER_GENERATED_FIXTURES=/tmp/gen timeout 60 "$AT" > "$OUT/$b-at.log" 2>&1
  echo "$b attention_exact rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$b-at.log" | tr '\n' ' ')"
  WORKER_GENERATED_FIXTURES=/tmp/gen timeout 120 "$CE" \
    --gtest_filter='CudaEngine.ExactParity*:CudaEngine.DecodeStepTrace*:CudaEngine.Stories*' > "$OUT/$b-ce.log" 2>&1
  echo "$b cuda_engine rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$b-ce.log" | tr '\n' ' ')"
  grep -E "Failure|differ" -A3 "$OUT/$b-ce.log" | head -20
done
