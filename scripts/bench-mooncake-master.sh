#!/usr/bin/env bash
# Mooncake's own master_bench against mooncake_master and against
# `mc serve store --segment-size 0`, on this machine, in interleaved rounds
# with the same flags; prints a markdown table of medians and ratios.
#
#   scripts/bench-mooncake-master.sh BUILD_DIR [MC] [ROUNDS] [DURATION_S] [MILLIONS]
#
# BUILD_DIR: the build directory of ../shared/tools/build-mooncake.sh. MC:
# the mc binary (bin/mc). ROUNDS (3) rounds of BatchPut and BatchGet at
# batch 128, 4 clients, 4 KiB values, DURATION_S (10) seconds each; then a
# large-count run: BatchGet with MILLIONS (1) million keys prefilled per
# client thread, and each master's resident memory once they are in.
set -uo pipefail
BUILD=${1:?usage: bench-mooncake-master.sh BUILD_DIR [MC] [ROUNDS] [DURATION_S] [MILLIONS]}
MC=${2:-bin/mc}
ROUNDS=${3:-3}
DUR=${4:-10}
MILLIONS=${5:-1}
MASTER=$BUILD/mooncake-store/src/mooncake_master
BENCH=$(find "$BUILD" -name master_bench -type f -perm -u+x | head -1)
[ -x "$MASTER" ] && [ -n "$BENCH" ] || { echo "bench-mooncake-master: no mooncake_master/master_bench in $BUILD (build them with ../shared/tools/build-mooncake.sh)"; exit 0; }
[ -x "$MC" ] || { echo "no mc binary at $MC (make build)"; exit 1; }
W=$(mktemp -d /tmp/mc-mbench.XXXXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

start() { # kind port -> PID in $SPID
	local kind=$1 p=$2 ap
	ap=$(port)
	if [ "$kind" = mooncake ]; then
		"$MASTER" --rpc_port "$p" --metrics_port "$ap" >>"$W/mooncake_master.log" 2>&1 &
	else
		"$MC" serve store --segment-size 0 --rpc_port "$p" --metrics_port "$ap" >>"$W/mc.log" 2>&1 &
	fi
	SPID=$!
	wait_port "$p"
}

bench() { # port op [extra]
	local p=$1 op=$2; shift 2
	"$BENCH" --master_server "127.0.0.1:$p" --operation "$op" --num_clients 4 --batch_size 128 \
		--value_size 4096 --duration "$DUR" "$@" 2>>"$W/master_bench.log" | sed -n 's/^Operations per second: //p' | tail -1
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

declare -A R
for op in BatchPut BatchGet; do
	for r in $(seq "$ROUNDS"); do
		for kind in mooncake mc; do
			p=$(port); start "$kind" "$p"
			v=$(bench "$p" "$op" --num_keys 10000)
			kill "$SPID"; wait "$SPID" 2>/dev/null
			R[$op,$kind]+="${v:-0} "
			echo "round $r $op $kind: ${v:-failed} ops/s" >&2
		done
	done
done

echo "| operation (batch 128, 4 clients, 4 KiB) | mooncake_master ops/s | mc ops/s | mc / mooncake_master |"
echo "|---|---|---|---|"
for op in BatchPut BatchGet; do
	a=$(echo "${R[$op,mooncake]}" | tr ' ' '\n' | grep . | median)
	b=$(echo "${R[$op,mc]}" | tr ' ' '\n' | grep . | median)
	printf '| %s (median of %d) | %.0f | %.0f | %.2fx |\n' "$op" "$ROUNDS" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done

# Large count: the prefill puts MILLIONS million keys per client; RSS is
# read once the timed gets are under way (everything is in by then).
keys=$((MILLIONS * 1000000))
for kind in mooncake mc; do
	p=$(port); start "$kind" "$p"
	before=$(grep -c 'Clients started' "$W/master_bench.log" 2>/dev/null || echo 0)
	bench "$p" BatchGet --num_keys "$keys" --duration 20 >"$W/large-$kind.out" &
	bpid=$!
	# The prefill is over when the timed phase logs "Clients started".
	for _ in $(seq 7200); do
		[ "$(grep -c 'Clients started' "$W/master_bench.log" 2>/dev/null || echo 0)" -gt "$before" ] && break
		sleep 0.5
	done
	rss=$(awk '/VmRSS/ {print $2}' "/proc/$SPID/status")
	wait "$bpid"
	ops=$(cat "$W/large-$kind.out")
	kill "$SPID"; wait "$SPID" 2>/dev/null
	objs=$((keys * 4))
	printf '| large count, %s: %d objects | RSS %.0f MiB | %.0f B/object | BatchGet %.0f ops/s |\n' "$kind" "$objs" "$(echo "$rss / 1024" | bc -l)" "$(echo "$rss * 1024 / $objs" | bc -l)" "${ops:-0}"
done
echo "logs in $W" >&2
