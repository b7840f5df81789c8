#!/usr/bin/env bash
# mc against the real Mooncake Store, one line per case.
#
#   scripts/mooncake-interop.sh BUILD_DIR [MC]
#
# BUILD_DIR is the build directory of ../shared/tools/build-mooncake.sh
# (it holds mooncake-store/src/mooncake_master, mooncake_client,
# master_bench and the Python `store` module); MC the mc binary (default
# bin/mc). Everything runs on loopback ports picked here; every process it
# starts is stopped at the end. Exit status: the number of failed cases.
#
# Cases: an mc client against mooncake_master with a mooncake_client
# segment (P2PHANDSHAKE and HTTP metadata); an mc node in the pool, read
# and written by Mooncake's Python MooncakeDistributedStore; mc bench store
# against mooncake_master; mooncake_master restarted mid-run; Mooncake's
# clients on mc serve store, the Python one reading objects off mc's disk
# tier; the KV events of mooncake_master and of mc serve store for the
# same calls, decoded by libzmq and compared field by field (a build made
# with -DENABLE_KV_EVENTS=ON); tenants (two Python clients with tenant_id a
# and b, the same key, on mooncake_master and on mc serve store, each
# --enable_multi_tenants); a leader failover under --enable_ha with the
# Python client carrying on, on mc's candidates and on mooncake_master's
# (only with a build made with -DSTORE_USE_ETCD=ON; one SKIP line otherwise).
set -uo pipefail
BUILD=${1:?usage: mooncake-interop.sh BUILD_DIR [MC]}
MC=${2:-bin/mc}
MC=$(cd "$(dirname "$MC")" && pwd)/$(basename "$MC")
MASTER=$BUILD/mooncake-store/src/mooncake_master
CLIENT=$(find "$BUILD" -name mooncake_client -type f -perm -u+x | head -1)
PYSTORE=$(find "$BUILD" -name 'store*.so' | head -1)
[ -x "$MASTER" ] || { echo "no mooncake_master in $BUILD"; exit 1; }
[ -x "$MC" ] || { echo "no mc binary at $MC (make build)"; exit 1; }

W=$(mktemp -d /tmp/mc-interop.XXXXXX)
PIDS=()
fails=0
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

pass() { printf 'PASS  %-58s %s\n' "$1" "${2:-}"; }
fail() { printf 'FAIL  %-58s %s\n' "$1" "${2:-}"; fails=$((fails + 1)); }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

start_master() { # port metrics-port [extra flags]
	local p=$1 mp=$2; shift 2
	"$MASTER" --rpc_port "$p" --metrics_port "$mp" "$@" >>"$W/master.log" 2>&1 &
	MPID=$!; PIDS+=("$MPID"); wait_port "$p"
}

RP=$(port); AP=$(port); HP=$(port)
start_master "$RP" "$AP" --enable_http_metadata_server --http_metadata_server_port "$HP" || { echo "mooncake_master did not start: $W/master.log"; exit 1; }
M=mooncake://127.0.0.1:$RP
ADMIN=http://127.0.0.1:$AP

# ---- an mc client against mooncake_master with a mooncake_client segment
run_client_cases() { # label metadata-server
	local label=$1 meta=$2 cport
	cport=$(port)
	if [ -z "$CLIENT" ]; then fail "$label: mooncake_client segment" "no mooncake_client in $BUILD"; return; fi
	"$CLIENT" --master_server_address "127.0.0.1:$RP" --host 127.0.0.1 --port "$cport" \
		--global_segment_size "256 MB" --metadata_server "$meta" --protocol tcp >"$W/client-$label.log" 2>&1 &
	local cpid=$!; PIDS+=("$cpid")
	for _ in $(seq 100); do curl -sf "$ADMIN/get_all_segments" | grep -q . && break; sleep 0.1; done
	local mcf=(--master "$M" --admin "$ADMIN" --metadata-server "$meta")
	head -c 1048573 /dev/urandom >"$W/v1m"; head -c $((64 << 20)) /dev/urandom >"$W/v64m"
	if "$MC" store put "$label/a:1@r0" "$W/v1m" "${mcf[@]}" >/dev/null && "$MC" store get "$label/a:1@r0" "${mcf[@]}" | cmp -s - "$W/v1m"; then
		pass "$label: put + get 1 MiB, byte-exact"; else fail "$label: put + get 1 MiB, byte-exact"; fi
	if "$MC" store put "$label/big" "$W/v64m" "${mcf[@]}" >/dev/null && "$MC" store get "$label/big" "${mcf[@]}" | cmp -s - "$W/v64m"; then
		pass "$label: put + get 64 MiB, byte-exact"; else fail "$label: put + get 64 MiB, byte-exact"; fi
	: >"$W/empty"
	out=$("$MC" store put "$label/empty" "$W/empty" "${mcf[@]}" 2>&1)
	case $out in *INVALID_PARAMS*) pass "$label: 0-byte value refused as mooncake_master does" "INVALID_PARAMS";; *) fail "$label: 0-byte value" "$out";; esac
	out=$("$MC" store exists "$label/a:1@r0" "${mcf[@]}" 2>&1)
	case $out in *exists) pass "$label: exists";; *) fail "$label: exists" "$out";; esac
	out=$("$MC" store get "$label/missing" "${mcf[@]}" 2>&1)
	case $out in *OBJECT_NOT_FOUND*) pass "$label: missing key" "OBJECT_NOT_FOUND";; *) fail "$label: missing key" "$out";; esac
	out=$(curl -s "$ADMIN/query_key?key=$label/a:1@r0")
	case $out in *"$cport"*|*127.0.0.1*) pass "$label: the replica is on the mooncake_client segment";; *) fail "$label: replica placement" "$out";; esac
	if "$MC" store rm "$label/a:1@r0" --force "${mcf[@]}" >/dev/null && ! "$MC" store exists "$label/a:1@r0" "${mcf[@]}" >/dev/null 2>&1; then
		pass "$label: rm"; else fail "$label: rm"; fi
	"$MC" store rm "$label/big" --force "${mcf[@]}" >/dev/null 2>&1
	# Puts at 4 KiB only: the 256 MB segment fills in a second at 64 KiB,
	# and mooncake_master answers NO_AVAILABLE_HANDLE rather than evict
	# inside a put.
	out=$( { "$MC" bench store --master "$M" --admin "$ADMIN" --metadata-server "$meta" --value-size 4K --batch 8 --keys 512 --op put,get --verify --duration 2s -o json &&
		"$MC" bench store --master "$M" --admin "$ADMIN" --metadata-server "$meta" --value-size 64K --batch 8 --keys 512 --op get --verify --duration 2s -o json; } 2>&1)
	if echo "$out" | python3 -c 'import json,sys; d=json.JSONDecoder(); t=sys.stdin.read().strip(); rows=[]
