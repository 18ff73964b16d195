#!/usr/bin/env bash
# Starts one worker-orcd per visible GPU on this host (--gpu-device i, ports in sequence),
# writes the matching nginx block (deploy/nginx/make-upstream.sh) and waits. SIGTERM or
# SIGINT is passed on to every worker (each drains and exits within 5 s, M0-W-1630); the
# script exits 0 when all of them exited 0.
#
#   deploy/launch-host.sh --model /models/model.gguf [--base-port 8081] [--bind 127.0.0.1]
#                         [--out /run/worker-orcd] [--worker-bin PATH] [-- worker args...]
#
# The upstream block goes to OUT/worker-orcd-upstream.conf (include it at nginx's http
# level next to deploy/nginx/worker-orcd-locations.conf; deploy/nginx/nginx.conf does).
# Env: GPUS=N overrides the GPU count (default: lines of `nvidia-smi -L`);
#      BACKEND=cpu runs CPU workers (for testing the launcher without GPUs);
#      READY_TIMEOUT seconds to wait for every worker to load (default 600).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model="" base_port=8081 bind=127.0.0.1 out="${TMPDIR:-/tmp}/worker-orcd-host"
bin="$(command -v worker-orcd || true)"
extra=()
while (($#)); do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --bind) bind="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --worker-bin) bin="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "launch-host: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "launch-host: --model is required" >&2; exit 2; }
[[ -x "$bin" ]] || { echo "launch-host: worker-orcd not found (--worker-bin)" >&2; exit 2; }
if [[ -n "${GPUS:-}" ]]; then
  gpus="$GPUS"
else
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
fi
if ! [[ "$gpus" =~ ^[0-9]+$ ]] || ((gpus == 0)); then
  echo "launch-host: no GPU visible (nvidia-smi -L); set GPUS=N to override" >&2
  exit 1
fi
backend="${BACKEND:-cuda}"
mkdir -p "$out"

pids=() specs=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
}
trap 'stop_all' TERM INT
for ((i = 0; i < gpus; i++)); do
  port=$((base_port + i))
  id="$(cat /proc/sys/kernel/random/uuid)"
  "$bin" --model "$model" --backend "$backend" --gpu-device "$i" --bind "$bind" --port "$port" \
    --worker-id "$id" "${extra[@]}" 2>"$out/worker-$i.log" &
  pids+=($!)
  # nginx reaches a worker bound to 0.0.0.0 over loopback.
  addr="$bind"
  [[ "$addr" == 0.0.0.0 ]] && addr=127.0.0.1
  specs+=("$id=$addr:$port")
  echo "launch-host: worker $i (gpu $i) pid $! port $port id $id log $out/worker-$i.log"
done
printf '%s\n' "${pids[@]}" >"$out/workers.pids"
"$here/nginx/make-upstream.sh" "${specs[@]}" >"$out/worker-orcd-upstream.conf.tmp"
mv "$out/worker-orcd-upstream.conf.tmp" "$out/worker-orcd-upstream.conf"
echo "launch-host: wrote $out/worker-orcd-upstream.conf"

# Ready when every worker reports "status":"healthy".
deadline=$((SECONDS + ${READY_TIMEOUT:-600}))
for ((i = 0; i < gpus; i++)); do
  until "$here/container/worker-orcd-probe" $((base_port + i)) healthy 2>/dev/null; do
    kill -0 "${pids[$i]}" 2>/dev/null ||
      { echo "launch-host: worker $i exited during start (log: $out/worker-$i.log)" >&2; stop_all; wait; exit 1; }
    ((SECONDS < deadline)) ||
      { echo "launch-host: worker $i not healthy after ${READY_TIMEOUT:-600} s" >&2; stop_all; wait; exit 1; }
    sleep 0.2
  done
done
echo "launch-host: all $gpus workers healthy"

# Wait for every worker; `wait` returns early when a trapped signal arrives, so loop.
rc=0
for p in "${pids[@]}"; do
  while :; do
    set +e
    wait "$p"
    st=$?
    set -e
    # 127: already reaped; >128 with the process still alive: interrupted by our trap.
    if ((st > 128)) && kill -0 "$p" 2>/dev/null; then continue; fi
    break
  done
  ((st == 0 || st == 127)) || { echo "launch-host: worker pid $p exited $st" >&2; rc=1; }
done
exit "$rc"
