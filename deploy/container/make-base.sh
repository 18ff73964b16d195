#!/usr/bin/env bash
# Makes the Debian base image of the Containerfile without any image registry:
# debootstrap (minbase) from the Debian mirror that apt uses on this machine, then
# `podman import`. The rootfs tarball is cached in the given work folder (a build tree),
# so a rebuild skips debootstrap.
#   Usage: make-base.sh WORKDIR IMAGE_NAME      (podman options: $PODMAN, see podman.sh)
# Env: DEBIAN_SUITE (default: this machine's, from /etc/os-release), DEBIAN_MIRROR
# (default: the first deb.debian.org-style URI in /etc/apt/sources.list*).
set -euo pipefail
work="$1" image="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=deploy/container/podman.sh
source "$here/podman.sh"

suite="${DEBIAN_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}"
mirror="${DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  # deb822 (URIs:) or one-line (deb URI suite ...) sources; skip security/updates lines.
  mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '/^URIs:/ {print $2}' | grep -v -- '-security' | head -1)"
  [[ -n "$mirror" ]] || mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' |
    grep -v -- '-security' | head -1)"
fi
[[ -n "$mirror" ]] || { echo "make-base: no Debian mirror found in /etc/apt/sources.list*" >&2; exit 1; }

mkdir -p "$work"
tarball="$work/debian-$suite-minbase.tar"
if [[ ! -s "$tarball" ]]; then
  root="$work/rootfs-$suite"
  rm -rf "$root"
  echo "make-base: debootstrap --variant=minbase $suite from $mirror"
  t0=$SECONDS
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -30 "$work/debootstrap.log" >&2; echo "make-base: debootstrap failed" >&2; exit 1; }
  # apt inside the image uses the same mirror; no docs, no apt caches in the layers.
  echo "deb $mirror $suite main" >"$root/etc/apt/sources.list"
  if [[ "$mirror" == *deb.debian.org* || -n "${DEBIAN_SECURITY_MIRROR:-}" ]]; then
    echo "deb ${DEBIAN_SECURITY_MIRROR:-${mirror%/debian}/debian-security} $suite-security main" \
      >>"$root/etc/apt/sources.list"
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$root"
  echo "make-base: rootfs $(du -sh "$tarball" | cut -f1) in $((SECONDS - t0)) s"
fi
"${PODMAN[@]}" import -q --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
echo "make-base: imported $image"
