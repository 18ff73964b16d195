#!/bin/bash
# On the GPU machine, one call: a same-call A/B of this working tree against the commit
# ci/gpu-carry.sh --prev packed into .carry/prev.tar.gz. Builds both (Release, sm_90a, in
# parallel), generates the 0.5B-shaped models, then runs decode_bench prev / new / new / prev
# on them and prints one line per (build, model, numerics): decode tok/s, prompt tok/s, logits
# hash. The trees are built in /tmp/ab-new and /tmp/ab-prev and kept while the machine stays
# warm (a second call rebuilds only what changed; prev again when another commit was packed).
#   ci/gpu-ab.sh [--numerics exact|fast|both] [--prefill N] [--decode N] [--models f16,q8_0,q4_k_m]
#                [--targets "decode_bench ..."] (extra build targets of the new tree, e.g. tests)
#                [--patch FILE]... (each: a variant, the working tree with FILE applied (git
#                apply), built in /tmp/ab-p1, /tmp/ab-p2, ... with the same targets; the runs go
#                prev / new / p1 .. / p1 .. / new / prev)
#                [--no-prev] (new and the variants only, when prev would be new's own commit)
#                [--reps N] (decode_bench's repetitions, 3 by default)
#                [--graph on|off|both] (decode_bench's --graph: the per-op step, past the persistent
#                step's keys, replayed from a CUDA graph, the product's setting, or launched
#                directly; on by default. The persistent step is launched directly either way)
#                [--trace MODELS] (after the runs, a step trace of the persistent step on each of
#                these models (e.g. f16,q8_0) by prev, new and each variant: decode_bench --decode
#                24 with WORKER_DECODE_STEP_TRACE, then bench/steptrace.py --compare prev new and
#                new variant, their per-layer lines (new's own trace when it is the only build);
#                the traces stay in /tmp/ab-trace-BUILD-MODEL.bin)
#                [--heads N] (with --trace: the models' attention heads, 14 for the 0.5B shape;
#                steptrace.py --heads adds the skew of each head's attention blocks)
# Builds whose binary ci/gpu-prebuild.sh packed here beforehand (.carry/prebuilt, keyed by
# ci/tree-id.sh) are unpacked instead of compiled, which saves the call ~110 s.
# Last, bench/absummary.py's table: each build's median decode and prompt tok/s, their change
# against new's, and whether its logits hashes equal new's; with $OUT set (the device call's
# output folder) the run lines and that table are also written to $OUT/gpu-ab-runs.txt.
# Each decode_bench run is cut after 150 s. A variant whose build fails, or whose run fails or is
# cut, is not run (again) and the others go on (the exit status is then 1); new's and prev's
# builds must succeed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
numerics=exact prefill=512 decode=256 models=f16,q8_0,q4_k_m extra="" patches=() noprev=0 reps=3
graph=on trace="" heads=()
while [ $# -gt 0 ]; do
  case $1 in
    --numerics) numerics=$2; shift ;;
    --prefill) prefill=$2; shift ;;
    --decode) decode=$2; shift ;;
    --models) models=$2; shift ;;
    --targets) extra=$2; shift ;;
    --no-prev) noprev=1 ;;
    --reps) reps=$2; shift ;;
    --graph) graph=$2; shift ;;
    --trace) trace=$2; shift ;;
    --heads) heads=(--heads "$2"); shift ;;
    --patch) patches+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift ;;
    *) echo "usage: $0 [--numerics exact|fast|both] [--prefill N] [--decode N] [--models a,b] [--targets T] [--patch FILE]... [--no-prev] [--reps N] [--graph on|off|both] [--trace MODELS] [--heads N]" >&2; exit 2 ;;
  esac
  shift
done
cd "$root" || exit 2
[ $noprev = 1 ] || [ -f .carry/prev.tar.gz ] || { echo "gpu-ab: .carry/prev.tar.gz missing (ci/gpu-carry.sh --prev COMMIT)" >&2; exit 2; }
export WORKER_GENERATED_FIXTURES=${WORKER_GENERATED_FIXTURES:-/tmp/ab-fixtures}
if [ -z "${WORKER_SHARED_FIXTURES:-}" ]; then
  if [ -d "$root/../shared/fixtures" ]; then export WORKER_SHARED_FIXTURES=$root/../shared/fixtures
  else export WORKER_SHARED_FIXTURES=$root/.carry/shared-fixtures; fi