while "{" in t:
    t=t[t.index("{"):]; o,i=d.raw_decode(t); rows+=o["results"]; t=t[i:].strip()
assert len(rows)==3 and all(r["errors"]==0 and r["corrupt"]==0 and r["ops_per_sec"]>0 for r in rows), rows
print(" ".join("%s %s %.0f/s" % (r["value_size"], r["op"], r["ops_per_sec"]) for r in rows))' >"$W/bench-$label.txt" 2>&1; then
		pass "$label: batch put/get (bench store --batch 8 --verify)" "$(cat "$W/bench-$label.txt")"
	else fail "$label: batch put/get" "$(tail -3 "$W/bench-$label.txt")"; fi
	kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
	# Its segment goes at once when it unmounts on SIGTERM. Built with etcd
	# it dies of SIGTERM instead (Go's threads, started when the etcd
	# library loads, do not block the signal its sigwait thread waits
	# for), and mooncake_master drops it after --client_ttl (10 s).
	for _ in $(seq 150); do curl -sf "$ADMIN/get_all_segments" | grep -q . || break; sleep 0.1; done
}
run_client_cases p2p P2PHANDSHAKE
run_client_cases http "http://127.0.0.1:$HP/metadata"

# ---- an mc node in the pool, read and written by Mooncake's Python client
NODE_HOST=127.0.0.1:$(port)
"$MC" serve store --master_server_address "$M" --global_segment_size "256 MB" --host "$NODE_HOST" \
	--metadata_server "http://127.0.0.1:$HP/metadata" >"$W/node.log" 2>&1 &
NPID=$!; PIDS+=("$NPID")
for _ in $(seq 100); do curl -sf "$ADMIN/get_all_segments" | grep -q "$NODE_HOST" && break; sleep 0.1; done
if curl -sf "$ADMIN/get_all_segments" | grep -q "$NODE_HOST"; then pass "mc node: mounted on mooncake_master" "$NODE_HOST"; else fail "mc node: mounted on mooncake_master" "$(tail -2 "$W/node.log")"; fi
if [ -n "$PYSTORE" ]; then
	# The module links libraries of the build (libasio, ...) by name.
	LIBS=$(find "$BUILD" -name '*.so*' -type f -printf '%h\n' | sort -u | paste -sd:)
	out=$(LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") python3 - "$RP" "$HP" "$MC" "$M" <<'EOF' 2>&1
import os, subprocess, sys
from store import MooncakeDistributedStore
rp, hp, mc, m = sys.argv[1:5]
s = MooncakeDistributedStore()
# No segment of its own: every byte it puts lands on the mc node.
rc = s.setup("127.0.0.1", "http://127.0.0.1:%s/metadata" % hp, 0, 64 << 20, "tcp", "", "127.0.0.1:%s" % rp)
assert rc == 0, "setup: %d" % rc
v = os.urandom(3 << 20)
assert s.put("py/from-python", v) == 0, "put"
got = subprocess.run([mc, "store", "get", "py/from-python", "--master", m, "--metadata-server", "http://127.0.0.1:%s/metadata" % hp], capture_output=True).stdout
assert got == v, "mc read %d bytes of %d" % (len(got), len(v))
w = os.urandom(1 << 20 | 7)
open("/tmp/mc-interop-w", "wb").write(w)
subprocess.run([mc, "store", "put", "py/from-mc", "/tmp/mc-interop-w", "--master", m, "--metadata-server", "http://127.0.0.1:%s/metadata" % hp], check=True, capture_output=True)
assert s.get("py/from-mc") == w, "python read back"
print("ok")
EOF
)
	case $out in *ok) pass "mc node: Python put -> mc get, mc put -> Python get, byte-exact";; *) fail "mc node: Python MooncakeDistributedStore" "$(echo "$out" | tail -2)";; esac
