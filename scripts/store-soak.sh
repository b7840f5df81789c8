#!/usr/bin/env bash
# store-soak.sh: a soak test of mc's store as an SRE would run one. A
# master and three nodes as separate processes (one with a disk tier and
# a small DRAM segment, so objects go to disk), concurrent clients
# (scripts/soak, built to bin/mc-soak) putting, upserting, getting and
# removing values whose bytes encode key and version, while a chaos loop
# SIGKILLs and restarts the master, SIGKILLs and restarts nodes, SIGSTOPs
# a node for 2-14 s (with --ha also a master for 2-10 s, past its leader
# lease), drains a node under the clients' traffic and puts it back in
# service, and SIGKILLs clients mid-operation.
#
# Every get is judged against what was acknowledged before it began
# (scripts/soak/main.go says how): latest, uncertain (a version whose put
# failed or was killed, not superseded since), absent, error, or WRONG.
# Exit status: 0 clean; 1 any WRONG get, a hang (an operation past its
# deadline by 10 s, or a client process that did not finish), a panic,
# fatal error or data race in a log; 64 usage.
#
# With --mooncake-clients N, N more clients are Mooncake's own Python
# client (MooncakeDistributedStore from a Mooncake build, as
# scripts/mooncake-interop.sh uses: BUILD_DIR of
# ../shared/tools/build-mooncake.sh), through the master's Mooncake wire
# and the nodes' tcp transport, judged the same way
# (scripts/soak/mooncake_soak.py): Mooncake's client checks no checksum,
# so a fence that held only for mc's clients shows there. Not with --ha
# (Mooncake's client finds an HA master through its etcd, which the
# build here lacks). The chaos loop then also SIGSTOPs those clients,
# often in the middle of a put, sometimes across a master restart: a stalled
# writer of Mooncake's, whose grant the new master never made.
#
# With --tenants the masters scope keys by tenant (--enable-multi-tenants,
# tenants t0 with a 1 GB quota and t1 with 40 MB, under the pool's 96 MB)
# and mc's clients take turns at them with the same key names (clients 0
# and 1 are tenants t0 and t1 with id 0, ...): values name their tenant,
# so a get served from another tenant's keys is WRONG.
#
# With --kv-events the masters publish KV events (each candidate on its
# own endpoint) and an `mc store events -o json` follows each endpoint for
# the whole run. The stream is judged against mc's clients' journals: every
# acknowledged put or upsert must have a stored event of its tenant and
# key, and every acknowledged removal a removed event, timed between the
# call's start and 2 s after its answer, each event matched to one call;
# no sequence gap ("lost N events"). Calls answered within 1 s before a
# master is killed or stopped, or within 3 s after one starts (its
# subscribers reconnect), are not judged: a killed publisher's queue dies
# with it, and a PUB socket sends nothing to a subscriber not yet there.
#
# --protocol auto moves the bytes of mc's clients through shared memory
# (nodes and clients are on one host: a renewed segment retires its
# memfd); --protocol rdma through the software RDMA NIC (soft0, soft1;
# a renewed segment's old keys give remote access errors). Mooncake's
# clients use tcp (nodes on auto serve it too); not with rdma.
#
# usage: scripts/store-soak.sh [--duration 180] [--no-tier] [--ha]
#          [--mc bin/mc] [--dir DIR] [--clients 3] [--chaos-every 4]
#          [--mooncake-clients N --mooncake-build BUILD_DIR] [--tenants]
#          [--protocol tcp|auto|rdma] [--kv-events]
#          [--checksums=false] [--keep] [--port-base 24600]
#          [--lease 2s]  (the masters' --default_kv_lease_ttl: a get's lease
#          holds off upserts and removals of its key that long)
# Ports BASE..BASE+200 on 127.0.0.1 (refused when one is taken). make soak runs it (SOAK_ARGS=...).
set -u

