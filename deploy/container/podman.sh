# shellcheck shell=bash disable=SC2034  # sourced; the arrays are used by the caller
# Sourced: PODMAN=(podman + the options that let it run nested in a CI sandbox as root):
# storage under $PODMAN_ROOT (a build tree, vfs: no overlay mounts needed), cgroupfs and
# file events (no systemd), runc (crun refuses hybrid cgroup v1/v2 hosts).
PODMAN_ROOT="${PODMAN_ROOT:?set PODMAN_ROOT to a folder in the build tree}"
# The runroot (sockets, locks) must be a short path: one per storage folder under /tmp.
PODMAN_RUNROOT="/tmp/worker-orcd-podman-$(printf %s "$PODMAN_ROOT" | md5sum | cut -c1-12)"
PODMAN=(podman --root "$PODMAN_ROOT/storage" --runroot "$PODMAN_RUNROOT"
  --storage-driver vfs --cgroup-manager cgroupfs --events-backend file
  --runtime "${PODMAN_RUNTIME:-runc}")
# Containers may not raise limits above the caller's (no CAP_SYS_RESOURCE in a sandbox).
PODMAN_LIMITS=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit "nproc=4096:4096")