else
	fail "mc node: Python MooncakeDistributedStore" "no store*.so in $BUILD"
fi

# ---- mooncake_master restarted mid-run
kill "$MPID"; wait "$MPID" 2>/dev/null
start_master "$RP" "$AP" --enable_http_metadata_server --http_metadata_server_port "$HP"
for _ in $(seq 100); do curl -sf "$ADMIN/get_all_segments" | grep -q "$NODE_HOST" && break; sleep 0.1; done
if curl -sf "$ADMIN/get_all_segments" | grep -q "$NODE_HOST"; then pass "master restarted: the mc node re-mounted by itself"; else fail "master restarted: re-mount" "$(tail -2 "$W/node.log")"; fi
head -c 4096 /dev/urandom >"$W/v4k"
if "$MC" store put after/restart "$W/v4k" --master "$M" --metadata-server "http://127.0.0.1:$HP/metadata" >/dev/null &&
	"$MC" store get after/restart --master "$M" --metadata-server "http://127.0.0.1:$HP/metadata" | cmp -s - "$W/v4k"; then
	pass "master restarted: put + get on the re-mounted mc node"; else fail "master restarted: put + get"; fi

# ---- Mooncake's clients against mc serve store (mc's master on the wire)
kill -TERM "$NPID"; wait "$NPID" 2>/dev/null
sleep 1
if curl -sf "$ADMIN/get_all_segments" | grep -q "$NODE_HOST"; then fail "mc node: SIGTERM unmounts its segment"; else pass "mc node: SIGTERM unmounts its segment"; fi
kill "$MPID"; wait "$MPID" 2>/dev/null
XP=$(port); XA=$(port)
# A 64 MiB pool beside the clients' own segments: the Python client's
# last 192 MiB of puts only fit by eviction.
"$MC" serve store --rpc_port "$XP" --metrics_port "$XA" --segment-size "64 MB" --local-hostname 127.0.0.1 \
	--metadata_server P2PHANDSHAKE >"$W/mc-master.log" 2>&1 &
XPID=$!; PIDS+=("$XPID"); wait_port "$XP"
if [ -n "$CLIENT" ]; then
	cport=$(port)
	"$CLIENT" --master_server_address "127.0.0.1:$XP" --host 127.0.0.1 --port "$cport" --global_segment_size "128 MB" \
		--metadata_server P2PHANDSHAKE --protocol tcp >"$W/client-on-mc.log" 2>&1 &
	PIDS+=("$!")
	segs() { curl -sf "http://127.0.0.1:$XA/get_all_segments" | tr -cs '0-9.:A-Za-z_-' '\n' | grep -c ':'; }
	for _ in $(seq 100); do [ "$(segs)" -ge 2 ] && break; sleep 0.1; done
	if [ "$(segs)" -ge 2 ]; then pass "mooncake_client on mc serve store: segment mounted"
	else fail "mooncake_client on mc serve store: mount" "$(curl -s "http://127.0.0.1:$XA/get_all_segments")"; fi
	head -c 3000000 /dev/urandom >"$W/v3m"
	ok=1
	for i in 1 2 3; do
		# Two replicas: one on mc's segment, one on mooncake_client's.
		"$MC" store put "onmc/$i" "$W/v3m" --replicas 2 --master "127.0.0.1:$XP" >/dev/null 2>&1 || ok=0
		"$MC" store get "onmc/$i" --master "127.0.0.1:$XP" | cmp -s - "$W/v3m" || ok=0
		n=$("$MC" store query "onmc/$i" --master "127.0.0.1:$XP" --admin "http://127.0.0.1:$XA" -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); d=d[0] if isinstance(d,list) else d; print(len({r["endpoint"] for r in d["replicas"]}))' 2>/dev/null)
		[ "${n:-0}" = 2 ] || ok=0
	done
	if [ $ok = 1 ]; then pass "mc client put/get through mc's master, a replica on each kind of node"
	else fail "mc client with a mooncake_client segment in mc's pool"; fi
fi
if [ -n "$PYSTORE" ]; then
	out=$(LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") python3 - "$XP" <<'EOF' 2>&1
import os, sys
from store import MooncakeDistributedStore
xp = sys.argv[1]
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "", "127.0.0.1:%s" % xp) == 0, "setup"
v = os.urandom(1 << 20)
assert s.put("pyc/a", v) == 0, "put"
assert s.get("pyc/a") == v, "get"
assert s.is_exist("pyc/a") == 1 and s.is_exist("pyc/none") == 0, "exist"
keys = ["pyc/b%d" % i for i in range(8)]
vals = [os.urandom(4096 * (i + 1)) for i in range(8)]
assert s.put_batch(keys, vals) == 0, "put_batch"
assert s.get_batch(keys) == vals, "get_batch"
assert s.batch_is_exist(keys + ["pyc/none"]) == [1] * 8 + [0], "batch_is_exist"
assert s.put("pyc/c", v) == 0 and s.remove("pyc/c") == 0 and s.is_exist("pyc/c") == 0, "remove"
print("basic ok")
# 256 MiB into the 224 MiB pool: every put succeeds, mc evicts inside it.
failed = [i for i in range(256) if s.put("pyc/fill%d" % i, os.urandom(1 << 20)) != 0]
assert not failed, "%d puts failed in a full store: %s" % (len(failed), failed[:5])
s.close()
print("full ok")
EOF
)
	case $out in *"basic ok"*) pass "Python client on mc serve store: put/get/batch/exist/remove, byte-exact";; *) fail "Python client on mc serve store" "$(echo "$out" | grep -v '^[IWE]20' | tail -2)";; esac
	case $out in *"full ok"*) pass "Python client on mc serve store: 256 MiB into a full pool, all puts succeed";; *) fail "Python client: puts into a full pool" "$(echo "$out" | grep -v '^[IWE]20' | tail -1)";; esac
