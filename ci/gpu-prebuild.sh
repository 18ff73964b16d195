#!/bin/bash
# Here, before a device call: builds decode_bench (Release, sm_90a, with ci/gpu-build.sh, as the
# GPU machine would) of the working tree and of each variant (ci/variant-src.sh: the tree with
# PATCH applied, as ci/gpu-ab.sh --patch makes it), and packs the binaries as ID/decode_bench into
# one archive, .carry/prebuilt/builds.tar.xz, ID being ci/tree-id.sh's identity of the tree (and
# patch). ci/gpu-ab.sh then unpacks a build whose ID it finds there instead of compiling it
# (decode_step.cu alone takes ~110 s, on any number of cores), so the call's time goes to the
# runs; a binary of another tree is never used, as its ID differs. Builds one after the other in
# /tmp/pb-*, ~2-4 min each on 2 cores; .carry/prebuilt is emptied first. One archive with a
# dictionary larger than a binary (~20 MB stripped) lets xz store each variant as its difference
# from the builds before it: the first binary takes ~9.2 MB, each variant of decode_step.cu ~5 MB
# more (separate archives: ~9.2 MB each). The device call carries at most 64 MiB in all, the
# tracked tree (~17 MB) and the qwen2 vocabulary (~6 MB) included: the tree and about six
# variants; the last line says whether the carry fits.
#   ci/gpu-prebuild.sh [--patch FILE]...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
patches=()
while [ $# -gt 0 ]; do
  case $1 in
    --patch) patches+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift ;;
    *) echo "usage: $0 [--patch FILE]..." >&2; exit 2 ;;
  esac
  shift
done
cd "$root"
[ -f .carry/deps.tar.gz ] || { echo "gpu-prebuild: run ci/gpu-carry.sh first" >&2; exit 2; }
out=$root/.carry/prebuilt
rm -rf "$out" && mkdir -p "$out"
stage=/tmp/pb-stage
rm -rf "$stage" && mkdir -p "$stage"
pack() {  # name build_dir id: the stripped binary as $stage/ID/decode_bench
  mkdir -p "$stage/$3"
  strip -o "$stage/$3/decode_bench" "$2/bench/decode_bench"
  ids+=("$3")
}
ids=()
build() {  # name src_dir id
  local b=/tmp/pb-$1 t0
  t0=$(date +%s)
  if ! "$2/ci/gpu-build.sh" "$b" decode_bench > "$b.log" 2>&1; then
    echo "gpu-prebuild: $1's build failed ($b.log):" >&2
    grep -E 'error|FAILED' "$b.log" | head -10 >&2
    exit 1
  fi
  echo "gpu-prebuild: $1 built in $(( $(date +%s) - t0 )) s"
  pack "$1" "$b" "$3"
}
build new "$root" "$(ci/tree-id.sh)"
for i in "${!patches[@]}"; do
  v=p$((i + 1)) src=/tmp/pb-src-p$((i + 1))
  ci/variant-src.sh "$src" "${patches[$i]}"
  build "$v" "$src" "$(ci/tree-id.sh "${patches[$i]}")"
done
# (-T1: one block, so every binary's matches reach back over those packed before it)
tar cf - -C "$stage" "${ids[@]}" | xz -T1 --lzma2=preset=6,dict=96MiB > "$out/builds.tar.xz"
rm -rf "$stage"  # ~20 MB a build, packed now
echo "gpu-prebuild: ${#ids[@]} builds, $(du -sh "$out/builds.tar.xz" | cut -f1) in .carry/prebuilt/builds.tar.xz"
# What a call with carry [".carry", the vocabulary] sends: the tracked files, .carry, the vocabulary.
total=$(( $(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}') +
  $(du -sb .carry | cut -f1) + $(stat -c %s .deps/llama.cpp/models/ggml-vocab-qwen2.gguf 2>/dev/null || echo 0) ))
if [ "$total" -gt $((64 * 1024 * 1024)) ]; then
  echo "gpu-prebuild: WARNING: the call would carry $((total / 1048576)) MiB, over 64 MiB: drop a variant" >&2
else
  echo "gpu-prebuild: the call carries $((total / 1048576)) of 64 MiB"
fi
