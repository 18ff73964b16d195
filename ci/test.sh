#!/usr/bin/env bash
# The README's test command: set up, build (warnings are errors; CUDA when nvcc is present),
# generate the model fixtures, run every test, write the requirement-coverage report and apply
# its gate. WORKER_COVERAGE=1 adds an lcov coverage build of the CPU path (slower);
# WORKER_CUDA=OFF forces a CPU-only build (default AUTO: CUDA when nvcc + cuBLAS are found).
# Exit status: non-zero when setup, the build, any test or the requirement gate fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
START=$SECONDS
JOBS="${JOBS:-$(nproc)}"
export CTEST_PARALLEL_LEVEL="${CTEST_PARALLEL_LEVEL:-$JOBS}"
export WORKER_SHARED_FIXTURES="${WORKER_SHARED_FIXTURES:-$ROOT/../shared/fixtures}"
export WORKER_GENERATED_FIXTURES="${WORKER_GENERATED_FIXTURES:-$ROOT/fixtures/generated}"
step() { echo "== test.sh [$((SECONDS - START))s] $*"; }

step "setup"
ci/setup.sh

BUILD=build-ci
step "configure $BUILD"
# CI's build is for the tests: no debug info, test code at -O1 (WORKER_TEST_CXX_OPT) and, with
# CUDA, only the sm_90a SASS the H100 runs (the default build adds compute_90 PTX; its
# configure is checked by tools/tests/test_build.py). That halves the compile time on 2 cores.
cmake -S . -B "$BUILD" -G Ninja -DWORKER_WERROR=ON -DWORKER_CUDA="${WORKER_CUDA:-AUTO}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
  -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DWORKER_TEST_CXX_OPT=-O1 >"$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; echo "test.sh: cmake configure failed" >&2; exit 1; }
grep -E "worker-orcd: CUDA backend" "$BUILD.configure.log" || true
step "build ($JOBS jobs)"
if ! cmake --build "$BUILD" -j "$JOBS" >"$BUILD.build.log" 2>&1; then
  grep -E -A12 "^FAILED:|error:" "$BUILD.build.log" | head -120
  echo "test.sh: build failed (full log: $BUILD.build.log)" >&2
  exit 1
fi

if [[ -x fixtures/generate_all.sh ]]; then
  step "generate fixtures"
  fixtures/generate_all.sh
fi

step "ctest"
rm -rf "$BUILD/test-results"
mkdir -p "$BUILD/test-results"
ctest_rc=0
ctest --test-dir "$BUILD" --output-on-failure --timeout 900 || ctest_rc=$?
# The scale-out and deployment tests (issue 16) print their counts; show them here.
grep -hE '^\[(scaleout|deploy)\]' "$BUILD/Testing/Temporary/LastTest.log" 2>/dev/null || true