fi
t0=$(date +%s)
say() { echo "[gpu-ab +$(( $(date +%s) - t0 ))s] $*"; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1); new $(cat .carry/commit 2>/dev/null || echo '?') (+ working tree), prev $(cat .carry/prev-commit 2>/dev/null || echo '?')"
(sh fixtures/generate_all.sh --big > /tmp/ab-gen.log 2>&1; echo "rc $?" >> /tmp/ab-gen.log) &
want=$(cat .carry/prev-commit 2>/dev/null || echo unknown)
if [ $noprev = 1 ]; then :
elif [ ! -x /tmp/ab-prev/build/bench/decode_bench ] || [ "$(cat /tmp/ab-prev/.built 2>/dev/null)" != "$want" ]; then
  rm -rf /tmp/ab-prev && mkdir -p /tmp/ab-prev/.carry && tar xzf .carry/prev.tar.gz -C /tmp/ab-prev &&
    cp .carry/deps.tar.gz /tmp/ab-prev/.carry/ && echo "$want" > /tmp/ab-prev/.built
  (/tmp/ab-prev/ci/gpu-build.sh /tmp/ab-prev/build decode_bench > /tmp/ab-prev.log 2>&1; echo "rc $?" >> /tmp/ab-prev.log) &
fi
# A build whose tree id (ci/tree-id.sh: the tree, plus the variant's patch) has a binary packed
# by ci/gpu-prebuild.sh in .carry/prebuilt/builds.tar.xz (as ID/decode_bench) is unpacked instead
# of compiled (decode_bench only: not with --targets). The archive is unpacked once, here, into
# /tmp/ab-prebuilt (prebuilt() runs in the variants' background jobs: it only copies).
if [ -z "$extra" ] && [ -f .carry/prebuilt/builds.tar.xz ] &&
  { [ ! -f /tmp/ab-prebuilt/.done ] || [ .carry/prebuilt/builds.tar.xz -nt /tmp/ab-prebuilt/.done ]; }; then
  rm -rf /tmp/ab-prebuilt && mkdir -p /tmp/ab-prebuilt
  if python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
    .carry/prebuilt/builds.tar.xz /tmp/ab-prebuilt; then
    touch /tmp/ab-prebuilt/.done
  else
    say "prebuilt: .carry/prebuilt/builds.tar.xz did not unpack; compiling instead"
  fi
fi
prebuilt() {  # name dir id: 0 when unpacked
  if [ -n "$extra" ] || [ ! -f /tmp/ab-prebuilt/.done ] || [ ! -f "/tmp/ab-prebuilt/$3/decode_bench" ]; then
    return 1
  fi
  rm -rf "$2" && mkdir -p "$2/bench" && cp "/tmp/ab-prebuilt/$3/decode_bench" "$2/bench/" || return 1
  chmod +x "$2/bench/decode_bench"
  echo "rc 0" > "$2.log"
  say "$1: prebuilt (.carry/prebuilt/builds.tar.xz: ${3:0:12}...)"
}
# The variants: ci/variant-src.sh's copy of the working tree with the patch applied; a patch
# that does not apply stops the run before anything is built.
variants=()
for i in "${!patches[@]}"; do
  v=p$((i + 1)) src=/tmp/ab-src-p$((i + 1))
  ci/variant-src.sh "$src" "${patches[$i]}" || { say "FAILED: $v's tree"; exit 1; }
  say "$v = the working tree + ${patches[$i]}"
  variants+=("$v")
  prebuilt "$v" /tmp/ab-$v "$(ci/tree-id.sh "${patches[$i]}")" ||
    ("$src/ci/gpu-build.sh" /tmp/ab-$v decode_bench $extra > /tmp/ab-$v.log 2>&1; echo "rc $?" >> /tmp/ab-$v.log) &
done
if ! prebuilt new /tmp/ab-new "$(ci/tree-id.sh)"; then
  ci/gpu-build.sh /tmp/ab-new decode_bench $extra > /tmp/ab-new.log 2>&1; echo "rc $?" >> /tmp/ab-new.log
fi
wait
logs=(/tmp/ab-new.log /tmp/ab-gen.log)
[ $noprev = 1 ] || logs+=(/tmp/ab-prev.log)
for f in "${logs[@]}"; do
  [ -f $f ] || continue
  if [ "$(tail -n1 $f)" != "rc 0" ]; then say "FAILED: $f"; grep -E 'error|FAILED|missing' $f | head -20; exit 1; fi
