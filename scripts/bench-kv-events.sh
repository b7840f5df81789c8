#!/usr/bin/env bash
# Issue 38 item 6 with real processes: `mc bench store --op put
# --value-size 4K --batch 32` against `mc serve store` with KV events
# enabled and a subscriber attached, and with events disabled, alternated
# for PAIRS pairs; prints each run, each pair's ratio and the ratio of the
# medians. The subscriber only receives (Debian's python3-zmq): a router
# decodes on its own machine. (BenchmarkKVEventsPut in pkg/store/server
# measures the same in one process.)
#
#   scripts/bench-kv-events.sh [MC] [PAIRS] [DURATION]
set -uo pipefail
MC=${1:-bin/mc}
PAIRS=${2:-6}
DUR=${3:-6s}
MC=$(cd "$(dirname "$MC")" && pwd)/$(basename "$MC")
[ -x "$MC" ] || { echo "no mc binary at $MC (make build)"; exit 1; }
/usr/bin/python3 -c 'import zmq' 2>/dev/null || { echo "needs Debian's python3-zmq (apt-get install python3-zmq)"; exit 1; }
W=$(mktemp -d /tmp/mc-kvevents.XXXXXX)
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=(); }
trap 'stop_all; rm -rf "$W"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat >"$W/sub.py" <<'PY'
import signal, sys, zmq
s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.connect(sys.argv[1])
n = 0
signal.signal(signal.SIGTERM, lambda *a: (print(n), sys.exit(0)))
while True:
    s.recv_multipart(); n += 1
PY

run() { # on|off -> objects/s on stdout
	local rp ap ep extra=()
	rp=$(port); ap=$(port); ep=$(port)
	[ "$1" = on ] && extra=(--enable_kv_events --kv_events_bind_endpoint "tcp://127.0.0.1:$ep" --kv_events_backend_id bench)
	"$MC" serve store --rpc_port "$rp" --metrics_port "$ap" --metrics-address 127.0.0.1 --segment-size 2G \
		--local-hostname 127.0.0.1 --protocol tcp "${extra[@]}" >"$W/srv.log" 2>&1 & PIDS+=($!)
	for _ in $(seq 300); do grep -q 'bytes populated in' "$W/srv.log" && break; sleep 0.1; done
	if [ "$1" = on ]; then
		/usr/bin/python3 "$W/sub.py" "tcp://127.0.0.1:$ep" >"$W/sub.out" & PIDS+=($!)
		sleep 0.5
	fi
	"$MC" bench store --master "127.0.0.1:$rp" --admin "http://127.0.0.1:$ap" --op put --value-size 4K --batch 32 \
		--duration "$DUR" --protocol tcp -o json >"$W/bench.json" 2>"$W/bench.err"
	python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; assert not r["errors"], r; print("%.0f" % r["ops_per_sec"])' "$W/bench.json" \
		|| { echo "run $1 failed: $(tail -2 "$W/bench.err")" >&2; stop_all; return 1; }
	stop_all
}

ON=(); OFF=()
for i in $(seq "$PAIRS"); do
	off=$(run off) || exit 1
	on=$(run on) || exit 1
	OFF+=("$off"); ON+=("$on")
	echo "pair $i: off $off objects/s, on $on objects/s, on/off $(python3 -c "print('%.3f' % ($on / $off))")"
done
python3 - "${#ON[@]}" "${ON[@]}" "${OFF[@]}" <<'PY'
import statistics, sys
n = int(sys.argv[1]); on = list(map(float, sys.argv[2:2 + n])); off = list(map(float, sys.argv[2 + n:]))
print("median on %.0f, off %.0f objects/s: on/off %.3f (goal >= 0.95); per-pair median %.3f"
      % (statistics.median(on), statistics.median(off), statistics.median(on) / statistics.median(off),
         statistics.median(a / b for a, b in zip(on, off))))
PY
