#!/bin/bash
# The identity of what a build of the worker's binaries is made from: a SHA-256 over the paths
# and contents of CMakeLists.txt, cmake/, kernels/, worker/ and bench/ (without __pycache__),
# plus, for each PATCH given, that patch's contents (a variant is the tree with the patches
# applied). Computed without git, so it is the same here and on the GPU machine, whose copy of
# .git may be stale. ci/gpu-prebuild.sh stamps each packed binary with it and ci/gpu-ab.sh uses a
# packed binary only when the stamp equals the id of the tree (and patch) it would build.
#   ci/tree-id.sh [PATCH ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
{
  find CMakeLists.txt cmake kernels worker bench -name __pycache__ -prune -o -type f ! -name '*.pyc' -print |
    LC_ALL=C sort | while IFS= read -r f; do printf '%s %s\n' "$(sha256sum < "$f" | cut -d' ' -f1)" "$f"; done
  for p in "$@"; do printf 'patch %s\n' "$(sha256sum < "$p" | cut -d' ' -f1)"; done
} | sha256sum | cut -d' ' -f1
