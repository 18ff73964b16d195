#!/bin/bash
# On the GPU machine, one call: the checks a decode-step or decode-attention change needs before
# it is committed (perf-notes v31), on the working tree. Builds decode_bench and the six GPU test
# binaries that cover the decode path (Release, sm_90a; kept in BUILD_DIR between calls), then:
#   tests      attention_exact_tests, exact_decode_tests, cuda_trace_tests, kernel_tests'
#              KernelSampling (the sample kernels and the next step's io they write),
#              exact_qdecode_tests' GPU cases (matvec1_quant's per-op rows, long rows included:
#              qd::long_row_dots is the persistent step's K-quant down too); cuda_engine_tests'
#              ExactParity (both caches), PerOp, DecodeCrossing, DecodeStepTrace, FastNumerics,
#              SampleAndContinue, Stories260K, Persistent* and GpuSampling* on the small
#              fixtures, Qwen05B on the big ones
#   memcheck   decode_bench prefill 300 on qwen2-g7-f16 / -q8_0 / -q4_k and llama-g7-q6_k (the
#              persistent step on every weight family), attention_exact_tests' RoPE / AttendAct /
#              OddHead cases
#   racecheck  decode_bench qwen2-g7-q8_0 prefill 300 and qwen2-g7-f16 prefill 40,
#              AttentionExactGpu/F16.AttendAct (the per-op kernel's split mode)
# and prints one line a check (the gtest summary, the sanitizer's summary). The racecheck runs
# go last and share what is left of the call's time (--budget, seconds, 570 by default); a check
# cut by it says so instead of printing a summary, so it counts as not run.
#   ci/gpu-verify.sh [--build DIR] [--budget S] [--only tests|memcheck|racecheck]
# Fixtures: $WORKER_GENERATED_FIXTURES (small; default /tmp/gen) and $WORKER_BIG_FIXTURES
# (default /tmp/ab-fixtures), generated when missing; stories260K from ../shared or .carry.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=/tmp/ab-new budget=570 only=""
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift ;;
    --budget) budget=$2; shift ;;
    --only) only=$2; shift ;;
    *) echo "usage: $0 [--build DIR] [--budget S] [--only tests|memcheck|racecheck]" >&2; exit 2 ;;
  esac
  shift
done
cd "$root" || exit 2
t0=$(date +%s)
say() { echo "[gpu-verify +$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
if [ -z "${WORKER_SHARED_FIXTURES:-}" ]; then
  if [ -d "$root/../shared/fixtures" ]; then export WORKER_SHARED_FIXTURES=$root/../shared/fixtures
  else export WORKER_SHARED_FIXTURES=$root/.carry/shared-fixtures; fi
fi
small=${WORKER_GENERATED_FIXTURES:-/tmp/gen} big=${WORKER_BIG_FIXTURES:-/tmp/ab-fixtures}
mkdir -p "$small" "$big"
[ -f "$small/qwen2-g7-f16.gguf" ] ||
  (WORKER_GENERATED_FIXTURES=$small sh fixtures/generate_all.sh > /tmp/gv-gen-small.log 2>&1) &
[ -f "$big/qwen2-0.5b-f16.gguf" ] ||
  (WORKER_GENERATED_FIXTURES=$big sh fixtures/generate_all.sh --big > /tmp/gv-gen-big.log 2>&1) &
if ! ci/gpu-build.sh "$build" decode_bench cuda_engine_tests attention_exact_tests \
  exact_decode_tests cuda_trace_tests kernel_tests exact_qdecode_tests > /tmp/gv-build.log 2>&1; then
  say "FAILED: the build"; grep -E "error|FAILED" /tmp/gv-build.log | head -20; exit 1
fi
wait
say "built $(cat .carry/commit 2>/dev/null || echo '?') (+ working tree) in $build; fixtures ready"
LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir)
export LD_LIBRARY_PATH
bin() { find "$build" -name "$1" -type f -perm -u+x | head -1; }
DB=$(bin decode_bench) AT=$(bin attention_exact_tests) CE=$(bin cuda_engine_tests)
fail=0
gtest() {  # name timeout binary [args]: one line with gtest's summary
  local name=$1 t=$2; shift 2
  WORKER_GENERATED_FIXTURES=${GV_FIXTURES:-$small} timeout "$t" "$@" > /tmp/gv-$name.log 2>&1
  local rc=$?
  say "$name rc=$rc $(grep -E '^\[  (PASSED|FAILED)' /tmp/gv-$name.log | tr '\n' ' ')"
  if [ $rc != 0 ]; then fail=1; grep -E "^\[  FAILED|Failure" -A3 /tmp/gv-$name.log | head -12; fi
}
if [ -z "$only" ] || [ "$only" = tests ]; then
  gtest attention_exact 120 "$AT"
  gtest exact_decode 120 "$(bin exact_decode_tests)"
  gtest cuda_trace 120 "$(bin cuda_trace_tests)"
  gtest kernel_sampling 60 "$(bin kernel_tests)" --gtest_filter='KernelSampling.*'
  gtest exact_qdecode 120 "$(bin exact_qdecode_tests)" --gtest_filter='ExactQDecodeGpu.*'
  gtest cuda_engine 240 "$CE" --gtest_filter='CudaEngine.ExactParity*:CudaEngine.Decode*:CudaEngine.FastNumerics*:CudaEngine.SampleAndContinue*:CudaEngine.Stories*:CudaEngine.Persistent*:CudaEngine.GpuSampling*'
  GV_FIXTURES=$big gtest qwen05b 90 "$CE" --gtest_filter='CudaEngine.Qwen05B*'
