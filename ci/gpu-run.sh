#!/bin/bash
# Runs the GPU test suite (kernel tests under compute-sanitizer memcheck + racecheck, the
# CUDA engine tests) and, when the worker binary and conformance runner are given, the
# conformance suites with WORKER_BACKEND=cuda; then writes reports/gpu-<date>.md.
# Meant for the GPU machine; binaries are built elsewhere and passed in with --bin.
#
#   ci/gpu-run.sh --bin DIR [--results DIR] [--report FILE] [--no-sanitize] [--skip-fixtures]
#
# DIR holds kernel_tests, exact_{float,quant,ops}_tests, cuda_error_tests, cuda_engine_tests, cuda_trace_tests and optionally decode_bench, kernel_bench, worker-orcd and
# conformance runners (any executable named conformance_*; each runs with
# WORKER_BACKEND=cuda against $DIR/worker-orcd). BENCH_MODELS names the benchmark models. gtest XML goes to --results
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
# ../shared does not travel to the GPU machine: ci/gpu-carry.sh copies its fixtures into .carry.
if [ -z "${WORKER_SHARED_FIXTURES:-}" ] && [ ! -d "$root/../shared/fixtures" ] &&
  [ -d "$root/.carry/shared-fixtures" ]; then
  export WORKER_SHARED_FIXTURES="$root/.carry/shared-fixtures"
fi
export WORKER_GENERATED_FIXTURES=${WORKER_GENERATED_FIXTURES:-$root/fixtures/generated}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$results/device.txt" 2>&1 || true
say "device: $(cat "$results/device.txt")"

# The 0.5B-shaped fixtures (--big) are needed by the engine's VRAM acceptance test and the
# benchmark; generate_all.sh skips files already made by the same generator.
if [ $gen = 1 ] && ! ls "$WORKER_GENERATED_FIXTURES"/qwen2-0.5b-q4_k_m.gguf "$WORKER_GENERATED_FIXTURES"/llama-g1-f32.gguf > /dev/null 2>&1; then
  t0=$(date +%s)
  sh "$root/fixtures/generate_all.sh" >> "$log" 2>&1 || say "fixture generation FAILED"
  sh "$root/fixtures/generate_all.sh" --big >> "$log" 2>&1 || say "big fixture generation FAILED"
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
for t in exact_float_tests exact_quant_tests exact_ops_tests exact_fused_tests exact_qgemm_tests attention_exact_tests exact_decode_tests exact_qdecode_tests; do run_gtest $t; done  # bit for bit vs the CPU
run_gtest cuda_error_tests  # error mapping + the context teardown (M0-W-1401, 1501)
# The startup test of cuda_engine_tests runs the real worker: the copy beside the tests.
[ -x "$bin/worker-orcd" ] && export WORKER_ORCD_BIN="$bin/worker-orcd"
run_gtest cuda_engine_tests
run_gtest cuda_trace_tests  # worker-orcd trace: cpu vs cuda:exact identical op by op
if [ $sanitize = 1 ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    # racecheck instruments shared memory and is slow: the kernels that use shared
    # memory (reductions, attention merge, sampling), at the quick sizes.
    filter="*"
    [ $tool = racecheck ] && filter="KernelAttention.*:KernelSampling.*"
    if [ $tool = racecheck ]; then export WORKER_KERNEL_TEST_QUICK=1; else unset WORKER_KERNEL_TEST_QUICK; fi
    timeout ${SANITIZER_TIMEOUT:-600} compute-sanitizer --tool $tool --error-exitcode 3 \
      "$bin/kernel_tests" --gtest_filter="$filter" > "$results/sanitizer-$tool.log" 2>&1
    rc=$?
    # the exact kernels, every test, at their quick sizes (WORKER_KERNEL_TEST_QUICK)
    for t in exact_float_tests exact_quant_tests exact_ops_tests exact_fused_tests exact_qgemm_tests attention_exact_tests exact_decode_tests exact_qdecode_tests; do
      [ -x "$bin/$t" ] || continue
      # racecheck: not the model-shape checks and the 151936-row LM-head shapes (too slow
      # under it; the same kernels run there at the quick sizes)
      f="*"; [ $tool = racecheck ] && f="-*AtModelShapes:*LmHead*"
      WORKER_KERNEL_TEST_QUICK=1 timeout ${SANITIZER_TIMEOUT:-600} compute-sanitizer --tool $tool \
        --error-exitcode 3 "$bin/$t" --gtest_filter="$f" >> "$results/sanitizer-$tool.log" 2>&1 ||
        rc=$?
    done
    unset WORKER_KERNEL_TEST_QUICK
    [ $rc = 0 ] || status=1
    say "compute-sanitizer $tool: rc=$rc in $(( $(date +%s) - t0 )) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$results/sanitizer-$tool.log" | tr '\n' ' ')"
  done