fi
kill "$XPID"; wait "$XPID" 2>/dev/null

# ---- Mooncake's Python client reading objects that live on mc's disk tier
# 48 MiB of 1 MiB values put through mc into a 16 MiB segment with a disk
# tier: eviction offloads them; the Python client's gets are served by
# the node reading each record back into its segment. A staged copy lives
# as long as its read lease: with the 10 s default a 16 MiB segment
# stages 16 MiB per 10 s, so the lease here is short.
if [ -n "$PYSTORE" ]; then
	DP=$(port); DA=$(port)
	mkdir -p "$W/ssd" "$W/dv"
	"$MC" serve store --rpc_port "$DP" --metrics_port "$DA" --segment-size "16 MB" --ssd-dir "$W/ssd" --ssd-size "256 MB" \
		--default_kv_lease_ttl 500 --local-hostname 127.0.0.1 --metadata_server P2PHANDSHAKE >"$W/mc-disk.log" 2>&1 &
	DPID=$!; PIDS+=("$DPID"); wait_port "$DP"
	ok=1
	for i in $(seq 0 47); do
		head -c 1048576 /dev/urandom >"$W/dv/$i"
		"$MC" store put "disk/$i" "$W/dv/$i" --master "127.0.0.1:$DP" >/dev/null 2>&1 || ok=0
	done
	ondisk=0
	for _ in $(seq 50); do
		ondisk=$(curl -sf "http://127.0.0.1:$DA/metrics" | awk '$1 == "file_cache_nums_" {print int($2)}')
		[ "${ondisk:-0}" -ge 24 ] && break
		sleep 0.1
	done
	if [ $ok = 1 ] && [ "${ondisk:-0}" -ge 24 ]; then pass "mc serve store --ssd-dir: 48 puts into a 16 MiB segment" "$ondisk objects on disk"
	else fail "mc serve store --ssd-dir: offload on eviction" "puts ok=$ok, objects on disk: ${ondisk:-?}"; fi
	out=$(LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") python3 - "$DP" "$W/dv" <<'EOF' 2>&1
import os, sys
from store import MooncakeDistributedStore
dp, d = sys.argv[1], sys.argv[2]
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", "127.0.0.1:%s" % dp) == 0, "setup"
bad = [i for i in range(48) if s.get("disk/%d" % i) != open(os.path.join(d, str(i)), "rb").read()]
assert not bad, "%d gets not byte-exact: %s" % (len(bad), bad[:5])
s.close()
print("disk ok")
EOF
)
	hits=$(curl -sf "http://127.0.0.1:$DA/metrics" | awk '$1 == "file_cache_hit_nums_" {print int($2)}')
	case $out in *"disk ok"*)
		if [ "${hits:-0}" -ge 24 ]; then pass "Python client gets objects from mc's disk tier, byte-exact" "$hits disk hits"
		else fail "Python client gets from mc's disk tier" "byte-exact, but only ${hits:-?} disk hits"; fi;;
	*) fail "Python client gets from mc's disk tier" "$(echo "$out" | grep -v '^[IWE]20' | tail -2)";; esac
	kill "$DPID"; wait "$DPID" 2>/dev/null
fi

