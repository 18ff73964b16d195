#!/usr/bin/env bash
# Run the tests that declare one requirement ID (`// REQ: <ID>`), in an existing build.
#   tools/run-req.sh M0-W-1330            # uses build-ci (BUILD=<dir> to choose another)
# Finds the tests with tools/reqcov.py's scan, then runs every CTest-registered gtest binary
# that holds any of them with a --gtest_filter, in the environment CTest would give it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# -ge 1 ]] || { echo "usage: tools/run-req.sh REQUIREMENT-ID [extra gtest args]" >&2; exit 2; }
ID="$1"; shift
BUILD="${BUILD:-$ROOT/build-ci}"
[[ -f "$BUILD/CTestTestfile.cmake" ]] ||
  { echo "run-req: no build in $BUILD (run ci/test.sh first, or set BUILD=<dir>)" >&2; exit 2; }
python3 "$ROOT/tools/reqcov.py" --root "$ROOT" scan --id "$ID" ||
  { echo "run-req: no test declares $ID" >&2; exit 1; }
FILTER="$(python3 "$ROOT/tools/reqcov.py" --root "$ROOT" scan --id "$ID" --gtest-filter 2>/dev/null)"
# The tools' python tests (tools/tests/*.py) run directly, one method name at a time.
py_rc=0 py_ran=0
for name in $(python3 "$ROOT/tools/reqcov.py" --root "$ROOT" scan --id "$ID" --json 2>/dev/null |
  python3 -c 'import json,sys; [print(t["test"].split(".")[1]) for t in json.load(sys.stdin) if t["file"].endswith(".py")]'); do
  echo "run-req: tools/tests $name"
  py_ran=1
  WORKER_SOURCE_DIR="$ROOT" python3 "$ROOT/tools/tests/run_tests.py" -k "$name" || py_rc=1
done
export PY_RAN=$py_ran PY_RC=$py_rc
ctest --test-dir "$BUILD" --show-only=json-v1 | python3 -c '
import json, os, subprocess, sys
flt, extra = sys.argv[1], sys.argv[2:]
ran, rc = 0, 0
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or []
    if not any(a.startswith("--gtest_output") for a in cmd):
        continue  # not a gtest binary
    env = dict(os.environ)
    for p in t.get("properties", []):
        if p["name"] == "ENVIRONMENT":
            env.update(kv.split("=", 1) for kv in p["value"])
    listed = subprocess.run([cmd[0], "--gtest_list_tests", "--gtest_filter=" + flt],
                            capture_output=True, text=True, env=env).stdout
    if not any(line.startswith("  ") for line in listed.splitlines()):
        continue
    print("run-req: " + t["name"], flush=True)
    ran += 1
    r = subprocess.run([cmd[0], "--gtest_filter=" + flt, *extra], env=env,
                       cwd=os.path.dirname(cmd[0]))
    rc = rc or r.returncode
if not ran and os.environ["PY_RAN"] == "0":
    print("run-req: none of these tests is built in this build folder", file=sys.stderr)
    sys.exit(1)
sys.exit(rc or int(os.environ["PY_RC"]))
' "$FILTER" "$@"