DURATION=180 TIER=1 HA=0 MC=bin/mc DIR="" CLIENTS=3 CHAOS_EVERY=4 CHECKSUMS=true KEEP=0 BASE=24600 LEASE=2s
MCLIENTS=0 MBUILD="" TENANTS=0 PROTO=tcp KVEVENTS=0
while [ $# -gt 0 ]; do
	case "$1" in
	--duration) DURATION=$2; shift ;;
	--no-tier) TIER=0 ;;
	--ha) HA=1 ;;
	--mc) MC=$2; shift ;;
	--dir) DIR=$2; shift ;;
	--clients) CLIENTS=$2; shift ;;
	--chaos-every) CHAOS_EVERY=$2; shift ;;
	--checksums=false) CHECKSUMS=false ;;
	--keep) KEEP=1 ;;
	--port-base) BASE=$2; shift ;;
	--lease) LEASE=$2; shift ;;
	--mooncake-clients) MCLIENTS=$2; shift ;;
	--mooncake-build) MBUILD=$2; shift ;;
	--tenants) TENANTS=1 ;;
	--kv-events) KVEVENTS=1 ;;
	--protocol) PROTO=$2; shift ;;
	-h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
	*) echo "store-soak: unknown argument $1 (see --help)" >&2; exit 64 ;;
	esac
	shift
done
case "$DURATION$CLIENTS$CHAOS_EVERY$BASE$MCLIENTS" in *[!0-9]*) echo "store-soak: --duration, --clients, --mooncake-clients and --chaos-every take whole numbers" >&2; exit 64 ;; esac
case $PROTO in tcp | auto | rdma) ;; *) echo "store-soak: --protocol $PROTO: want tcp, auto or rdma" >&2; exit 64 ;; esac
[ "$PROTO" = rdma ] && [ "$MCLIENTS" -gt 0 ] && { echo "store-soak: --mooncake-clients does not go with --protocol rdma (Mooncake's clients speak tcp here)" >&2; exit 64; }
PROTOFLAGS=(--protocol "$PROTO")
[ "$PROTO" = rdma ] && PROTOFLAGS+=(--device-name soft0,soft1)
if [ "$MCLIENTS" -gt 0 ]; then
	[ "$HA" = 0 ] || { echo "store-soak: --mooncake-clients does not go with --ha (Mooncake's client would need its etcd backend)" >&2; exit 64; }
	[ -n "$MBUILD" ] || { echo "store-soak: --mooncake-clients needs --mooncake-build BUILD_DIR (../shared/tools/build-mooncake.sh)" >&2; exit 64; }
	PYSTORE=$(find "$MBUILD" -name 'store*.so' 2>/dev/null | head -1)
	[ -n "$PYSTORE" ] || { echo "store-soak: no Python store module (store*.so) in $MBUILD" >&2; exit 64; }
	MLIBS=$(find "$MBUILD" -name '*.so*' -type f -printf '%h\n' | sort -u | paste -sd:)
