#!/bin/bash
# The A/B of reports/pending/cluster-*.patch (perf-notes v45), one device call from the repo root
# after ci/gpu-carry.sh: main (new) against cluster-xchg (p1) and cluster-qkv (p2), a step trace
# of each on F16, p2 with WORKER_DECODE_STEP_CLUSTER=0, then p2's engine parity tests.
#   device call: bash reports/pending/cluster-ab.sh, carry [".carry", ".deps/llama.cpp/models/ggml-vocab-qwen2.gguf"]
t0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - t0) )); }
mkdir -p ../shared && ln -sfn "$PWD/.carry/shared-fixtures" ../shared/fixtures 2>/dev/null
(mkdir -p /tmp/gen && WORKER_GENERATED_FIXTURES=/tmp/gen sh fixtures/generate_all.sh > /tmp/gen.log 2>&1; echo "rc $?" >> /tmp/gen.log) &
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 400 ci/gpu-ab.sh --no-prev --reps 2 --patch reports/pending/cluster-xchg.patch --patch reports/pending/cluster-qkv.patch --trace f16 2>&1 | tail -120
export LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir)
F=/tmp/ab-fixtures
echo "== p1 trace header (blocks)"; python3 bench/steptrace.py /tmp/ab-trace-p2-f16.bin 2>&1 | head -3
for b in new p1 p2; do echo "-- $b"; python3 bench/steptrace.py /tmp/ab-trace-$b-f16.bin 2>&1 | grep -A8 "attention phases"; done
echo "== p2 with WORKER_DECODE_STEP_CLUSTER=0 ($(left) s left)"
WORKER_DECODE_STEP_CLUSTER=0 timeout 100 /tmp/ab-p2/bench/decode_bench --model $F/qwen2-0.5b-f16.gguf --model $F/qwen2-0.5b-q8_0.gguf --model $F/qwen2-0.5b-q4_k_m.gguf --prefill 512 --decode 256 --reps 2 --numerics exact 2>&1 | grep gguf
echo "== p2 tests ($(left) s left)"
if [ $(left) -gt 150 ]; then
  cd /tmp/ab-src-p2 && timeout 150 ci/gpu-build.sh /tmp/ab-p2 cuda_engine_tests attention_exact_tests > /tmp/tb.log 2>&1; tail -2 /tmp/tb.log
  wait; tail -1 /tmp/gen.log
  CE=$(find /tmp/ab-p2 -name cuda_engine_tests -type f | head -1)
  WORKER_GENERATED_FIXTURES=/tmp/gen WORKER_BIG_FIXTURES=$F timeout $(( $(left) - 5 )) "$CE" --gtest_filter='CudaEngine.ExactParityWith*:CudaEngine.ExactParityDecodeStepWithout*:CudaEngine.Stories*:CudaEngine.Persistent*:CudaEngine.DecodeCrossing*' 2>&1 | tee $OUT/ce.log | grep -E "^\[exact\].*models|OK \]|FAILED|PASSED|differ [1-9]|DIVERGED" | tail -30
fi
echo "== end $(( $(date +%s) - t0 )) s"