done
failed=" "  # variants whose build failed, or whose run failed or hung: not run (again); the rest go on
for v in "${variants[@]}"; do
  if [ "$(tail -n1 /tmp/ab-$v.log)" != "rc 0" ]; then
    say "FAILED: $v's build (/tmp/ab-$v.log)"; grep -E 'error|FAILED' /tmp/ab-$v.log | head -10
    failed+="$v "
  fi
done
say "built and generated"
LD_LIBRARY_PATH=$(ci/gpu-build.sh --libdir)
export LD_LIBRARY_PATH
args=()
for m in ${models//,/ }; do args+=(--model "$WORKER_GENERATED_FIXTURES/qwen2-0.5b-$m.gguf"); done
rev=(); for ((i = ${#variants[@]} - 1; i >= 0; i--)); do rev+=("${variants[$i]}"); done
: > /tmp/ab-lines.txt
order=(prev new "${variants[@]}" "${rev[@]}" new prev)
[ $noprev = 1 ] && order=(new "${variants[@]}" "${rev[@]}" new)
for b in "${order[@]}"; do
  [[ $failed == *" $b "* ]] && continue
  d=/tmp/ab-$b/bench/decode_bench; [ $b = prev ] && d=/tmp/ab-prev/build/bench/decode_bench
  timeout 150 "$d" "${args[@]}" --prefill "$prefill" --decode "$decode" --reps "$reps" \
    --numerics "$numerics" --graph "$graph" > /tmp/ab-run.log 2>&1
  rc=$?
  if [ $rc != 0 ]; then
    say "FAILED: $b's decode_bench (rc $rc; 124: cut after 150 s):"; tail -5 /tmp/ab-run.log
    failed+="$b "
    continue
  fi
  awk -v b=$b '/\.gguf/ {printf "%-4s %-24s exact %-3s graph %-3s decode %8s  prompt %8s  hash %s\n", b, $1, $2, $3, $4, $8, $11}' /tmp/ab-run.log |
    tee -a /tmp/ab-lines.txt
done
traced=(new "${variants[@]}")
[ $noprev = 1 ] || traced=(prev "${traced[@]}")
for m in ${trace//,/ }; do
  for b in "${traced[@]}"; do
    [[ $failed == *" $b "* ]] && continue
    t=/tmp/ab-trace-$b-$m.bin
    rm -f "$t"
    d=/tmp/ab-$b/bench/decode_bench; [ $b = prev ] && d=/tmp/ab-prev/build/bench/decode_bench
    WORKER_DECODE_STEP_TRACE=$t timeout 60 "$d" \
      --model "$WORKER_GENERATED_FIXTURES/qwen2-0.5b-$m.gguf" --prefill "$prefill" --decode 24 \
      --reps 1 > /tmp/ab-trace.log 2>&1 || { say "FAILED: $b's traced run on $m"; tail -3 /tmp/ab-trace.log; }
  done
  pairs=()
  [ $noprev = 1 ] || pairs+=("prev new")
  for v in "${variants[@]}"; do pairs+=("new $v"); done
  for pr in "${pairs[@]}"; do
    set -- $pr
    [ -s /tmp/ab-trace-$1-$m.bin ] && [ -s /tmp/ab-trace-$2-$m.bin ] || continue
    say "step trace $m: $1 -> $2 (us)"
    python3 bench/steptrace.py "${heads[@]}" --compare /tmp/ab-trace-$1-$m.bin /tmp/ab-trace-$2-$m.bin |
      grep -vE "slowest|attention (RoPE|exps|softmax|KQV|reduce)|down: "
  done
  if [ ${#pairs[@]} -eq 0 ] && [ -s /tmp/ab-trace-new-$m.bin ]; then
    say "step trace $m: new (us)"
    python3 bench/steptrace.py "${heads[@]}" /tmp/ab-trace-new-$m.bin
  fi
done
python3 bench/absummary.py /tmp/ab-lines.txt | tee /tmp/ab-summary.txt
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cat /tmp/ab-lines.txt /tmp/ab-summary.txt > "$OUT/gpu-ab-runs.txt"; fi
if [ "$failed" != " " ]; then say "done; failed:$failed"; exit 1; fi
say "done"
