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
cmake -S . -B "$BUILD" -G Ninja -DWORKER_WERROR=ON -DWORKER_CUDA="${WORKER_CUDA:-AUTO}" >"$BUILD.configure.log" 2>&1 ||
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

# Fuzzers (issue 3): the GGUF reader and each tokenizer under libFuzzer + ASan/UBSan for
# WORKER_FUZZ_SECONDS each (default 60; 0 skips, for quick local runs only).
FUZZ_SECONDS="${WORKER_FUZZ_SECONDS:-60}"
if [[ "$FUZZ_SECONDS" != 0 ]]; then
  step "fuzz build (clang, libFuzzer) + fuzzers, ${FUZZ_SECONDS} s each"
  FUZZ=build-fuzz
  if ! CC=clang CXX=clang++ cmake -S . -B "$FUZZ" -G Ninja -DWORKER_FUZZ=ON -DWORKER_CUDA=OFF \
      -DWORKER_WERROR=ON -DWORKER_FUZZ_SECONDS="$FUZZ_SECONDS" >"$FUZZ.configure.log" 2>&1; then
    cat "$FUZZ.configure.log"; echo "test.sh: fuzz configure failed" >&2; exit 1
  fi
  if ! cmake --build "$FUZZ" -j "$JOBS" --target fuzz_gguf fuzz_tokenizer_gguf fuzz_tokenizer_vocab \
      fuzz_tokenizer_hf_json >"$FUZZ.build.log" 2>&1; then
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
