#!/usr/bin/env bash
# Offline check of Kubernetes manifests (no cluster):
#   1. kubectl decodes every object (`kubectl label --local ... -o json`: the client-side
#      decoder; `kubectl create --dry-run=client` would ask an API server for discovery);
#   2. the objects against the Kubernetes API schema (kubernetes-models, npm; installed by
#      ci/setup.sh into deploy/k8s/node_modules);
#   3. check_manifests.py: what the worker needs (one GPU per pod, probes on /health, a
#      grace period that covers the worker's shutdown, Service ports and selectors match).
# Usage: check-manifests.sh [DIR]   (default: deploy/k8s). Exit 0 only when all pass.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:-$here}"
command -v kubectl >/dev/null || { echo "check-manifests: kubectl not found (kubernetes-client)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# kubectl writes a cache under $HOME/.kube; keep it out of the real home.
export HOME="$tmp/home" KUBECONFIG=/dev/null
rc=0
: >"$tmp/objects.json"
for f in "$dir"/*.yaml; do
  if ! kubectl label --local --dry-run=client -f "$f" "worker-orcd.check/parsed=yes" -o json \
      >>"$tmp/objects.json" 2>"$tmp/err"; then
    echo "check-manifests: kubectl cannot decode $f: $(cat "$tmp/err")" >&2
    rc=1
  fi
done
((rc == 0)) || exit 1
python3 "$here/check_manifests.py" --split "$tmp/objects.json" "$tmp/list.json" || exit 1
node "$here/schema-check.mjs" "$tmp/list.json" || rc=1
python3 "$here/check_manifests.py" "$tmp/list.json" || rc=1
((rc == 0)) && echo "check-manifests: $dir OK"
exit "$rc"
