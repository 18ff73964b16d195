#!/bin/bash
# The next device call (perf-notes v50): A/B against main on Q8_0 and Q4_K_M (the only types
# whose steps the patches change: tools/cubin_diff.py, the Q8_0 / Q5_0 / mix steps) of
#   p1 down-pipelined.patch            down's Q8_0 quantization under its chains
#   p2 gateup-interleave.patch         gate + up's rows three at a time a thread
#   p3 down-pipelined+gateup.patch     p1 and p2
#   p4 norm-quantize.patch             the norms' output quantized by the thread that normalizes it
#   p5 down-pipelined+gateup+norm.patch  all three
#   p6 long-slots-pairs.patch          long_row_dots' slots two items a thread (Q4_K_M's K-quant down)
# then a Q8_0 step trace of main and of the variant with the largest mean gain over the two types
# (down's stage / quantize / rows and gate + up printed), and ci/gpu-verify.sh on that variant's
# tree if it gained >= 0.3% with main's hashes and lost nowhere more than 0.3% (the verify's last
# racechecks, of the f16 step and the attention, which no patch touches, may be cut by the
# call's time; the q8_0 step's racecheck, which covers the named barriers, runs first).
# Here first: ci/gpu-prebuild.sh with the six patches in this order (one archive of seven
# binaries, ~37 MB: the carry fits 64 MiB). Call with timeout_s 598 (CALL_S=S otherwise).
set -o pipefail
export WORKER_SHARED_FIXTURES=$PWD/.carry/shared-fixtures
big=/tmp/ab-fixtures  # gpu-ab.sh's 0.5B files
t0=$(date +%s)
V=(down-pipelined gateup-interleave down-pipelined+gateup norm-quantize down-pipelined+gateup+norm
  long-slots-pairs)
args=()
for v in "${V[@]}"; do args+=(--patch "reports/pending/$v.patch"); done
timeout 280 ci/gpu-ab.sh --no-prev --reps 1 --models q8_0,q4_k_m "${args[@]}" 2>&1 |
  grep -v "^\[gpu-ab +0s\]" | grep -vE "^  (head|issue)" | tee "$OUT/ab.log"
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
for b in ("p1", "p2", "p3", "p4", "p5", "p6"):
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
if [ -z "$pick" ]; then echo "== no variant gained >= 0.3% with new's hashes: no verify"; exit 0; fi
LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir); export LD_LIBRARY_PATH
for b in new "$pick"; do
  WORKER_DECODE_STEP_TRACE="/tmp/ab-trace-$b-q8_0.bin" timeout 60 "/tmp/ab-$b/bench/decode_bench" \
    --model "$big/qwen2-0.5b-q8_0.gguf" --prefill 512 --decode 24 --reps 1 \
    > /tmp/ab-trace.log 2>&1 || tail -3 /tmp/ab-trace.log
done
echo "== Q8_0 step trace, new -> $pick (us a layer)"
python3 bench/steptrace.py --compare /tmp/ab-trace-new-q8_0.bin "/tmp/ab-trace-$pick-q8_0.bin" |
  tee "$OUT/trace.txt" | grep -E "norm|down|gate|layer|step"
left=$(( ${CALL_S:-588} - ($(date +%s) - t0) ))
echo "== verify $pick (budget ${left}s)"
cd "/tmp/ab-src-$pick" && ci/gpu-verify.sh --build "/tmp/ab-$pick" --budget "$left" 2>&1 | tee "$OUT/verify.log" | tail -30