fi

# Conformance suites against the real worker with the CUDA backend.
# WORKER_SLOW_MODEL / WORKER_EOS_MODEL / HAIKU_MODEL may point at carried model files.
if [ -x "$bin/worker-orcd" ]; then
  export WORKER_BACKEND=cuda WORKER_BIN="$bin/worker-orcd"
  # The GPU machine has no Node.js: the npm-client test reports "not run" there (only then).
  command -v node > /dev/null || export WORKER_HOST_HAS_NO_NODE=1
  export WORKER_RESULTS_DIR=${WORKER_RESULTS_DIR:-/tmp/conformance-artifacts}
  mkdir -p "$WORKER_RESULTS_DIR"
  # CONFORMANCE_SUITES: space-separated suite names to run (default: every one in DIR).
  for c in "$bin"/conformance_*; do
    [ -x "$c" ] || continue
    name=$(basename "$c")
    if [ -n "${CONFORMANCE_SUITES:-}" ] && ! echo " $CONFORMANCE_SUITES " | grep -q " $name "; then
      continue
    fi
    GPU_TEST_TIMEOUT=${CONFORMANCE_TIMEOUT:-300} run_gtest "$name"
  done
fi

# Decode benchmark on the models named in $BENCH_MODELS (space separated), if any.
# Default: the two 0.5B-shaped fixtures.
BENCH_MODELS=${BENCH_MODELS-$WORKER_GENERATED_FIXTURES/qwen2-0.5b-f16.gguf $WORKER_GENERATED_FIXTURES/qwen2-0.5b-q4_k_m.gguf}
if [ -x "$bin/decode_bench" ] && [ -n "${BENCH_MODELS:-}" ]; then
  args=""
  for m in $BENCH_MODELS; do [ -f "$m" ] && args="$args --model $m"; done
  if [ -n "$args" ]; then
    timeout ${BENCH_TIMEOUT:-300} "$bin/decode_bench" $args > "$results/decode_bench.txt" 2>&1 || say "decode_bench FAILED"
    cat "$results/decode_bench.txt" | tee -a "$log"
  fi
fi

# Kernel timings (the exact kernels' entry points at the 0.5B shapes), one JSON row per line.
if [ -x "$bin/kernel_bench" ]; then
  t0=$(date +%s)
  timeout ${BENCH_TIMEOUT:-300} "$bin/kernel_bench" --json > "$results/kernel_bench.jsonl" 2> "$results/kernel_bench.err" ||
    say "kernel_bench FAILED: $(tail -1 "$results/kernel_bench.err")"
  say "kernel_bench: $(wc -l < "$results/kernel_bench.jsonl") rows in $(( $(date +%s) - t0 )) s"
fi

