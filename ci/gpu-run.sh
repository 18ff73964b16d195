#!/bin/bash
# Runs the GPU test suite (kernel tests under compute-sanitizer memcheck + racecheck, the
# CUDA engine tests) and, when the worker binary and conformance runner are given, the
# conformance suites with WORKER_BACKEND=cuda; then writes reports/gpu-<date>.md.
# Meant for the GPU machine; binaries are built elsewhere and passed in with --bin.
#
#   ci/gpu-run.sh --bin DIR [--results DIR] [--report FILE] [--no-sanitize] [--skip-fixtures]
#
# DIR holds kernel_tests, cuda_engine_tests and optionally decode_bench, worker-orcd and
# conformance runners (any executable named conformance_*). gtest XML goes to --results
# (default reports/gpu-results). Fixtures: $WORKER_SHARED_FIXTURES (stories260K) and
# $WORKER_GENERATED_FIXTURES (generated here with fixtures/generate_all.sh when empty).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
bin="" results="$root/reports/gpu-results" report="" sanitize=1 gen=1
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift ;;
    --results) results=$2; shift ;;
    --report) report=$2; shift ;;
    --no-sanitize) sanitize=0 ;;
    --skip-fixtures) gen=0 ;;
    *) echo "usage: $0 --bin DIR [--results DIR] [--report FILE] [--no-sanitize] [--skip-fixtures]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$bin" ] || { echo "gpu-run.sh: --bin is required" >&2; exit 2; }
bin=$(cd "$bin" && pwd)
mkdir -p "$results"
day=$(date -u +%Y-%m-%d)
[ -n "$report" ] || report="$root/reports/gpu-$day.md"
log="$results/gpu-run.log"
: > "$log"
say() { echo "$*" | tee -a "$log"; }
export WORKER_SOURCE_DIR="$root"
export WORKER_GENERATED_FIXTURES=${WORKER_GENERATED_FIXTURES:-$root/fixtures/generated}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$results/device.txt" 2>&1 || true
say "device: $(cat "$results/device.txt")"

if [ $gen = 1 ] && ! ls "$WORKER_GENERATED_FIXTURES"/*.gguf > /dev/null 2>&1; then
  # generate_all.sh wants numpy in /usr/bin/python3; use whichever python has it.
  py=/usr/bin/python3
  $py -c 'import numpy' 2>/dev/null || py=$(command -v python3)
  sed "s|^py=/usr/bin/python3|py=$py|" "$root/fixtures/generate_all.sh" > "$root/fixtures/.generate_gpu.sh"
  t0=$(date +%s)
  sh "$root/fixtures/.generate_gpu.sh" >> "$log" 2>&1 || say "fixture generation FAILED"
  rm -f "$root/fixtures/.generate_gpu.sh"
  say "fixtures generated in $(( $(date +%s) - t0 )) s"
fi

status=0
run_gtest() {  # run_gtest NAME [extra args]
  local name=$1; shift
  [ -x "$bin/$name" ] || { say "$name: not built"; return; }
  local t0=$(date +%s)
  timeout ${GPU_TEST_TIMEOUT:-400} "$bin/$name" --gtest_output="xml:$results/$name.xml" "$@" > "$results/$name.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || status=1
  say "$name: rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$results/$name.log" | tr '\n' ' ')"
}
run_gtest kernel_tests
run_gtest cuda_engine_tests
if [ $sanitize = 1 ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    # racecheck instruments shared memory and is slow: the kernels that use shared
    # memory (reductions, attention merge, sampling), at the quick sizes.
    filter="*"
    [ $tool = racecheck ] && filter="KernelAttention.*:KernelRmsnorm.*:KernelSampling.*:KernelRope.*:KernelSwiglu.*"
    if [ $tool = racecheck ]; then export WORKER_KERNEL_TEST_QUICK=1; else unset WORKER_KERNEL_TEST_QUICK; fi
    timeout ${SANITIZER_TIMEOUT:-300} compute-sanitizer --tool $tool --error-exitcode 3 \
      "$bin/kernel_tests" --gtest_filter="$filter" > "$results/sanitizer-$tool.log" 2>&1
    rc=$?
    unset WORKER_KERNEL_TEST_QUICK
    [ $rc = 0 ] || status=1
    say "compute-sanitizer $tool: rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$results/sanitizer-$tool.log" | tr '\n' ' ')"
  done
fi

# Conformance suites against the real worker with the CUDA backend.
if [ -x "$bin/worker-orcd" ]; then
  export WORKER_BACKEND=cuda WORKER_BIN="$bin/worker-orcd"
  for c in "$bin"/conformance_*; do
    [ -x "$c" ] || continue
    run_gtest "$(basename "$c")"
  done
fi

if [ -f "$root/tools/gpu_report.py" ]; then
  python3 "$root/tools/gpu_report.py" --results "$results" --out "$report" --root "$root" >> "$log" 2>&1 \
    && say "report: $report" || say "report generation FAILED"
fi
exit $status