# ---- KV events: mooncake_master's publisher and mc's, field by field
# The same operations from Mooncake's Python client (puts of 1234567,
# 0x1f2e and plainkey, then a remove of plainkey) against mooncake_master
# with a mooncake_client segment and against mc serve store, each with
# --enable_kv_events; a ZMQ SUB in Debian's python3 (python3-zmq,
# python3-msgpack: libzmq, not mc's code) decodes both streams, which must
# match in sequence numbers, dp_rank, event fields, their order, their
# types and values (timestamps aside). Needs a build with
# -DENABLE_KV_EVENTS=ON (one SKIP line otherwise).
kv_events_case() {
	local syspy=/usr/bin/python3 kp cp mpid cpid xpid out
	if ! $syspy -c 'import zmq, msgpack' 2>/dev/null; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-zmq python3-msgpack >/dev/null 2>&1
	fi
	if ! $syspy -c 'import zmq, msgpack' 2>/dev/null; then
		fail "KV events: a libzmq subscriber" "no python3-zmq/python3-msgpack for $syspy"
		return
	fi
	cat >"$W/kv.py" <<'PYEOF'
import json, os, sys, time, zmq, msgpack
from store import MooncakeDistributedStore
master, ep, out = sys.argv[1:4]
ctx = zmq.Context(); sub = ctx.socket(zmq.SUB); sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.setsockopt(zmq.RCVTIMEO, 3000); sub.connect(ep)
time.sleep(0.5)
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0, "setup"
for k in ("1234567", "0x1f2e", "plainkey"):
    assert s.put(k, os.urandom(4096)) == 0, "put " + k
assert s.remove("plainkey") == 0, "remove"
msgs = []
while True:
    try: fr = sub.recv_multipart()
    except zmq.Again: break
    ts, evs, dp = msgpack.unpackb(fr[2], raw=False, strict_map_key=False)
    msgs.append({"topic": fr[0].hex(), "seq": int.from_bytes(fr[1], "big"), "dp_rank": dp,
                 "events": [[[k, type(v).__name__, v] for k, v in e.items() if k != "timestamp"] for e in evs]})
json.dump(msgs, open(out, "w"))
PYEOF
	RP=$(port); AP=$(port); kp=$(port); cp=$(port)
	"$MASTER" --rpc_port "$RP" --metrics_port "$AP" --enable_kv_events --kv_events_bind_endpoint "tcp://127.0.0.1:$kp" \
		--kv_events_backend_id be1 >"$W/kv-mooncake.log" 2>&1 &
	mpid=$!; PIDS+=("$mpid"); wait_port "$RP"
	if ! wait_port "$kp"; then
		kill "$mpid" 2>/dev/null; wait "$mpid" 2>/dev/null
		printf 'SKIP  %-58s %s\n' "KV events: mooncake_master's and mc's, field by field" "this build publishes none: needs -DENABLE_KV_EVENTS=ON"
		return
	fi
	"$CLIENT" --master_server_address "127.0.0.1:$RP" --host 127.0.0.1 --port "$cp" --global_segment_size "64 MB" \
		--metadata_server P2PHANDSHAKE --protocol tcp >>"$W/kv-mooncake.log" 2>&1 &
	cpid=$!; PIDS+=("$cpid")
	for _ in $(seq 100); do curl -sf "http://127.0.0.1:$AP/get_all_segments" | grep -q . && break; sleep 0.1; done
	LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") \
		$syspy "$W/kv.py" "127.0.0.1:$RP" "tcp://127.0.0.1:$kp" "$W/kv-mooncake.json" >>"$W/kv-mooncake.log" 2>&1
	kill "$cpid" "$mpid" 2>/dev/null; wait "$cpid" "$mpid" 2>/dev/null
	RP=$(port); AP=$(port); kp=$(port)
	"$MC" serve store --rpc_port "$RP" --metrics_port "$AP" --segment-size 64M --local-hostname 127.0.0.1 \
		--enable_kv_events --kv_events_bind_endpoint "tcp://127.0.0.1:$kp" --kv_events_backend_id be1 >"$W/kv-mc.log" 2>&1 &
	xpid=$!; PIDS+=("$xpid"); wait_port "$RP"
	LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") \
		$syspy "$W/kv.py" "127.0.0.1:$RP" "tcp://127.0.0.1:$kp" "$W/kv-mc.json" >>"$W/kv-mc.log" 2>&1
	kill "$xpid" 2>/dev/null; wait "$xpid" 2>/dev/null
	out=$(python3 - "$W/kv-mooncake.json" "$W/kv-mc.json" <<'PYEOF' 2>&1
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert len(a) == 4, "mooncake_master published %d messages, want 4" % len(a)
assert a == b, "differ:\n mooncake_master %s\n mc              %s" % (a, b)
print("4 messages, %d fields each, identical" % (len(a[0]["events"][0]) + 1))
PYEOF
)
	case $out in
	*identical*) pass "KV events: mooncake_master's and mc's, field by field" "$out" ;;
	*) fail "KV events: mooncake_master's and mc's, field by field" "$(echo "$out" | tail -3)" ;;
	esac
}
if [ -n "$PYSTORE" ] && [ -n "$CLIENT" ]; then
	LIBS=${LIBS:-$(find "$BUILD" -name '*.so*' -type f -printf '%h\n' | sort -u | paste -sd:)}
	kv_events_case
fi

# ---- tenants: two Python clients, tenant_id a and b, the same key
# Against mooncake_master --enable_multi_tenants (with a mooncake_client
# segment) and against mc serve store --enable_multi_tenants, each with
# the same quota policy file: tenant a puts "tk", tenant b does not see
# it, puts its own "tk", reads its own bytes; tenant a still reads its
# own; mc's client with --tenant a reads a's bytes through the same
# master; GET /api/v1/tenant_quotas lists both tenants with their charge.
tenants_case() {
	local label=$1 rp=$2 ap=$3 out
	cat >"$W/tn.py" <<'PYEOF'
import sys
from store import MooncakeDistributedStore
master, tenant, op, key, path = sys.argv[1:6]
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master, tenant_id=tenant) == 0, "setup"
if op == "put":
    assert s.put(key, open(path, "rb").read()) == 0, "put"
elif op == "absent":
    assert s.is_exist(key) == 0, "tenant %s sees %s" % (tenant, key)
elif op == "get":
    assert s.get(key) == open(path, "rb").read(), "tenant %s read other bytes" % tenant
