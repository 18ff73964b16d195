#!/bin/bash
# A variant's source tree, as ci/gpu-ab.sh and ci/gpu-prebuild.sh build it: DEST emptied, then
# a copy of this working tree (its tracked and untracked files that exist: the index may name
# files the copy deleted) and of .carry (without .carry/prebuilt, which only the caller reads),
# with PATCH applied. Exits non-zero, saying why, when the copy fails or the patch does not apply.
#   ci/variant-src.sh DEST PATCH
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:?usage: ci/variant-src.sh DEST PATCH} patch=${2:?usage: ci/variant-src.sh DEST PATCH}
cd "$root" || exit 1
rm -rf "$dest" && mkdir -p "$dest" &&
  git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$dest" &&
  cp -r .carry "$dest/" && rm -rf "$dest/.carry/prebuilt" ||
  { echo "variant-src: copying the tree into $dest failed" >&2; exit 1; }
(cd "$dest" && git apply "$patch") || { echo "variant-src: $patch does not apply" >&2; exit 1; }
