#!/bin/bash
# Session 47's call: down's Q8_0 quantization under its chains (down-pipelined.patch, p1) and the
# same with the chain unrolled 4 pairs (down-pipelined-u4.patch, p2), A/B against main on Q8_0
# (the only type whose step they change: tools/cubin_diff.py, the Q8_0 / Q5_0 steps), a Q8_0
# step trace of each, then ci/gpu-verify.sh on the faster variant's tree if it gained >= 0.3%
# with the same hash. Here first: ci/gpu-prebuild.sh --patch ...p1 --patch ...p2 [...].
# Call with timeout_s 598 (CALL_S=S for another length).
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 190 ci/gpu-ab.sh --no-prev --reps 1 --models q8_0 --trace q8_0 \
  --patch reports/pending/down-pipelined.patch --patch reports/pending/down-pipelined-u4.patch 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | grep -vE "^  (head|issue)" | tee "$OUT/ab.log"
for v in p1 p2; do  # gpu-ab's trace lines leave down's phases out
  echo "== down's phases, new -> $v (us a layer)"
  python3 bench/steptrace.py --compare /tmp/ab-trace-new-q8_0.bin "/tmp/ab-trace-$v-q8_0.bin" |
    grep -E "down|layer|step"
done
pick=$(python3 - <<'PY'
import statistics
runs = {}
for line in open("/tmp/ab-lines.txt"):
    f = line.split()
    if len(f) == 12 and f[6] == "decode" and "q8_0" in f[1] and f[3] == "yes":
        runs.setdefault(f[0], {"d": [], "h": set()})
        runs[f[0]]["d"].append(float(f[7])); runs[f[0]]["h"].add(f[11])
new = runs.get("new")
best = None
for b in ("p1", "p2"):
    r = runs.get(b)
    if not new or not r or r["h"] != new["h"]:
        continue
    m = statistics.median(r["d"])
    if m >= 1.003 * statistics.median(new["d"]) and (best is None or m > best[1]):
        best = (b, m)
print(best[0] if best else "")
PY
)
left=$(( ${CALL_S:-588} - ($(date +%s) - t0) ))
if [ -z "$pick" ]; then echo "== no variant gained >= 0.3% with new's hash: no verify"; exit 0; fi
echo "== verify $pick (budget ${left}s)"
cd "/tmp/ab-src-$pick" && ci/gpu-verify.sh --build "/tmp/ab-$pick" --budget "$left" 2>&1 | tee "$OUT/verify.log" | tail -30