s.close()
print("tn ok")
PYEOF
	head -c 65536 /dev/urandom >"$W/tn-a"; head -c 65536 /dev/urandom >"$W/tn-b"
	local py=(env LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") python3 "$W/tn.py" "127.0.0.1:$rp")
	local steps="" ok=1
	for st in "a put tk $W/tn-a" "b absent tk -" "b put tk $W/tn-b" "b get tk $W/tn-b" "a get tk $W/tn-a"; do
		# shellcheck disable=SC2086
		if "${py[@]}" $st 2>&1 | grep -q "tn ok"; then steps="$steps ok"; else steps="$steps FAIL($st)"; ok=0; fi
	done
	if [ $ok = 1 ]; then pass "$label: tenants a and b, same key, own bytes each" "5 steps"
	else fail "$label: tenants a and b, same key" "$steps"; fi
	if "$MC" store get tk --master "$4" --tenant a --admin "http://127.0.0.1:$ap" 2>"$W/tn-mc.err" | cmp -s - "$W/tn-a"; then
		pass "$label: mc store get --tenant a reads tenant a's bytes"
	else fail "$label: mc store get --tenant a" "$(tail -1 "$W/tn-mc.err")"; fi
	out=$(curl -s "http://127.0.0.1:$ap/api/v1/tenant_quotas" | python3 -c 'import json,sys
d=json.load(sys.stdin); assert d["success"], d
t={x["tenant_id"]: x for x in d["data"]}
assert "a" in t and "b" in t, sorted(t)
assert t["a"]["charged_bytes"] >= 65536 and t["b"]["charged_bytes"] >= 65536, t
print("a charged %d, b charged %d" % (t["a"]["charged_bytes"], t["b"]["charged_bytes"]))' 2>&1)
	case $out in "a charged"*) pass "$label: GET /api/v1/tenant_quotas charges both" "$out";; *) fail "$label: tenant_quotas" "$(echo "$out" | tail -1)";; esac
}
if [ -n "$PYSTORE" ] && [ -n "$CLIENT" ]; then
	printf 'version: 1\ntenants:\n  - name: a\n    quota: 256MB\n  - name: b\n    quota: 256MB\n  - name: default\n    quota: 256MB\n' >"$W/tenants.yaml"
	RP=$(port); AP=$(port); cp=$(port)
	"$MASTER" --rpc_port "$RP" --metrics_port "$AP" --enable_multi_tenants --tenant_quota_connector_type file \
		--tenant_quota_connector_uri "$W/tenants.yaml" >"$W/tn-mooncake.log" 2>&1 &
	mpid=$!; PIDS+=("$mpid"); wait_port "$RP"
	"$CLIENT" --master_server_address "127.0.0.1:$RP" --host 127.0.0.1 --port "$cp" --global_segment_size "64 MB" \
		--metadata_server P2PHANDSHAKE --protocol tcp >>"$W/tn-mooncake.log" 2>&1 &
	cpid=$!; PIDS+=("$cpid")
	for _ in $(seq 100); do curl -sf "http://127.0.0.1:$AP/get_all_segments" | grep -q . && break; sleep 0.1; done
	tenants_case "mooncake_master tenants" "$RP" "$AP" "mooncake://127.0.0.1:$RP"
	kill "$cpid" "$mpid" 2>/dev/null; wait "$cpid" "$mpid" 2>/dev/null
	RP=$(port); AP=$(port)
	"$MC" serve store --rpc_port "$RP" --metrics_port "$AP" --segment-size 64M --local-hostname 127.0.0.1 \
		--enable_multi_tenants --tenant_quota_connector_type file --tenant_quota_connector_uri "$W/tenants.yaml" >"$W/tn-mc.log" 2>&1 &
	xpid=$!; PIDS+=("$xpid"); wait_port "$RP"
	tenants_case "mc serve store tenants" "$RP" "$AP" "127.0.0.1:$RP"
	kill "$xpid" 2>/dev/null; wait "$xpid" 2>/dev/null
fi

# ---- leader failover under --enable_ha, Mooncake's Python client carrying on
# Needs a Mooncake built with -DSTORE_USE_ETCD=ON: without it its clients
# and mooncake_master refuse an etcd:// master (UNAVAILABLE_IN_CURRENT_MODE).
# The same Python steps run against two mc candidates (with an mc node's
# segment) and against two mooncake_master --enable_ha (with a
# mooncake_client's); the leader is read from etcd's view key, as
# Mooncake's client reads it, and SIGKILLed.
cat >"$W/ha.py" <<'EOF'
import base64, json, os, signal, sys, time, urllib.request
from store import MooncakeDistributedStore
label, etcd, cluster, expect = sys.argv[1:5]
pids = dict(a.rsplit("=", 1) for a in sys.argv[5:])  # leader address -> pid

def out(ok, case, detail=""):
    print("RESULT %s %s|%s" % ("PASS" if ok else "FAIL", case, detail), flush=True)
    if not ok:
        sys.exit(1)

def view():
    # The leader's address and, as the view version, the key's create
    # revision: what Mooncake's client reads (MC_STORE_CLUSTER_ID names it).
    key = base64.b64encode(("mooncake-store/%s/master_view" % cluster).encode()).decode()
    req = urllib.request.Request("http://%s/v3/kv/range" % etcd, data=json.dumps({"key": key}).encode())
    kvs = json.load(urllib.request.urlopen(req, timeout=5)).get("kvs") or []
    return (base64.b64decode(kvs[0]["value"]).decode(), int(kvs[0]["create_revision"])) if kvs else None

def values(prefix):
    one = {prefix + "/1": os.urandom((1 << 20) + 3), prefix + "/2": os.urandom(3 << 20)}
    batch = {prefix + "/b%d" % i: os.urandom(4096 * (i + 1) + i) for i in range(8)}
    return one, batch

