#!/usr/bin/env bash
# Line coverage of the CPU build: runs the tests of a -DWORKER_COVERAGE=ON build folder, then
# lcov. Usage: ci/coverage.sh BUILD_DIR SUMMARY_FILE. HTML lands in BUILD_DIR/coverage-html.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "$1" && pwd)"
SUMMARY="$2"
cd "$ROOT"
find "$BUILD" -name '*.gcda' -delete
rm -rf "$BUILD/test-results"
rc=0
ctest --test-dir "$BUILD" --output-on-failure --timeout 900 >"$BUILD/ctest.log" 2>&1 || rc=$?
((rc == 0)) || { tail -80 "$BUILD/ctest.log"; echo "coverage: some tests failed (rc=$rc)" >&2; }
LCOV=(lcov --quiet --rc lcov_branch_coverage=0)
# lcov 1.16's geninfo prints perl "Subroutine ... redefined" noise on stderr: keep it in a log.
"${LCOV[@]}" --capture --directory "$BUILD" --base-directory "$ROOT" \
  --output-file "$BUILD/coverage.raw.info" --ignore-errors gcov,source 2>"$BUILD/lcov.log" ||
  { grep -v 'redefined at' "$BUILD/lcov.log" >&2; echo "coverage: lcov --capture failed" >&2; exit 1; }
# Count the project's own code only: no system headers, no tests, no third-party sources.
"${LCOV[@]}" --remove "$BUILD/coverage.raw.info" '/usr/*' '*/tests/*' '*/.deps/*' '*/fuzz/*' \
  "$BUILD/*" --output-file "$BUILD/coverage.info"
genhtml --quiet --output-directory "$BUILD/coverage-html" "$BUILD/coverage.info" >/dev/null ||
  echo "coverage: genhtml failed (summary still written)" >&2
{
  echo "# lcov summary of the CPU build (WORKER_COVERAGE=1 ci/test.sh); commit" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%MZ)"
  lcov --rc lcov_branch_coverage=0 --summary "$BUILD/coverage.info" 2>&1 | grep -E '^\s*(lines|functions)'
} >"$SUMMARY"
cat "$SUMMARY"
exit "$rc"