fi
[ -x "$MC" ] || { echo "store-soak: $MC is not an executable (go build -o bin/mc .)" >&2; exit 64; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# Absolute: the build runs in ROOT (before, an absolute --mc built it
# under $PWD/$MC's directory and the clients found no binary).
SOAK=$(cd "$(dirname "$MC")" && pwd)/mc-soak
(cd "$ROOT" && go build -o "$SOAK" ./scripts/soak) || { echo "store-soak: building scripts/soak failed" >&2; exit 1; }
[ -n "$DIR" ] || DIR=$(mktemp -d /tmp/store-soak.XXXXXX)
mkdir -p "$DIR/logs" "$DIR/ssd" "$DIR/journals"
echo "store-soak: ${DURATION}s, tier=$TIER ha=$HA clients=$CLIENTS mooncake-clients=$MCLIENTS tenants=$TENANTS protocol=$PROTO kv-events=$KVEVENTS checksums=$CHECKSUMS, in $DIR"
MEXTRA=()
if [ "$TENANTS" = 1 ]; then
	printf 'version: 1\ntenants:\n  - name: t0\n    quota: 1GB\n  - name: t1\n    quota: 40MB\n  - name: default\n    quota: 1GB\n' >"$DIR/tenants.yaml"
	MEXTRA=(--enable-multi-tenants --tenant-quota-connector-uri "$DIR/tenants.yaml")
fi

RPC=$((BASE + 51)) ADMIN=$((BASE + 3)) ETCD=$((BASE + 79)) EVPORT=$((BASE + 91))
for p in $RPC $((RPC + 1)) $ADMIN $((ADMIN + 10)) $((ADMIN + 100)) $((ADMIN + 101)) $((ADMIN + 102)) $ETCD $EVPORT $((EVPORT + 1)); do
	if ss -Htln "sport = :$p" | grep -q .; then echo "store-soak: port $p is taken (another run?); pick --port-base" >&2; exit 64; fi
done
MASTER_ADDR=127.0.0.1:$RPC
[ "$HA" = 1 ] && MASTER_ADDR=etcd://127.0.0.1:$ETCD
declare -A PID STARTS
DRAINS=0 SELF_EXITS=0 KILLS=0 RESTARTS_MASTER=0 RESTARTS_NODE=0 STOPS=0 CLIENT_KILLS=0

start() { # name cmd...: start a process in the background, log to logs/name.log
	local name=$1; shift
	"$@" >>"$DIR/logs/$name.log" 2>&1 &
	PID[$name]=$!
	STARTS[$name]=$((${STARTS[$name]:-0} + 1))
	echo "$(date +%T.%3N) start $name pid ${PID[$name]}" >>"$DIR/chaos.log"
}

start_master() { # index (HA: 0 or 1)
	local i=$1 ev=()
	[ "$KVEVENTS" = 1 ] && ev=(--enable_kv_events --kv_events_bind_endpoint "tcp://127.0.0.1:$((EVPORT + i))" --kv_events_backend_id soak)
	if [ "$HA" = 1 ]; then
		start "master$i" "$MC" serve store --segment-size 0 --enable_ha --ha_backend_connstring "etcd://127.0.0.1:$ETCD" \
			--rpc_address 127.0.0.1 --rpc_port $((RPC + i)) --metrics_port $((ADMIN + 10 * i)) --eviction-high-watermark-ratio 0.8 --default_kv_lease_ttl "$LEASE" "${MEXTRA[@]}" "${ev[@]}"
	else
		start master0 "$MC" serve store --segment-size 0 --rpc_address 127.0.0.1 --rpc_port $RPC --metrics_port $ADMIN \
			--metrics-address 127.0.0.1 --eviction-high-watermark-ratio 0.8 --default_kv_lease_ttl "$LEASE" "${MEXTRA[@]}" "${ev[@]}"
	fi
}

start_node() { # index
	local i=$1 extra=()
	if [ "$i" = 1 ] && [ "$TIER" = 1 ]; then
		extra=(--ssd-dir "$DIR/ssd" --ssd-size 512M --ssd-staging-size 16M)
	fi
	start "node$i" "$MC" serve store --master "$MASTER_ADDR" --segment-size 32M "${PROTOFLAGS[@]}" \
		--local-hostname 127.0.0.1 --bind-address 127.0.0.1 --metrics_port $((ADMIN + 100 + i)) "${extra[@]}"
}

start_client() { # index: a loop restarting the client until the end
	local i=$1 id=$1 who=()
	[ "$TENANTS" = 1 ] && id=$((i / 2)) who=(--tenant "t$((i % 2))")
	(
		exec 2>>"$DIR/logs/clientloop$i.log" # bash's "Killed" notes
		while [ "$(date +%s)" -lt "$END" ]; do
			left=$((END - $(date +%s)))
			"$SOAK" --master "$MASTER_ADDR" --id "$id" "${who[@]}" "${PROTOFLAGS[@]}" --journal "$DIR/journals/c$i.journal" \
				--duration "${left}s" --checksums="$CHECKSUMS" >>"$DIR/logs/client$i.log" 2>&1 &
			echo $! >"$DIR/client$i.pid"
			wait $!
			rc=$?
			echo "$(date +%T.%3N) client$i exit $rc" >>"$DIR/chaos.log"
			[ $rc = 3 ] && echo hang >>"$DIR/client$i.hang"
		done
	) &
	PID[clientloop$i]=$!
}

start_mclient() { # index: Mooncake's Python client, restarted until the end
	local i=$1
	(
		exec 2>>"$DIR/logs/mclientloop$i.log"
		while [ "$(date +%s)" -lt "$END" ]; do
			left=$((END - $(date +%s)))
			LD_LIBRARY_PATH=$MLIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$(dirname "$PYSTORE") \
				python3 "$ROOT/scripts/soak/mooncake_soak.py" "$MASTER_ADDR" "$i" "$DIR/journals/m$i.journal" "$left" \
				>>"$DIR/logs/mclient$i.log" 2>&1 &
			echo $! >"$DIR/mclient$i.pid"
			wait $!
			rc=$?
			echo "$(date +%T.%3N) mclient$i exit $rc" >>"$DIR/chaos.log"
		done
	) &
	PID[mclientloop$i]=$!
}

sample() { # t: RSS (MB) and open fds of every server process
	local line="$1" p
	for n in master0 master1 node0 node1 node2; do
		p=${PID[$n]:-}
		[ -n "$p" ] || continue
		line+=" $n:$(awk '/VmRSS/{printf "%dMB", $2/1024}' /proc/"$p"/status 2>/dev/null || echo -)/$(ls /proc/"$p"/fd 2>/dev/null | wc -l)fd"
	done
	echo "$line" >>"$DIR/samples.log"
}

cleanup() {
	for n in "${!PID[@]}"; do
		case $n in clientloop* | mclientloop*) kill "${PID[$n]}" 2>/dev/null ;; esac
	done
	for f in "$DIR"/client*.pid "$DIR"/mclient*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
	for n in "${!PID[@]}"; do
		case $n in clientloop* | mclientloop*) ;; *) kill -CONT "${PID[$n]}" 2>/dev/null; kill -TERM "${PID[$n]}" 2>/dev/null ;; esac
	done
	sleep 2
	for n in "${!PID[@]}"; do kill -9 "${PID[$n]}" 2>/dev/null; done
	wait 2>/dev/null
}
trap 'cleanup; exit 130' INT TERM