def put_all(s, one, batch):
    for k, v in one.items():
        rc = s.put(k, v)
        if rc != 0:
            return "put %s: %d" % (k, rc)
    rc = s.put_batch(list(batch), list(batch.values()))
    return "put_batch: %d" % rc if rc != 0 else ""

def mismatches(s, one, batch):
    bad = [k for k, v in one.items() if s.get(k) != v]
    got = s.get_batch(list(batch))
    return bad + [k for k, g, v in zip(batch, got, batch.values()) if g != v]

s = MooncakeDistributedStore()
# No segment of its own: every byte lands on the node, which outlives the leader.
rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "", "etcd://" + etcd)
if rc != 0:
    out(False, "put + get via etcd://, byte-exact", "setup: %d" % rc)
pre = values(label + "/pre")
err = put_all(s, *pre)
bad = [] if err else mismatches(s, *pre)
v0 = view()
out(not err and not bad and bool(v0), "put + get via etcd://, byte-exact",
    err or ("differ: %s" % bad[:3] if bad else "10 keys, 4 KiB-3 MiB; leader %s, view %d" % v0 if v0 else "no view in etcd"))

if v0[0] not in pids:
    out(False, "SIGKILL the leader: the other leads", "leader %s is none of %s" % (v0[0], list(pids)))
t0 = time.monotonic()
os.kill(int(pids[v0[0]]), signal.SIGKILL)
v1 = None
while time.monotonic() - t0 < 30 and not v1:
    v = view()
    v1 = v if v and v[1] != v0[1] else None
    time.sleep(0.05)
out(bool(v1) and v1[0] != v0[0], "SIGKILL the leader: the other leads",
    "view %d -> %d (%s) after %.1f s" % (v0[1], v1[1], v1[0], time.monotonic() - t0) if v1 else "no new view in 30 s")

# The client follows by itself; puts fail until it has: retry (new key
# each time) only until the first succeeds, then everything must.
probe, tries = os.urandom(4096), 0
while True:
    tries += 1
    if s.put("%s/post/try%d" % (label, tries), probe) == 0:
        break
    if time.monotonic() - t0 > 60:
        out(False, "same client: new keys, byte-exact", "%d puts refused in 60 s" % tries)
    time.sleep(0.2)
first = time.monotonic() - t0
post = values(label + "/post")
err = put_all(s, *post)
bad = [] if err else mismatches(s, *post)
if s.get("%s/post/try%d" % (label, tries)) != probe:
    bad.append("try%d" % tries)
out(not err and not bad, "same client: new keys, byte-exact",
    err or ("differ: %s" % bad[:3] if bad else "first put ok %.1f s after the kill (%d refused), then 10 more" % (first, tries - 1)))

bad = mismatches(s, *pre)
detail = "differ or gone: %s" % bad[:3] if bad else "all 10"
if expect == "kept":
    out(not bad, "keys put before the kill, byte-exact", detail)
else:
    print("RESULT NOTE keys put before the kill|%d of 10 read back byte-exact" % (10 - len(bad)), flush=True)
