#!/usr/bin/env bash
# Offline check of Kubernetes manifests (no cluster):
#   1. `kubectl create --dry-run=client --validate=false -o yaml` parses every object. Even
#      in client mode kubectl asks an API server which kinds exist (discovery); it is given
#      a kubeconfig for an address where nothing listens and a fresh discovery cache that
#      lists the kinds used here (Deployment, Service, PersistentVolumeClaim), so it never
#      connects. A new kind must be added to the cache below;
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
export HOME="$tmp/home"
disc="$tmp/cache/discovery/127.0.0.1_1"
mkdir -p "$HOME" "$disc/v1" "$disc/apps/v1"
cat >"$tmp/kubeconfig" <<'KC'
apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: offline, context: {cluster: offline, namespace: default}}]
current-context: offline
users: []
KC
gv() { echo "{\"groupVersion\":\"$1\",\"version\":\"v1\"}"; }
echo "{\"kind\":\"APIGroupList\",\"apiVersion\":\"v1\",\"groups\":[
  {\"name\":\"\",\"versions\":[$(gv v1)],\"preferredVersion\":$(gv v1)},
  {\"name\":\"apps\",\"versions\":[$(gv apps/v1)],\"preferredVersion\":$(gv apps/v1)}]}" \
  >"$disc/servergroups.json"
res() { echo "{\"name\":\"$1\",\"singularName\":\"$2\",\"namespaced\":true,\"kind\":\"$3\",\"verbs\":[\"create\",\"get\",\"list\"]}"; }
echo "{\"kind\":\"APIResourceList\",\"apiVersion\":\"v1\",\"groupVersion\":\"v1\",\"resources\":[
  $(res services service Service),
  $(res persistentvolumeclaims persistentvolumeclaim PersistentVolumeClaim)]}" >"$disc/v1/serverresources.json"
echo "{\"kind\":\"APIResourceList\",\"apiVersion\":\"v1\",\"groupVersion\":\"apps/v1\",\"resources\":[
  $(res deployments deployment Deployment)]}" >"$disc/apps/v1/serverresources.json"
kc=(kubectl --kubeconfig "$tmp/kubeconfig" --cache-dir "$tmp/cache" --request-timeout=5s)
rc=0
: >"$tmp/objects.json"
for f in "$dir"/*.yaml; do
  if ! "${kc[@]}" create --dry-run=client --validate=false -o yaml -f "$f" >"$tmp/out.yaml" \
      2>"$tmp/err" || ! "${kc[@]}" create --dry-run=client --validate=false -o json -f "$f" \
      >>"$tmp/objects.json" 2>>"$tmp/err"; then
    echo "check-manifests: kubectl cannot parse $f: $(cat "$tmp/err")" >&2
    rc=1
  fi
done
((rc == 0)) || exit 1
python3 "$here/check_manifests.py" --split "$tmp/objects.json" "$tmp/list.json" || exit 1
node "$here/schema-check.mjs" "$tmp/list.json" || rc=1
python3 "$here/check_manifests.py" "$tmp/list.json" || rc=1
((rc == 0)) && echo "check-manifests: $dir OK"
exit "$rc"
