#!/bin/bash
# The next device call (perf-notes v50): A/B against main on Q8_0 and Q4_K_M (the only types
# whose steps the patches change: tools/cubin_diff.py, the Q8_0 / Q5_0 / mix steps) of
#   p1 down-pipelined.patch      down's Q8_0 quantization under its chains (Q8_0 / Q5_0 steps)
#   p2 gateup-interleave.patch   gate + up's rows three at a time a thread (Q8_0 / Q5_0 rows)
#   p3 down-pipelined+gateup.patch  both
# with a Q8_0 step trace of each (down's stage / quantize / rows and gate + up printed), then
# ci/gpu-verify.sh on the variant with the largest mean gain over the two types if it gained
# >= 0.3% with new's hashes and lost nowhere more than 0.3% (its racecheck of the attention,
# which no patch touches, is cut by the call's time).
# Here first: ci/gpu-prebuild.sh --patch reports/pending/down-pipelined.patch \
#   --patch reports/pending/gateup-interleave.patch --patch reports/pending/down-pipelined+gateup.patch
# (4 binaries, ~37 MB: the carry is ~59 of 64 MiB). Call with timeout_s 598 (CALL_S=S otherwise).
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
V=(down-pipelined gateup-interleave down-pipelined+gateup)
timeout 220 ci/gpu-ab.sh --no-prev --reps 1 --models q8_0,q4_k_m --trace q8_0 \
  --patch "reports/pending/${V[0]}.patch" --patch "reports/pending/${V[1]}.patch" \
  --patch "reports/pending/${V[2]}.patch" 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | grep -vE "^  (head|issue)" | tee "$OUT/ab.log"
for v in p1 p2 p3; do  # gpu-ab's trace lines leave down's phases out
  echo "== Q8_0 step trace, new -> $v (us a layer)"
  python3 bench/steptrace.py --compare /tmp/ab-trace-new-q8_0.bin "/tmp/ab-trace-$v-q8_0.bin" |
    grep -E "down|gate|layer|step"
done
pick=$(python3 - <<'PY'
import statistics
runs = {}
for line in open("/tmp/ab-lines.txt"):
    f = line.split()
    if len(f) == 12 and f[6] == "decode" and f[3] == "yes":
        r = runs.setdefault((f[0], f[1]), {"d": [], "h": set()})
        r["d"].append(float(f[7])); r["h"].add(f[11])
models = sorted({m for _, m in runs})
best = None
for b in ("p1", "p2", "p3"):
    gains = []
    for m in models:
        n, r = runs.get(("new", m)), runs.get((b, m))
        if not n or not r or r["h"] != n["h"]:
            break
        gains.append(statistics.median(r["d"]) / statistics.median(n["d"]) - 1)
    else:
        g = sum(gains) / len(gains)
        if g >= 0.003 and min(gains) >= -0.003 and (best is None or g > best[1]):
            best = (b, g)
print(best[0] if best else "")
PY
)
left=$(( ${CALL_S:-588} - ($(date +%s) - t0) ))
if [ -z "$pick" ]; then echo "== no variant gained >= 0.3% with new's hashes: no verify"; exit 0; fi
echo "== verify $pick (budget ${left}s)"
cd "/tmp/ab-src-$pick" && ci/gpu-verify.sh --build "/tmp/ab-$pick" --budget "$left" 2>&1 | tee "$OUT/verify.log" | tail -30