s.close()
EOF
ha_cases() { # prefix python-output [last-case]
	local pre=$1 out=$2 c line
	for c in "put + get via etcd://, byte-exact" "SIGKILL the leader: the other leads" "same client: new keys, byte-exact" ${3:+"$3"}; do
		line=$(grep -F "RESULT PASS $c|" <<<"$out" || grep -F "RESULT FAIL $c|" <<<"$out" | tail -1)
		case $line in
		"RESULT PASS"*) pass "$pre: $c" "${line#*|}" ;;
		"RESULT FAIL"*) fail "$pre: $c" "${line#*|}" ;;
		*) fail "$pre: $c" "not reached: $(grep -v '^[IWE][0-9]' <<<"$out" | tail -1)" ;;
		esac
	done
}
ha_python() { # cluster expect addr=pid... (sets out)
	local cluster=$1 expect=$2 a; shift 2
	# The leader dies of Python's SIGKILL while this shell waits: keep
	# bash's "Killed" notice out of the report.
	exec 3>&2 2>/dev/null
	out=$(MC_STORE_CLUSTER_ID=$cluster LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") \
		timeout 240 python3 "$W/ha.py" "$cluster" "127.0.0.1:$EP" "$cluster" "$expect" "$@" 2>&1)
	for a in "$@"; do kill -0 "${a#*=}" 2>/dev/null || wait "${a#*=}"; done
	exec 2>&3 3>&-
}
role() { curl -sf "http://127.0.0.1:$1/role"; }

EP=$(port)
"$MC" serve metadata --listen "127.0.0.1:$EP" >"$W/etcd.log" 2>&1 &
PIDS+=("$!")
KP1=$(port); KA1=$(port); KP2=$(port); KA2=$(port)
ha_master() { # rpc-port metrics-port: a mooncake_master HA candidate
	# Without --enable_oplog (or a snapshot to restore) its elected leader
	# never serves at 3b5a594: promotion fails, it resigns, and so on.
	"$MASTER" --enable_ha --enable_oplog --ha_backend_connstring "127.0.0.1:$EP" --cluster_id mooncake_ha \
		--rpc_address 127.0.0.1 --rpc_port "$1" --metrics_port "$2" >"$W/mooncake-ha-$1.log" 2>&1 &
	KPID=$!; PIDS+=("$KPID")
}
ha="" K1="" K2=""
if ! wait_port "$EP"; then
	fail "HA: mc serve metadata (etcd)" "$(tail -2 "$W/etcd.log")"
else
	# Does this build's mooncake_master take an etcd HA backend? One that
	# cannot exits at once naming UNAVAILABLE_IN_CURRENT_MODE; one that
	# can leads the (empty) cluster and serves.
	ha_master "$KP1" "$KA1"; K1=$KPID
	for _ in $(seq 200); do
		(echo >/dev/tcp/127.0.0.1/"$KP1") 2>/dev/null && { ha=yes; break; }
		kill -0 "$K1" 2>/dev/null || break
		sleep 0.1
	done
	if [ -n "$ha" ]; then :
	elif ! kill -0 "$K1" 2>/dev/null && grep -q UNAVAILABLE_IN_CURRENT_MODE "$W/mooncake-ha-$KP1.log"; then
		printf 'SKIP  %-58s %s\n' "HA failover cases (mc and mooncake_master)" "this build refuses an etcd HA backend: needs Mooncake built with -DSTORE_USE_ETCD=ON"
	else fail "HA: mooncake_master --enable_ha" "$(grep -v '^[IWE][0-9]' "$W/mooncake-ha-$KP1.log" | tail -1; tail -1 "$W/mooncake-ha-$KP1.log")"; fi
fi
if [ -n "$ha" ] && [ -z "$PYSTORE" ]; then fail "HA: Python MooncakeDistributedStore" "no store*.so in $BUILD"; ha=""; fi
if [ -n "$ha" ]; then
	# mc: two candidates, an mc node following the leader through etcd.
	HP1=$(port); HA1=$(port); HP2=$(port); HA2=$(port)
	"$MC" serve store --enable_ha --ha_backend_connstring "etcd://127.0.0.1:$EP" --cluster_id mc_ha --segment-size 0 \
		--rpc_address 127.0.0.1 --rpc_port "$HP1" --metrics_port "$HA1" >"$W/mc-ha1.log" 2>&1 &
	H1=$!; PIDS+=("$H1")
	"$MC" serve store --enable_ha --ha_backend_connstring "etcd://127.0.0.1:$EP" --cluster_id mc_ha --segment-size 0 \
		--rpc_address 127.0.0.1 --rpc_port "$HP2" --metrics_port "$HA2" >"$W/mc-ha2.log" 2>&1 &
	H2=$!; PIDS+=("$H2")
	"$MC" serve store --master "etcd://127.0.0.1:$EP" --cluster_id mc_ha --segment-size "256 MB" --local-hostname 127.0.0.1 \
		--metadata_server P2PHANDSHAKE >"$W/mc-ha-node.log" 2>&1 &
	HN=$!; PIDS+=("$HN")
	ok=""
	for _ in $(seq 100); do
		roles="$(role "$HA1") $(role "$HA2")"
		case $roles in "leader standby") la=$HA1 ;; "standby leader") la=$HA2 ;; *) la="" ;; esac
		[ -n "$la" ] && curl -sf "http://127.0.0.1:$la/get_all_segments" | grep -q . && { ok=1; break; }
		sleep 0.1
	done
	if [ -n "$ok" ]; then pass "mc HA: one leader of two, the mc node mounted via etcd" "$roles"
	else fail "mc HA: one leader of two, the mc node mounted via etcd" "roles: $roles; $(tail -1 "$W/mc-ha-node.log")"; fi
	ha_python mc_ha kept "127.0.0.1:$HP1=$H1" "127.0.0.1:$HP2=$H2"
	ha_cases "mc HA" "$out" "keys put before the kill, byte-exact"
	kill "$H1" "$H2" "$HN" 2>/dev/null; wait "$H1" "$H2" "$HN" 2>/dev/null

	# mooncake_master: the same steps, a mooncake_client's segment.
	ha_master "$KP2" "$KA2"; K2=$KPID
	if [ -n "$CLIENT" ]; then
		cport=$(port)
		MC_STORE_CLUSTER_ID=mooncake_ha "$CLIENT" --master_server_address "etcd://127.0.0.1:$EP" --host 127.0.0.1 --port "$cport" \
			--global_segment_size "256 MB" --metadata_server P2PHANDSHAKE --protocol tcp >"$W/client-ha.log" 2>&1 &
		KC=$!; PIDS+=("$KC")
		for _ in $(seq 100); do curl -sf "http://127.0.0.1:$KA1/get_all_segments" | grep -q . && break; sleep 0.1; done
		ha_python mooncake_ha observe "127.0.0.1:$KP1=$K1" "127.0.0.1:$KP2=$K2"
		ha_cases "mooncake_master HA" "$out"
		# What Mooncake promises here is weaker (a PutEnd is acknowledged
		# before its op log record is durable): shown, not counted.
		line=$(grep -F "RESULT NOTE " <<<"$out") && line=${line#RESULT NOTE } &&
			printf 'NOTE  %-58s %s\n' "mooncake_master HA: ${line%%|*}" "${line#*|}"
		kill "$KC" 2>/dev/null; wait "$KC" 2>/dev/null
	else fail "mooncake_master HA" "no mooncake_client in $BUILD"; fi
fi
for k in $K1 $K2; do kill "$k" 2>/dev/null; wait "$k" 2>/dev/null; done
echo "logs in $W; $fails failed"
exit "$fails"
