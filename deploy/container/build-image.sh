#!/usr/bin/env bash
# Builds the worker-orcd CPU image with podman from a locally made Debian base (no image
# registry): make-base.sh (debootstrap + podman import, cached in WORKDIR), then
# `podman build` of deploy/container/Containerfile on the source tree.
#   Usage: build-image.sh WORKDIR TAG
# Exit 77 with "not run: <reason>" on stdout when podman cannot run containers on this
# machine (the caller reports the test as not run); any other failure exits 1.
set -euo pipefail
work="$(mkdir -p "$1" && cd "$1" && pwd)" tag="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../.." && pwd)"
notrun() { echo "not run: $*"; exit 77; }
for tool in podman debootstrap runc; do
  command -v "$tool" >/dev/null || notrun "$tool is not installed (ci/setup.sh installs it)"
done
[[ $(id -u) -eq 0 ]] || notrun "needs root (rootless podman needs subuid ranges this setup does not make)"
export PODMAN_ROOT="$work/podman"
# shellcheck source=deploy/container/podman.sh
source "$here/podman.sh"
suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
base="localhost/worker-orcd-base:$suite"
t0=$SECONDS
"$here/make-base.sh" "$work" "$base"
echo "build-image: base ready in $((SECONDS - t0)) s"
# Can this machine run a container at all (nested sandbox, cgroups, limits)?
if ! out="$("${PODMAN[@]}" run --rm --network host "${PODMAN_LIMITS[@]}" "$base" /bin/true 2>&1)"; then
  notrun "podman cannot run a container here: ${out//$'\n'/ }"
fi
# The build context: the source tree as git sees it (tracked + untracked, not ignored),
# without build outputs, node_modules or fixtures.
ctx="$work/context"
rm -rf "$ctx"
mkdir -p "$ctx"
(cd "$src" && git ls-files -z -co --exclude-standard |
  tar --null --exclude='*/node_modules/*' -T - -cf -) | tar -C "$ctx" -xf -
# Built already from the same inputs (the image carries their hash): nothing to do. The
# image depends on the build files, the worker's sources and this folder; the rest of the
# tree is in the context only so that configure finds every CMakeLists.txt.
sum="$(cd "$ctx" && find CMakeLists.txt cmake worker kernels deploy/container -type f -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
have="$("${PODMAN[@]}" image inspect --format '{{index .Labels "worker-orcd.context"}}' "$tag" 2>/dev/null || true)"
if [[ "$have" == "$sum" ]]; then
  echo "build-image: $tag is up to date (context $sum)"
  exit 0
fi
# --layers=false: with vfs every committed layer is a full copy of the rootfs; commit only
# each stage's result (the context hash above is the cache).
t1=$SECONDS
"${PODMAN[@]}" build --format docker --network host "${PODMAN_LIMITS[@]}" --layers=false \
  --label "worker-orcd.context=$sum" --build-arg "BASE=$base" --build-arg "JOBS=$(nproc)" \
  -f "$ctx/deploy/container/Containerfile" -t "$tag" "$ctx" 2>&1 |
  while IFS= read -r line; do echo "[+$((SECONDS - t1))s] $line"; done >"$work/build.log" ||
  { tail -40 "$work/build.log"; echo "build-image: podman build failed (log: $work/build.log)" >&2; exit 1; }
# Where the time went, per step (the log has the elapsed seconds of every line).
grep -E '^\[\+[0-9]+s\] (\[[0-9]/[0-9]\] STEP|\[[0-9]/[0-9]\] COMMIT)' "$work/build.log" | cut -c1-90
# Untagged leftovers of earlier builds.
"${PODMAN[@]}" image prune -f >/dev/null 2>&1 || true
echo "build-image: $tag built in $((SECONDS - t1)) s ($("${PODMAN[@]}" image inspect --format '{{.Size}}' "$tag") bytes)"