if [ "$HA" = 1 ]; then
	start etcd "$MC" serve metadata --listen 127.0.0.1:$ETCD
	sleep 2
	start_master 0
	start_master 1
else
	start_master 0
fi
sleep 1.5
if [ "$KVEVENTS" = 1 ]; then
	# stdout (events, JSON) and stderr (gaps, restarts) in one file each
	for i in $(seq 0 "$HA"); do start "events$i" "$MC" store events --endpoint "tcp://127.0.0.1:$((EVPORT + i))" -o json; done
fi
for i in 0 1 2; do start_node "$i"; done
sleep 3
END=$(($(date +%s) + DURATION))
for i in $(seq 0 $((CLIENTS - 1))); do start_client "$i"; done
for i in $(seq 0 $((MCLIENTS - 1))); do start_mclient "$i"; done

# The chaos loop: one action every CHAOS_EVERY s on average, until 15 s
# before the end (the clients' last gets then see a settled store).
T0=$(date +%s)
sample "t=0"
next_sample=$((T0 + 10))
while [ "$(date +%s)" -lt $((END - 15)) ]; do
	sleep $((CHAOS_EVERY / 2 + RANDOM % (CHAOS_EVERY + 1)))
	now=$(date +%s)
	if [ "$now" -ge "$next_sample" ]; then sample "t=$((now - T0))"; next_sample=$((now + 10)); fi
	[ "$now" -lt $((END - 15)) ] || break
	# A server that exited by itself (a node whose first mount found no
	# master exits, as documented) is restarted and counted.
	for n in master0 master1 node0 node1 node2; do
		[ -n "${PID[$n]:-}" ] || continue
		kill -0 "${PID[$n]}" 2>/dev/null && continue
		wait "${PID[$n]}" 2>/dev/null; rc=$?
		echo "$(date +%T.%3N) $n exited by itself ($rc): $(tail -1 "$DIR/logs/$n.log")" >>"$DIR/chaos.log"
		SELF_EXITS=$((SELF_EXITS + 1))
		case $n in master*) start_master "${n#master}" ;; node*) start_node "${n#node}" ;; esac
	done
	r=$((RANDOM % 100))
	if [ $r -lt 20 ]; then
		m=master0
		[ "$HA" = 1 ] && m=master$((RANDOM % 2))
		kill -9 "${PID[$m]}" 2>/dev/null; wait "${PID[$m]}" 2>/dev/null
		echo "$(date +%T.%3N) SIGKILL $m" >>"$DIR/chaos.log"; KILLS=$((KILLS + 1))
		sleep 0.$((RANDOM % 10))
		start_master "${m#master}"; RESTARTS_MASTER=$((RESTARTS_MASTER + 1))
	elif [ $r -lt 28 ] && [ "$TIER" = 1 ]; then
		# A rack losing power: the master and the disk node die together;
		# the node comes back a few seconds after the master.
		m=master0
		[ "$HA" = 1 ] && m=master$((RANDOM % 2))
		kill -9 "${PID[$m]}" "${PID[node1]}" 2>/dev/null; wait "${PID[$m]}" "${PID[node1]}" 2>/dev/null
		echo "$(date +%T.%3N) SIGKILL $m and node1" >>"$DIR/chaos.log"; KILLS=$((KILLS + 2))
		start_master "${m#master}"; RESTARTS_MASTER=$((RESTARTS_MASTER + 1))
		sleep $((2 + RANDOM % 5))
		start_node 1; RESTARTS_NODE=$((RESTARTS_NODE + 1))
	elif [ $r -lt 45 ]; then
		i=$((RANDOM % 3))
		kill -9 "${PID[node$i]}" 2>/dev/null; wait "${PID[node$i]}" 2>/dev/null
		echo "$(date +%T.%3N) SIGKILL node$i" >>"$DIR/chaos.log"; KILLS=$((KILLS + 1))
		sleep $((RANDOM % 3))
		start_node "$i"; RESTARTS_NODE=$((RESTARTS_NODE + 1))
	elif [ $r -lt 55 ] && [ "$HA" = 1 ]; then
		# A leader paused (a long GC, a VM stall) past its lease: the
		# other takes over, and the paused one resumes as if nothing
		# happened. It must serve nothing from its old term.
		i=$((RANDOM % 2)) s=$((2 + RANDOM % 9))
		kill -STOP "${PID[master$i]}"
		echo "$(date +%T.%3N) SIGSTOP master$i for ${s}s" >>"$DIR/chaos.log"; STOPS=$((STOPS + 1))
		sleep "$s"
		kill -CONT "${PID[master$i]}"
	elif [ $r -lt 65 ]; then
		i=$((RANDOM % 3)) s=$((2 + RANDOM % 13))
		kill -STOP "${PID[node$i]}"
		echo "$(date +%T.%3N) SIGSTOP node$i for ${s}s" >>"$DIR/chaos.log"; STOPS=$((STOPS + 1))
		sleep "$s"
		kill -CONT "${PID[node$i]}"
	elif [ $r -lt 72 ]; then
		# An operator draining a node under the clients' traffic (its
		# objects copied to the others while they are read, upserted and
		# removed), then putting it back in service; the chaos goes on
		# meanwhile, so masters die under drain jobs too.
		i=$((RANDOM % 3)) s=$((2 + RANDOM % 8))
		seg=$(grep -o 'segment [0-9.]*:[0-9]*: ' "$DIR/logs/node$i.log" | tail -1 | awk '{sub(/:$/, "", $2); print $2}')
		adm=$ADMIN
		[ "$HA" = 1 ] && [ "$(curl -s -m 1 "http://127.0.0.1:$((ADMIN + 10))/role")" = leader ] && adm=$((ADMIN + 10))
		if [ -n "$seg" ]; then
			echo "$(date +%T.%3N) drain node$i ($seg) for ${s}s" >>"$DIR/chaos.log"; DRAINS=$((DRAINS + 1))
			"$MC" store drain "$seg" --master "$MASTER_ADDR" --admin "http://127.0.0.1:$adm" --wait=false >>"$DIR/logs/drain.log" 2>&1
			sleep "$s"
			"$MC" store drain --undo "$seg" --master "$MASTER_ADDR" --admin "http://127.0.0.1:$adm" >>"$DIR/logs/drain.log" 2>&1
		fi
	elif [ $r -lt 80 ] && [ "$MCLIENTS" -gt 0 ]; then
		# A stalled writer: a Mooncake client (no deadline to judge)
		# stopped for 1-6 s, often in the middle of a call, and in half the
		# cases the master restarts meanwhile, so a put it resumes
		# writes into a grant the new master never made.
		i=$((RANDOM % MCLIENTS)) s=$((1 + RANDOM % 6)) m=""
		if [ -f "$DIR/mclient$i.pid" ] && kill -STOP "$(cat "$DIR/mclient$i.pid")" 2>/dev/null; then
			[ $((RANDOM % 2)) = 0 ] && m=" (and SIGKILL master0)"
			echo "$(date +%T.%3N) SIGSTOP mclient$i for ${s}s$m" >>"$DIR/chaos.log"; STOPS=$((STOPS + 1))
			if [ -n "$m" ]; then
				sleep 0.$((RANDOM % 10))
				kill -9 "${PID[master0]}" 2>/dev/null; wait "${PID[master0]}" 2>/dev/null; KILLS=$((KILLS + 1))
				start_master 0; RESTARTS_MASTER=$((RESTARTS_MASTER + 1))
			fi
			sleep "$s"
			kill -CONT "$(cat "$DIR/mclient$i.pid")" 2>/dev/null
		fi
	else
		i=$((RANDOM % (CLIENTS + MCLIENTS))) c=client
		[ "$i" -ge "$CLIENTS" ] && i=$((i - CLIENTS)) c=mclient
		sleep 0.$((RANDOM % 10))
		if [ -f "$DIR/$c$i.pid" ] && kill -9 "$(cat "$DIR/$c$i.pid")" 2>/dev/null; then
			echo "$(date +%T.%3N) SIGKILL $c$i" >>"$DIR/chaos.log"; CLIENT_KILLS=$((CLIENT_KILLS + 1))
		fi
	fi
done

# The clients stop by themselves at END; one still running 30 s later hangs.
HUNG=0
LOOPS=() # KIND INDEX pairs: client (mc's) and mclient (Mooncake's)
for i in $(seq 0 $((CLIENTS - 1))); do LOOPS+=(client "$i"); done
for i in $(seq 0 $((MCLIENTS - 1))); do LOOPS+=(mclient "$i"); done
set -- "${LOOPS[@]}"
while [ $# -gt 0 ]; do
	k=$1 i=$2; shift 2
	deadline=$((END + 30))
	while kill -0 "${PID[${k}loop$i]}" 2>/dev/null && [ "$(date +%s)" -lt $deadline ]; do sleep 1; done
	if kill -0 "${PID[${k}loop$i]}" 2>/dev/null; then
		echo "store-soak: $k$i still running 30 s after the end (hang)"; HUNG=$((HUNG + 1))
	fi
	[ -f "$DIR/$k$i.hang" ] && HUNG=$((HUNG + $(wc -l <"$DIR/$k$i.hang")))
done
sample "t=$(($(date +%s) - T0)) end"
# Staging space: every staged read is handed back, or reclaimed after
# --ssd-staging-ttl (5 s), once the clients are gone.
LEAK=""
if [ "$TIER" = 1 ]; then
	for port in $ADMIN $((ADMIN + 10)); do
		[ "$(curl -s -m 2 "http://127.0.0.1:$port/role")" = leader ] || [ "$HA" = 0 ] && break
	done
	for _ in $(seq 20); do
		curl -s -m 2 "http://127.0.0.1:$port/api/v1/tiers" >"$DIR/tiers.json"
		LEAK=$(grep -oE '"staging_used_bytes": *[1-9][0-9]*' "$DIR/tiers.json")
		grep -q staging_used_bytes "$DIR/tiers.json" && [ -z "$LEAK" ] && break
		sleep 1
	done
	grep -q staging_used_bytes "$DIR/tiers.json" || LEAK="no tier answered on $port/api/v1/tiers"
fi
"$MC" store stat --master "$MASTER_ADDR" --admin "http://127.0.0.1:${port:-$ADMIN}" >"$DIR/stat.txt" 2>&1
cleanup

cat "$DIR"/journals/*.journal >"$DIR/all.journal"
echo
echo "operations (journal results; latest/uncertain/absent are correct answers):"
awk '$2=="E"{n[$3" "$6]++; t++} $2=="H"{h++}
	END{printf "  %-8s %-10s %8s\n", "op", "result", "count"; for (k in n) {split(k, a, " "); printf("  %-8s %-10s %8d\n", a[1], a[2], n[k]) | "sort"}; close("sort"); printf "  total %d operations, %d past their deadline\n", t, h+0}' "$DIR/all.journal"
# Late: answered more than 1 s past the client's 8 s deadline. A get must
# not be (README: it returns at its caller's deadline); a put or rm may,
# as documented (a put waits for its transfers, a stopped node's until
# the master drops it after client_ttl).
# Mooncake's clients (keys soak/m...) take no deadline: their times are
# shown, not judged.
LATE_GETS=$(awk '$2=="E" && $3=="get" && $4 ~ /^soak\/c/ && $7+0 > 9000' "$DIR/all.journal" | wc -l)
LATE_OTHER=$(awk '$2=="E" && $3!="get" && $4 ~ /^soak\/c/ && $7+0 > 9000' "$DIR/all.journal" | wc -l)
echo "late answers (> 9 s for an 8 s deadline): $LATE_GETS gets, $LATE_OTHER puts/removals (allowed); slowest: $(awk '$2=="E" && $4 ~ /^soak\/c/ && $7+0 > m[$3] {m[$3] = $7+0} END {for (k in m) printf "%s %d ms, ", k, m[k]}' "$DIR/all.journal")"
if [ "$MCLIENTS" -gt 0 ]; then
	echo "Mooncake's clients: $(awk '$2=="E" && $4 ~ /^soak\/m/ {n[$3" "$6]++; t++} END {for (k in n) printf "%s %d, ", k, n[k]; printf "total %d", t}' "$DIR/all.journal"); slowest: $(awk '$2=="E" && $4 ~ /^soak\/m/ && $7+0 > m[$3] {m[$3] = $7+0} END {for (k in m) printf "%s %d ms, ", k, m[k]}' "$DIR/all.journal")"
fi
WRONG=$(grep -c ' WRONG ' "$DIR/all.journal")
HANGOPS=$(grep -c '^[^ ]* H ' "$DIR/all.journal")
PANICS=$(grep -l -E '^panic:|fatal error:|WARNING: DATA RACE' "$DIR"/logs/*.log 2>/dev/null | tr '\n' ' ')
KVE_RC=0
if [ "$KVEVENTS" = 1 ]; then
	KVE_OUT=$(python3 "$ROOT/scripts/soak/judge_events.py" "$DIR" "$TENANTS" 2>&1); KVE_RC=$?
fi
echo
echo "chaos: $KILLS SIGKILLs ($RESTARTS_MASTER of a master, $RESTARTS_NODE of a node), $STOPS SIGSTOPs, $CLIENT_KILLS clients killed, $DRAINS drains; $SELF_EXITS servers exited by themselves and were restarted; ${DURATION}s"
echo "RSS and open fds per process (first, last sample; samples.log has all):"
head -1 "$DIR/samples.log" | sed 's/^/  /'
tail -1 "$DIR/samples.log" | sed 's/^/  /'
[ "$TIER" = 1 ] && echo "staging pools 20 s after the clients stopped: ${LEAK:-all empty}"
[ "$KVEVENTS" = 1 ] && echo "$KVE_OUT"
echo
rc=0
if [ "$WRONG" -gt 0 ]; then echo "WRONG gets: $WRONG"; grep ' WRONG ' "$DIR/all.journal" | head -20; rc=1; fi
if [ "$HANGOPS" -gt 0 ] || [ "$HUNG" -gt 0 ] || [ "$LATE_GETS" -gt 0 ]; then
	echo "hangs: $HANGOPS operations past their deadline by 10 s, $HUNG clients, $LATE_GETS gets late"
	grep '^[^ ]* H ' "$DIR/all.journal" | head -5
	awk '$2=="E" && $3=="get" && $7+0 > 9000' "$DIR/all.journal" | head -5
	rc=1
fi
# A soak whose clients never ran proves nothing: each client must have
# journaled operations (a client that cannot start, such as a binary
# missing, exits 126 or 127 in a loop and journals nothing).
for f in "$DIR"/journals/c*.journal "$DIR"/journals/m*.journal; do
	[ -e "$f" ] || continue
	if ! grep -q '^[^ ]* E ' "$f"; then echo "no operation journaled in $f"; rc=1; fi
done
NJ=$(ls "$DIR"/journals/*.journal 2>/dev/null | wc -l)
if [ "$NJ" -lt $((CLIENTS + MCLIENTS)) ]; then echo "$((CLIENTS + MCLIENTS - NJ)) clients journaled nothing (see logs/client*.log and logs/mclient*.log)"; rc=1; fi
if grep -qE 'client[0-9]+ exit 12[67]$' "$DIR/chaos.log"; then echo "a client could not run: $(grep -m1 -E 'client[0-9]+ exit 12[67]$' "$DIR/chaos.log")"; rc=1; fi
if [ -n "$LEAK" ]; then echo "staging space not given back: $LEAK"; rc=1; fi
if [ "$KVE_RC" != 0 ]; then echo "KV events: the stream does not match what the clients were told (above)"; rc=1; fi
if [ -n "$PANICS" ]; then echo "panic, fatal error or data race in: $PANICS"; rc=1; fi
[ $rc = 0 ] && echo "store-soak: PASS (no wrong bytes, no hang, no panic)" || echo "store-soak: FAIL (logs in $DIR)"
[ $rc = 0 ] && [ "$KEEP" = 0 ] && rm -rf "$DIR"
exit $rc