# Sanitizers (issue 15): CPU-only builds at -O1 (test code at -O0: instrumented, -O1 doubles
# its compile time) of just the binaries the chosen tests need.
# ASan + UBSan: every unit test and the conformance suites (the worker processes they start
# are built with the same flags). TSan: the server unit tests (job runner, HTTP) and the two
# most concurrent conformance suites. Reports halt the process (exit code != 0) and are also
# written to <build>/sanitizer-reports/, from the worker processes too; any file there fails
# the step. WORKER_SANITIZERS=0 skips both (quick local runs only).
# san_step DIR "CMAKE ARGS" "TARGETS" CTEST_REGEX: configure, build, run, check the reports.
san_step() {
  local dir=$1 cmake_args=$2 targets=$3 regex=$4
  # shellcheck disable=SC2086
  if ! cmake -S . -B "$dir" -G Ninja -DWORKER_WERROR=ON -DWORKER_CUDA=OFF $cmake_args \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DWORKER_TEST_CXX_OPT=-O0 \
      >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; echo "test.sh: $dir configure failed" >&2; return 1
  fi
  # shellcheck disable=SC2086
  if ! cmake --build "$dir" -j "$JOBS" --target $targets >"$dir.build.log" 2>&1; then
    grep -E -A12 "^FAILED:|error:" "$dir.build.log" | head -120
    echo "test.sh: $dir build failed (full log: $dir.build.log)" >&2; return 1
  fi
  local reports=$ROOT/$dir/sanitizer-reports rc=0
  rm -rf "$reports" "$dir/test-results"
  mkdir -p "$reports"
  ctest --test-dir "$dir" -R "$regex" --output-on-failure --timeout 900 || rc=1
  if compgen -G "$reports/*" >/dev/null; then
    echo "test.sh: sanitizer reports in $reports:" >&2
    head -n 60 "$reports"/* >&2
    rc=1
  fi
  return $rc
}
if [[ "${WORKER_SANITIZERS:-1}" != 0 ]]; then
  san_units="common_tests gguf_tests gguf_fixture_tests tokenizer_tests engine_sampler_tests
    engine_act_quant_tests engine_cpu_tests engine_generation_tests engine_parity_tests
    engine_compare_tool_tests engine_backend_factory_tests engine_cpu_kv16_tests
    engine_cpu_kv16_parity_tests server_unit_tests server_runner_tests server_http_tests"
  san_conf="conformance_harness_test conformance_startup conformance_execute
    conformance_validation conformance_streaming conformance_service conformance_openai
    conformance_parity conformance_fault"
  step "ASan+UBSan build (CPU, -O1) + unit and conformance suites"
  asan_dir=build-asan
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:log_path=$ROOT/$asan_dir/sanitizer-reports/asan" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$ROOT/$asan_dir/sanitizer-reports/ubsan" \
    san_step "$asan_dir" "-DWORKER_SANITIZE=ON" "$(echo $san_units worker-orcd $san_conf)" \
    "^($(echo $san_units $san_conf | tr ' ' '|'))\$" || ctest_rc=1
  step "TSan build (CPU, -O1) + job runner / HTTP tests and concurrent conformance suites"
  tsan_dir=build-tsan
  san_tsan="server_runner_tests server_http_tests conformance_streaming conformance_service"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/ci/tsan-suppressions.txt:log_path=$ROOT/$tsan_dir/sanitizer-reports/tsan" \
    san_step "$tsan_dir" "-DWORKER_TSAN=ON" "$(echo $san_tsan worker-orcd)" \
    "^($(echo $san_tsan | tr ' ' '|'))\$" || ctest_rc=1
fi

# Fuzzers (issues 3, 15): the GGUF reader, each tokenizer, the /execute and OpenAI request
# validators and the harness's SSE parser under libFuzzer + ASan/UBSan for
# WORKER_FUZZ_SECONDS each (default 35: seven fuzzers, two at a time, about the 2 minutes
# that four fuzzers of 60 s took; 0 skips, for quick local runs only).
FUZZ_SECONDS="${WORKER_FUZZ_SECONDS:-35}"
if [[ "$FUZZ_SECONDS" != 0 ]]; then
  step "fuzz build (clang, libFuzzer) + fuzzers, ${FUZZ_SECONDS} s each"
  FUZZ=build-fuzz
  if ! CC=clang CXX=clang++ cmake -S . -B "$FUZZ" -G Ninja -DWORKER_FUZZ=ON -DWORKER_CUDA=OFF \
      -DWORKER_WERROR=ON -DWORKER_FUZZ_SECONDS="$FUZZ_SECONDS" >"$FUZZ.configure.log" 2>&1; then
    cat "$FUZZ.configure.log"; echo "test.sh: fuzz configure failed" >&2; exit 1
  fi
  if ! cmake --build "$FUZZ" -j "$JOBS" --target fuzz_gguf fuzz_tokenizer_gguf fuzz_tokenizer_vocab \
      fuzz_tokenizer_hf_json fuzz_execute_validator fuzz_openai_validator fuzz_sse_parser \
      >"$FUZZ.build.log" 2>&1; then
    grep -E -A12 "^FAILED:|error:" "$FUZZ.build.log" | head -120
    echo "test.sh: fuzz build failed (full log: $FUZZ.build.log)" >&2
    exit 1
  fi
  ctest --test-dir "$FUZZ" -L fuzz --output-on-failure || ctest_rc=$?
fi

cov_args=()
if [[ "${WORKER_COVERAGE:-0}" == 1 ]]; then
  step "coverage build (CPU-only, gcov + lcov)"
  COV=build-cov
  cmake -S . -B "$COV" -G Ninja -DWORKER_COVERAGE=ON -DWORKER_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
    >"$COV.configure.log" 2>&1 || { cat "$COV.configure.log"; exit 1; }
  if ! cmake --build "$COV" -j "$JOBS" >"$COV.build.log" 2>&1; then
    grep -E -A12 "^FAILED:|error:" "$COV.build.log" | head -120
    echo "test.sh: coverage build failed (full log: $COV.build.log)" >&2
    exit 1
  fi
  ci/coverage.sh "$COV" reports/coverage-summary.txt || ctest_rc=1
fi
if [[ -f reports/coverage-summary.txt ]]; then
  cov_args=(--coverage-summary reports/coverage-summary.txt)
fi

step "requirement coverage report + gate"
res_args=(--results "cpu=$BUILD/test-results")
if [[ -d reports/gpu-results ]] && find reports/gpu-results -name '*.xml' | grep -q .; then
  res_args+=(--results "cuda=reports/gpu-results")
fi
gate_rc=0
python3 tools/reqcov.py report "${res_args[@]}" "${cov_args[@]}" || gate_rc=$?
python3 tools/reqcov.py spec-md --check || gate_rc=1
step "requirement page in headless chromium"
python3 tools/report_browser.py reports/requirements.html reports/requirements.json \
  --screenshot "$BUILD/test-results/requirements-page.png" || gate_rc=1

step "done: ctest rc=$ctest_rc, gate rc=$gate_rc (reports/requirements.md)"
if ((ctest_rc != 0 || gate_rc != 0)); then
  echo "test.sh: FAILED" >&2
  exit 1
fi
echo "test.sh: PASSED in $((SECONDS - START)) s"
