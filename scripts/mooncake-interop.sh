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
# against mooncake_master; mooncake_master restarted mid-run.
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
	out=$( { "$MC" bench store --master "$M" --metadata-server "$meta" --value-size 4K --batch 8 --keys 512 --op put,get --verify --duration 2s -o json &&
		"$MC" bench store --master "$M" --metadata-server "$meta" --value-size 64K --batch 8 --keys 512 --op get --verify --duration 2s -o json; } 2>&1)
	if echo "$out" | python3 -c 'import json,sys; d=json.JSONDecoder(); t=sys.stdin.read().strip(); rows=[]
while t:
    o,i=d.raw_decode(t); rows+=o["results"]; t=t[i:].strip()
assert len(rows)==3 and all(r["errors"]==0 and r["corrupt"]==0 and r["ops_per_sec"]>0 for r in rows), rows
print(" ".join("%s %s %.0f/s" % (r["value_size"], r["op"], r["ops_per_sec"]) for r in rows))' >"$W/bench-$label.txt" 2>&1; then
		pass "$label: batch put/get (bench store --batch 8 --verify)" "$(cat "$W/bench-$label.txt")"
	else fail "$label: batch put/get" "$(tail -3 "$W/bench-$label.txt")"; fi
	kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
	sleep 1
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
echo "logs in $W; $fails failed"
exit "$fails"
