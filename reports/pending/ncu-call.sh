#!/bin/bash
# The device call perf-notes v47 asks for: why did quantize-one-round.patch (down's input
# quantized in one round) slow every op of the layer (Q4_K_M -13%, Q8_0 -1.5%)? (a) instruction
# fetch (the step is 205-306 KB of SASS an instantiation) or (b) the register allocation moved.
# And norm-lean.patch (the norm's poll only stores; its sum of squares and kept rows read back
# after it: -10 KB of SASS in every step, the same floats by rms_mean_certain's bound): if (a),
# it is faster. p3 (hsum16-from8.patch, session 45) is the review's mend of v47's duplicated
# hsum16 levels: the same floats, other SASS in 8 of the 12 steps, so its own A/B. On the GPU
# machine, from the repo root, main's tree, .carry from ci/gpu-carry.sh; ~520 s with the builds
# prebuilt (call with timeout_s 590):
#   gpu-ab new (main) / p1 (one-round quantizers) / p2 (norm-lean) / p3 (hsum16-from8), F16,
#   Q8_0 and Q4_K_M, a Q8_0 trace; then ncu's stall reasons a issued instruction of one decode step, each build and
#   quantized model ("no_instruction" high in p1 and higher than in new, lower in p2: (a)); then
#   each build's SASS: instructions and local-memory ops of the steps (KvF16). p2 lands only
#   after ci/gpu-verify.sh on it (parity, memcheck, racecheck).
# Here first (saves the call ~110 s): ci/gpu-prebuild.sh --patch reports/pending/quantize-one-round.patch
#   --patch reports/pending/norm-lean.patch --patch reports/pending/hsum16-from8.patch
#   --patch reports/pending/quantize-noinline.patch
# (p4, quantize-noinline.patch: quantize_q8_0 one function, not four inlined copies: -14.7 to
# -15.6 KB of SASS in the 6 quantized steps, no spills; perf-notes v48.)
# Session 46: the one-round quantizers (known slower) left out: five prebuilt builds and the
# tree passed 64 MiB. p1 = norm-lean, p2 = hsum16-from8, p3 = quantize-noinline; ncu on new/p1/p3.
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
timeout 380 ci/gpu-ab.sh --no-prev --reps 1 --models f16,q8_0,q4_k_m --trace q8_0 \
  --patch reports/pending/norm-lean.patch \
  --patch reports/pending/hsum16-from8.patch --patch reports/pending/quantize-noinline.patch 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | grep -vE "^  (head|issue)" | tee "$OUT/ab.log"
LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir); export LD_LIBRARY_PATH
for b in new p1 p3; do
  for m in q4_k_m q8_0; do
    timeout 45 ncu --kernel-name regex:decode_step_kernel --launch-skip 8 --launch-count 1 \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum' \
      "/tmp/ab-$b/bench/decode_bench" --model "/tmp/ab-fixtures/qwen2-0.5b-$m.gguf" \
      --prefill 512 --decode 16 --reps 1 > "/tmp/ncu-$b-$m.log" 2>&1
    echo "== ncu $b $m rc=$?"
    if ! grep -qE "stalled_.*ratio" "/tmp/ncu-$b-$m.log"; then  # the regex form refused: the section
      tail -3 "/tmp/ncu-$b-$m.log"
      timeout 45 ncu --kernel-name regex:decode_step_kernel --launch-skip 8 --launch-count 1 \
        --section WarpStateStats --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
        "/tmp/ab-$b/bench/decode_bench" --model "/tmp/ab-fixtures/qwen2-0.5b-$m.gguf" \
        --prefill 512 --decode 16 --reps 1 > "/tmp/ncu-$b-$m.log" 2>&1
      grep -iE "stall|duration|inst_executed|cycles per issued" "/tmp/ncu-$b-$m.log" | head -24
      continue
    fi
    grep -E "stalled|duration|inst_executed" "/tmp/ncu-$b-$m.log" |
      awk '{print $NF, $1}' | sort -g -r | head -12
  done
done
for b in new p1 p3; do
  cuobjdump -sass "/tmp/ab-$b/bench/decode_bench" > "/tmp/sass-$b.txt" 2>&1  # prebuilt or not
  echo "== sass $b"
  awk '/Function :/{f=$3} /^ +\/\*[0-9a-f]+\*\// {n[f]++; if ($0 ~ /LDL|STL/) l[f]++}
       END {for (k in n) if (k ~ /decode_step_kernel/ && k ~ /KvF16/) print n[k], l[k] + 0, k}' \
    "/tmp/sass-$b.txt" | sed -E 's/_Z[0-9]+decode_step_kernelIL.*GgmlTypeE([0-9]+)E.*/type \1/'
done
