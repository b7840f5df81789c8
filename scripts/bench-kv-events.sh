#!/usr/bin/env bash
# Issue 38 item 6 with real processes: `mc bench store --op put
# --value-size 4K --batch 32` against `mc serve store` with KV events
# enabled and a subscriber attached, and with events disabled, alternated
# for PAIRS pairs (off then on, each server fresh).
#
# Throughput on this shared 2-core VM swings by more than the difference,
# so besides each pair's ratio (and their median, spread and the ratio of
# the medians) it reports what the feature costs in CPU, which other work
# moves far less: the server's and the subscriber's user+system time
# (/proc/PID/stat) per object put, over the steady part of each run (from
# 0.5 s after the first put ends to 1 s before the run ends; objects from
# the master's master_batch_put_end_items_total), on against off, and the
# messages and events per message published. The subscriber receives
# every message (Debian's python3-zmq recv_multipart) without decoding
# it: a router decodes on its own machine.
#
#   scripts/bench-kv-events.sh [MC] [PAIRS] [SECONDS]
#
# MC_KV_EVENTS_FLAGS adds flags to the events-on server (e.g.
# "--kv-events-max-batch 64 --kv-events-pace 0": mooncake_master's sends).
set -uo pipefail
MC=${1:-bin/mc}
PAIRS=${2:-10}
DUR=${3:-4}
MC=$(cd "$(dirname "$MC")" && pwd)/$(basename "$MC")
[ -x "$MC" ] || { echo "no mc binary at $MC (make build)"; exit 1; }
/usr/bin/python3 -c 'import zmq' 2>/dev/null || { echo "needs Debian's python3-zmq (apt-get install python3-zmq)"; exit 1; }
W=$(mktemp -d /tmp/mc-kvevents.XXXXXX)
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=(); }
trap 'stop_all; rm -rf "$W"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TCK=$(getconf CLK_TCK)
cpu() { [ -n "${1:-}" ] && awk -v t="$TCK" '{print ($14+$15)/t}' "/proc/$1/stat" 2>/dev/null || echo 0; }
cat >"$W/sub.py" <<'PY'
import sys, zmq
s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.connect(sys.argv[1])
while True:
    s.recv_multipart()
PY

# metrics ADMIN -> "put_items batches events"
metrics() {
	curl -s "http://127.0.0.1:$1/metrics" | awk '
		/^master_batch_put_end_items_total /{p=$2} /^master_kv_events_published_batches_total /{m=$2}
		/^master_kv_events_published_events_total /{e=$2} END{printf "%d %d %d", p, m, e}'
}

run() { # on|off -> "objects/s server_us/object subscriber_us/object messages/s events/message" on stdout
	local rp ap ep extra=() srv sub="" bp t0 a b
	rp=$(port); ap=$(port); ep=$(port)
	# shellcheck disable=SC2206 # MC_KV_EVENTS_FLAGS is split into flags on purpose
	[ "$1" = on ] && extra=(--enable_kv_events --kv_events_bind_endpoint "tcp://127.0.0.1:$ep" --kv_events_backend_id bench ${MC_KV_EVENTS_FLAGS:-})
	"$MC" serve store --rpc_port "$rp" --metrics_port "$ap" --metrics-address 127.0.0.1 --segment-size 2G \
		--local-hostname 127.0.0.1 --protocol tcp "${extra[@]}" >"$W/srv.log" 2>&1 & srv=$!; PIDS+=($srv)
	for _ in $(seq 300); do grep -q 'bytes populated in' "$W/srv.log" && break; sleep 0.1; done
	if [ "$1" = on ]; then
		/usr/bin/python3 "$W/sub.py" "tcp://127.0.0.1:$ep" >"$W/sub.out" & sub=$!; PIDS+=($sub)
		sleep 0.5
	fi
	"$MC" bench store --master "127.0.0.1:$rp" --admin "http://127.0.0.1:$ap" --op put --value-size 4K --batch 32 \
		--duration "${DUR}s" --protocol tcp -o json >"$W/bench.json" 2>"$W/bench.err" & bp=$!
	for _ in $(seq 400); do [ "$(metrics "$ap" | cut -d' ' -f1)" != 0 ] && break; sleep 0.025; done
	t0=$(date +%s.%N)
	sleep 0.5; a="$(date +%s.%N) $(cpu $srv) $(cpu "$sub") $(metrics "$ap")"
	sleep "$(python3 -c "import time; print(max(0.5, $t0 + $DUR - 1 - time.time()))")"
	b="$(date +%s.%N) $(cpu $srv) $(cpu "$sub") $(metrics "$ap")"
	wait $bp
	python3 - "$W/bench.json" "$a" "$b" <<'PY' || { echo "run $1 failed: $(tail -2 "$W/bench.err")" >&2; stop_all; return 1; }
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
assert not r["errors"], r
a, b = (list(map(float, s.split())) for s in sys.argv[2:4])
d = [y - x for x, y in zip(a, b)]
objs = d[3]
print("%.0f %.3f %.3f %.1f %.2f" % (r["ops_per_sec"], d[1] / objs * 1e6, d[2] / objs * 1e6, d[4] / d[0], d[5] / max(d[4], 1)))
PY
	stop_all
}

: >"$W/runs"
for i in $(seq "$PAIRS"); do
	off=$(run off) || exit 1
	on=$(run on) || exit 1
	echo "$off $on" >>"$W/runs"
	python3 - "$i" $off $on <<'PY'
import sys
i = sys.argv[1]; f = list(map(float, sys.argv[2:]))
off, on = f[:5], f[5:]
print("pair %s: off %6.0f objects/s (server %5.2f us/object), on %6.0f (server %5.2f, subscriber %4.2f us/object; %.1f events/message), on/off %.3f"
      % (i, off[0], off[1], on[0], on[1], on[2], on[4], on[0] / off[0]))
PY
done
python3 - "$W/runs" <<'PY'
import statistics as st, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
off = [r[:5] for r in rows]; on = [r[5:] for r in rows]
ratios = sorted(b[0] / a[0] for a, b in zip(off, on))
q = st.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
med = lambda xs: st.median(xs)
print("on/off per pair: median %.3f (goal >= 0.95), quartiles %.3f-%.3f, range %.3f-%.3f over %d pairs"
      % (med(ratios), q[0], q[2], ratios[0], ratios[-1], len(ratios)))
print("objects/s: median on %.0f, off %.0f: %.3f" % (med([r[0] for r in on]), med([r[0] for r in off]),
      med([r[0] for r in on]) / med([r[0] for r in off])))
son, soff = med([r[1] for r in on]), med([r[1] for r in off])
print("server CPU per object: median on %.2f us, off %.2f us (events add %+.2f us, %+.1f%%); subscriber %.2f us/object"
      % (son, soff, son - soff, (son / soff - 1) * 100, med([r[2] for r in on])))
print("published: %.0f messages/s, %.1f events/message (medians of the on runs)"
      % (med([r[3] for r in on]), med([r[4] for r in on])))
PY
