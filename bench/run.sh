#!/bin/bash
# The benchmark end to end, in one call on the GPU machine (after building worker-orcd and
# decode_bench with CUDA, and kernel_bench for the Q8_0 products' share of their float-chain
# floor; without it that target is not measured): generates the 0.5B-shaped models (F16, Q8_0,
# Q4_K_M), runs bench/bench.py on them (engine level + HTTP, exact and fast) and, with --llamacpp,
# llama.cpp's llama-bench on the same files (twice: before and after this worker's figures, the
# faster run counts); writes OUT/bench-<date>.json and .md.
#
#   bench/run.sh --out DIR [--llamacpp] [--bin DIR | --build-dir build] [--numerics exact,fast]
#   bench/run.sh --build-llamacpp        only build llama-bench (~5 min on 16 cores)
#   bench/run.sh --out DIR --backend cpu --smoke    CI: a tiny model, small counts (~15 s)
#
# llama-bench: build-peer-bin/llama-bench (ignored, kept on a warm machine) or built first from
# .carry/lcpp.tar.gz with .carry/peer/build-peer.sh (copies of ../shared/peer, see its README).
# --bin DIR: worker-orcd and decode_bench side by side (as ci/gpu-run.sh takes them); DIR and
# .carry/lib (if present) go on LD_LIBRARY_PATH (libcpp-httplib.so.0.11 for worker-orcd).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="" bin="" llama=0 build_llama_only=0 backend=cuda smoke=0 numerics=exact,fast
build=$root/build
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift ;;
    --llamacpp) llama=1 ;;
    --build-llamacpp) build_llama_only=1 ;;
    --backend) backend=$2; shift ;;
    --smoke) smoke=1 ;;
    --build-dir) build=$2; shift ;;
    --bin) bin=$2; shift ;;
    --numerics) numerics=$2; shift ;;
    *) echo "usage: $0 --out DIR [--llamacpp] [--bin DIR | --build-dir DIR] [--numerics exact,fast] [--backend cuda|cpu] [--smoke] | --build-llamacpp" >&2; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
say() { echo "[run.sh +$(( $(date +%s) - t0 ))s] $*"; }
[ -d "$root/.carry/lib" ] && export LD_LIBRARY_PATH="$root/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

peer_bin=$root/build-peer-bin
build_llama() {
  [ -x "$peer_bin/llama-bench" ] && return 0
  [ -f "$root/.carry/lcpp.tar.gz" ] && [ -f "$root/.carry/peer/build-peer.sh" ] || {
    echo "run.sh: no $peer_bin/llama-bench and no .carry/lcpp.tar.gz + .carry/peer/ to build it" >&2
    return 1
  }
  say "building llama-bench (~5 min)"
  rm -rf /tmp/lc && mkdir -p /tmp/lc && tar xzf "$root/.carry/lcpp.tar.gz" -C /tmp/lc
  LLAMA_SRC=/tmp/lc bash "$root/.carry/peer/build-peer.sh" "$peer_bin"
  say "llama-bench built"
}
if [ $build_llama_only = 1 ]; then
  build_llama
  exit
fi
[ -n "$out" ] || { echo "run.sh: --out DIR is required" >&2; exit 2; }
mkdir -p "$out"

if [ -n "$bin" ]; then
  bin=$(cd "$bin" && pwd)
  worker=$bin/worker-orcd dbench=$bin/decode_bench
  export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  worker=$build/worker/server/worker-orcd dbench=$build/bench/decode_bench
fi
for b in "$worker" "$dbench"; do
  [ -x "$b" ] || { echo "run.sh: $b not built (cmake --build $build --target worker-orcd decode_bench)" >&2; exit 1; }
done

gen=${WORKER_GENERATED_FIXTURES:-$root/fixtures/generated}
if [ $smoke = 1 ]; then
  shared=${WORKER_SHARED_FIXTURES:-$root/../shared/fixtures}
  models=(F32="$shared/stories260K.gguf")
else
  say "generating the 0.5B-shaped models (skipped when up to date)"
  WORKER_GENERATED_FIXTURES=$gen sh "$root/fixtures/generate_all.sh" --big
  models=(F16="$gen/qwen2-0.5b-f16.gguf" Q8_0="$gen/qwen2-0.5b-q8_0.gguf" Q4_K_M="$gen/qwen2-0.5b-q4_k_m.gguf")
  say "models ready"
fi

args=(--backend "$backend" --numerics "$numerics" --worker "$worker" --decode-bench "$dbench" --out "$out")
# kernel_bench (optional): the Q8_0 products' share of their float-chain floor
kbench=${bin:+$bin/kernel_bench}
kbench=${kbench:-$build/bench/kernel_bench}
if [ "$backend" = cuda ] && [ $smoke = 0 ]; then
  if [ -x "$kbench" ]; then args+=(--kernel-bench "$kbench")
  else say "no $kbench: the Q8_0 products' floor fraction is not measured"; fi
fi
for m in "${models[@]}"; do args+=(--model "$m"); done
[ $smoke = 1 ] && args+=(--smoke)
if [ $llama = 1 ]; then
  build_llama
  args+=(--llamacpp-bin "$peer_bin")
fi
python3 "$root/bench/bench.py" "${args[@]}"
say "done"