fi
sanitize() {  # tool name timeout binary [args]: one line with the sanitizer's summary
  local tool=$1 name=$2 t=$3; shift 3
  local l; l=$(left)
  [ "$l" -lt "$t" ] && t=$l
  if [ "$t" -lt 20 ]; then say "$tool $name: NOT RUN (no time left in the budget)"; fail=1; return; fi
  WORKER_GENERATED_FIXTURES=$small WORKER_KERNEL_TEST_QUICK=1 timeout "$t" \
    compute-sanitizer --tool "$tool" "$@" > /tmp/gv-$tool-$name.log 2>&1
  local rc=$? sum
  sum=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/gv-$tool-$name.log | tail -1)
  if [ $rc = 124 ] || [ -z "$sum" ]; then
    say "$tool $name: CUT after ${t}s (no summary: not checked)"; fail=1
  else
    local path; path=$(grep -o '"path":"[a-z_-]*"' /tmp/gv-$tool-$name.log | cut -d'"' -f4 | sort -u | tr '\n' ' ')
    say "$tool $name rc=$rc $sum${path:+ (decode step: ${path% })}"
    case $sum in *" 0 errors"*|*" 0 hazards"*) [ $rc = 0 ] || fail=1 ;; *) fail=1 ;; esac
  fi
}
if [ -z "$only" ] || [ "$only" = memcheck ]; then
  for m in qwen2-g7-f16 qwen2-g7-q8_0 qwen2-g7-q4_k llama-g7-q6_k; do
    sanitize memcheck "$m" 90 "$DB" --model "$small/$m.gguf" --prefill 300 --decode 4 --reps 1 --graph off
  done
  sanitize memcheck attention 120 "$AT" \
    --gtest_filter='AttentionExactGpu*Rope*:AttentionExactGpu*AttendAct*:AttentionExactGpu*OddHead*'
fi
if [ -z "$only" ] || [ "$only" = racecheck ]; then
  sanitize racecheck qwen2-g7-q8_0 120 "$DB" --model "$small/qwen2-g7-q8_0.gguf" --prefill 300 --decode 2 --reps 1 --graph off
  sanitize racecheck qwen2-g7-f16 90 "$DB" --model "$small/qwen2-g7-f16.gguf" --prefill 40 --decode 2 --reps 1 --graph off
  sanitize racecheck attention-f16-attendact 180 "$AT" --gtest_filter='AttentionExactGpu/F16.AttendAct*'
fi
if [ $fail = 0 ]; then say "ALL PASSED"; else say "SOMETHING FAILED OR WAS NOT RUN (above)"; fi
exit $fail