# The committed report: commit, card, driver, per-suite counts, sanitizer summaries and
# results per requirement ID (from the "// REQ:" lines above each test).
commit=${GPU_RUN_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
python3 - "$results" "$report" "$root" "$commit" "$day" <<'PY' >> "$log" 2>&1 && say "report: $report" || say "report generation FAILED"
import glob, os, re, sys, xml.etree.ElementTree as ET
results, report, root, commit, day = sys.argv[1:6]
req = {}
for d in ("kernels/tests", "worker/cuda/tests", "conformance/suites", "conformance/haiku"):
    for f in glob.glob(os.path.join(root, d, "*.cpp")):
        pending = None
        for line in open(f, encoding="utf-8", errors="replace"):
            m = re.match(r"\s*//\s*REQ:(.*)", line)
            if m:
                pending = m.group(1).split()
                continue
            t = re.match(r"\s*TEST(?:_F|_P)?\((\w+),\s*(\w+)\)", line)
            if t and pending:
                req[f"{t.group(1)}.{t.group(2)}"] = pending
            if line.strip() and not line.strip().startswith("//"):
                pending = None
suites, per_req, failures = [], {}, []
for x in sorted(glob.glob(os.path.join(results, "*.xml"))):
    name = os.path.basename(x)[:-4]
    try:
        tree = ET.parse(x)
    except ET.ParseError:
        suites.append((name, 0, 0, 0, 0, "unparseable XML"))
        continue
    n = p = fl = sk = 0
    for tc in tree.iter("testcase"):
        full = f"{tc.get('classname')}.{tc.get('name')}"
        if tc.find("failure") is not None:
            st = "fail"; fl += 1
            failures.append((name, full, (tc.find("failure").get("message") or "")[:300]))
        elif tc.get("result") == "skipped" or tc.find("skipped") is not None or tc.get("status") == "notrun":
            st = "not run"; sk += 1
        else:
            st = "pass"; p += 1
        n += 1
        for rid in req.get(full, []):
            per_req.setdefault(rid, []).append((full, st))
    suites.append((name, n, p, fl, sk, ""))
dev = open(os.path.join(results, "device.txt")).read().strip() if os.path.exists(os.path.join(results, "device.txt")) else "unknown"
out = [f"# GPU run {day}", "",
       f"- commit: `{commit}`", f"- card, driver, memory: {dev}",
       "- produced by `ci/gpu-run.sh` on the device machine; gtest XML and logs under `reports/gpu-results/`", "",
       "## Suites", "", "| suite | tests | pass | fail | not run |", "|---|---|---|---|---|"]
for s_ in suites:
    out.append(f"| {s_[0]} | {s_[1]} | {s_[2]} | {s_[3]} | {s_[4]} |" + (f" {s_[5]}" if s_[5] else ""))
out += ["", "## compute-sanitizer (kernel tests)", ""]
for tool in ("memcheck", "racecheck"):
    f = os.path.join(results, f"sanitizer-{tool}.log")
    if os.path.exists(f):
        lines = [l.strip() for l in open(f, errors="replace") if "SUMMARY" in l or "[  PASSED" in l or "[  FAILED" in l]
        out.append(f"- {tool}: " + ("; ".join(lines) if lines else "no summary (timed out?)"))
out += ["", "## Results per requirement ID", "", "| ID | tests | pass | fail | not run |", "|---|---|---|---|---|"]
for rid in sorted(per_req):
    r = per_req[rid]
    out.append(f"| {rid} | {len(r)} | {sum(1 for _, s in r if s == 'pass')} | {sum(1 for _, s in r if s == 'fail')} | {sum(1 for _, s in r if s == 'not run')} |")
out += ["", "## Failures", ""]
out += [f"- `{s}` {t}: {m}" for s, t, m in failures] or ["none"]
bench = os.path.join(results, "decode_bench.txt")
if os.path.exists(bench):
    out += ["", "## decode_bench", "", "```", open(bench).read().rstrip(), "```"]
kb = os.path.join(results, "kernel_bench.jsonl")
if os.path.exists(kb):
    import json
    out += ["", "## kernel_bench (us per call in a CUDA graph; GB/s of weight / KV bytes)", "",
            "| op | type | shape | n_tok | us | GB/s | % of 3350 | TFLOP/s |", "|---|---|---|---|---|---|---|---|"]
    for line in open(kb):
        r = json.loads(line)
        out.append(f"| {r['op']} | {r['type']} | {r['shape']} | {r['n_tok']} | {r['us']:.2f} | {r['gbs'] if r['gbs'] is not None else '-'} | {r['pct_of_bw'] if r['pct_of_bw'] is not None else '-'} | {r['tflops'] if r['tflops'] is not None else '-'} |")
os.makedirs(os.path.dirname(os.path.abspath(report)), exist_ok=True)
open(report, "w").write("\n".join(out) + "\n")
PY
exit $status
