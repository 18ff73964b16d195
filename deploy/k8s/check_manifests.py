#!/usr/bin/python3
"""Structural checks of the worker-orcd Kubernetes objects (kubectl's JSON output): what
the worker needs beyond the API schema. Exit 1 with one line per problem.

  check_manifests.py --split CONCATENATED.json LIST.json   (kubectl -o json of several
                                                           files -> one List)
  check_manifests.py LIST.json
"""
import json
import re
import sys

SHUTDOWN_S = 5  # the worker's own graceful-shutdown deadline (M0-W-1630)


def split(src, dst):
    text, dec, i, items = open(src).read(), json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        obj, i = dec.raw_decode(text, i)
        items.extend(obj["items"] if obj.get("kind") == "List" else [obj])
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, open(dst, "w"))


def args_map(args):
    """--k=v and --k v forms -> {k: v}."""
    out, it = {}, iter(range(len(args)))
    for i in it:
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            out[k] = v
        elif a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[a[2:]] = args[i + 1]
            next(it, None)
        elif a.startswith("--"):
            out[a[2:]] = ""
    return out


def check(items):
    errs = []
    by_kind = {}
    for o in items:
        by_kind.setdefault(o.get("kind"), []).append(o)
    deps = by_kind.get("Deployment", [])
    if not deps:
        errs.append("no Deployment")
    pod_labels, ports = [], {}
    for d in deps:
        name = "Deployment/" + d["metadata"]["name"]
        spec, tmpl = d.get("spec", {}), d.get("spec", {}).get("template", {})
        labels = tmpl.get("metadata", {}).get("labels", {})
        pod_labels.append(labels)
        sel = spec.get("selector", {}).get("matchLabels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            errs.append(f"{name}: selector {sel} does not match the pod labels {labels}")
        pod = tmpl.get("spec", {})
        workers = [c for c in pod.get("containers", []) if "worker-orcd" in c.get("image", "")]
        if len(workers) != 1:
            errs.append(f"{name}: want exactly one worker-orcd container, found {len(workers)}")
            continue
        c = workers[0]
        cname = f"{name} container {c.get('name')}"
        limits = c.get("resources", {}).get("limits", {})
        if str(limits.get("nvidia.com/gpu")) != "1":
            errs.append(f"{cname}: resources.limits nvidia.com/gpu must be 1 (one GPU per worker), "
                        f"got {limits.get('nvidia.com/gpu')}")
        a = args_map(c.get("args", []) + c.get("command", [])[1:])
        if a.get("bind") != "0.0.0.0":
            errs.append(f"{cname}: --bind=0.0.0.0 is needed to be reachable from outside the pod")
        port = a.get("port", "8080")
        named = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
        if str(port) not in [str(p) for p in named.values()]:
            errs.append(f"{cname}: --port {port} is not a containerPort ({named})")
        ports.update(named)
        model = a.get("model", "")
        mounts = {m.get("name"): m.get("mountPath", "") for m in c.get("volumeMounts", [])}
        vols = {v.get("name"): v for v in pod.get("volumes", [])}
        mount = [n for n, p in mounts.items() if p and model.startswith(p.rstrip("/") + "/")]
        if not mount:
            errs.append(f"{cname}: --model {model!r} is not under a volumeMount ({mounts})")
        elif mount[0] not in vols:
            errs.append(f"{cname}: volumeMount {mount[0]} has no volume")
        else:
            claim = vols[mount[0]].get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in [p["metadata"]["name"]
                                       for p in by_kind.get("PersistentVolumeClaim", [])]:
                errs.append(f"{cname}: volume {mount[0]} claims {claim}, which is not defined")

        def probe_ok(p, want_healthy):
            if not p:
                return False
            if "httpGet" in p:
                return p["httpGet"].get("path") == "/health" and not want_healthy
            cmd = " ".join(p.get("exec", {}).get("command", []))
            return "worker-orcd-probe" in cmd and (not want_healthy or "healthy" in cmd)
        if not probe_ok(c.get("readinessProbe"), True):
            errs.append(f"{cname}: readinessProbe must require /health status healthy "
                        "(worker-orcd-probe PORT healthy; /health answers 200 while draining)")
        if not probe_ok(c.get("livenessProbe"), False):
            errs.append(f"{cname}: livenessProbe must GET /health")
        sp = c.get("startupProbe")
        if not probe_ok(sp, False):
            errs.append(f"{cname}: startupProbe must GET /health (503 while the model loads)")
        elif sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3) < 60:
            errs.append(f"{cname}: startupProbe allows less than 60 s to load the model")
        pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pre_s = int(pre[-1]) if pre and pre[0].endswith("sleep") and pre[-1].isdigit() else 0
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace < pre_s + SHUTDOWN_S:
            errs.append(f"{name}: terminationGracePeriodSeconds {grace} < preStop {pre_s} s + "
                        f"the worker's {SHUTDOWN_S} s shutdown")
    for s in by_kind.get("Service", []):
        name = "Service/" + s["metadata"]["name"]
        sel = s.get("spec", {}).get("selector", {})
        if not sel or not any(all(l.get(k) == v for k, v in sel.items()) for l in pod_labels):
            errs.append(f"{name}: selector {sel} matches no worker pod")
        for p in s.get("spec", {}).get("ports", []):
            t = p.get("targetPort", p.get("port"))
            if (isinstance(t, str) and not re.fullmatch(r"\d+", t) and t not in ports) or (
                    (isinstance(t, int) or str(t).isdigit())
                    and int(t) not in [int(v) for v in ports.values()]):
                errs.append(f"{name}: targetPort {t} is not a worker containerPort ({ports})")
    return errs


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--split":
        split(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    items = json.load(open(sys.argv[1]))["items"]
    errs = check(items)
    for e in errs:
        print("structure: " + e, file=sys.stderr)
    if not errs:
        print(f"structure: {len(items)} objects OK")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
