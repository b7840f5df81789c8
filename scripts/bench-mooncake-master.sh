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
# client thread, and each master's resident memory once they are in. The
# rounds also give each master's CPU time per item over their steady phase
# (master_bench's own is logged per round): the client threads share the
# cores, so ops/s alone understates a master that spends less.
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

# started: how many timed phases master_bench has begun (its log line).
started() {
	local n
	n=$(grep -c 'Clients started' "$W/master_bench.log" 2>/dev/null)
	echo "${n:-0}"
}

# cpu PID: the process's user+system CPU so far, in clock ticks.
cpu() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# timed PORT OP: a bench of 10000 keys per client whose steady phase is
# also measured per process: prints "OPS MASTER_US BENCH_US", the CPU
# microseconds the master and master_bench each spent per item, sampled
# over the middle of the timed phase (after the prefill, before the end).
timed() {
	local p=$1 op=$2 before bpid c0 b0 t0 c1 b1 t1 ops
	before=$(started)
	"$BENCH" --master_server "127.0.0.1:$p" --operation "$op" --num_clients 4 --batch_size 128 \
		--value_size 4096 --duration "$DUR" --num_keys 10000 >"$W/timed.out" 2>>"$W/master_bench.log" &
	bpid=$!
	for _ in $(seq 600); do
		[ "$(started)" -gt "$before" ] && break
		sleep 0.1
	done
	sleep 1
	c0=$(cpu "$SPID") b0=$(cpu "$bpid") t0=$(date +%s.%N)
	sleep $((DUR > 3 ? DUR - 3 : 1))
	c1=$(cpu "$SPID") b1=$(cpu "$bpid") t1=$(date +%s.%N)
	wait "$bpid"
	ops=$(sed -n 's/^Operations per second: //p' "$W/timed.out" | tail -1)
	[ -n "$ops" ] || { echo "0 0 0"; return; }
	python3 -c "
ops, dt, tick = $ops, $t1 - $t0, $(getconf CLK_TCK)
print('%.0f %.2f %.2f' % (ops, ($c1 - $c0) / tick / dt / ops * 1e6, ($b1 - $b0) / tick / dt / ops * 1e6))"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

declare -A R C
for op in BatchPut BatchGet; do
	for r in $(seq "$ROUNDS"); do
		for kind in mooncake mc; do
			p=$(port); start "$kind" "$p"
			read -r v mus bus < <(timed "$p" "$op")
			kill "$SPID"; wait "$SPID" 2>/dev/null
			R[$op,$kind]+="${v:-0} "
			C[$op,$kind]+="${mus:-0} "
			echo "round $r $op $kind: ${v:-failed} ops/s; CPU per item: master ${mus} us, master_bench ${bus} us" >&2
		done
	done
done

echo "| operation (batch 128, 4 clients, 4 KiB) | mooncake_master ops/s | mc ops/s | mc / mooncake_master | master CPU per item, us: mooncake_master / mc |"
echo "|---|---|---|---|---|"
for op in BatchPut BatchGet; do
	a=$(echo "${R[$op,mooncake]}" | tr ' ' '\n' | grep . | median)
	b=$(echo "${R[$op,mc]}" | tr ' ' '\n' | grep . | median)
	ca=$(echo "${C[$op,mooncake]}" | tr ' ' '\n' | grep . | median)
	cb=$(echo "${C[$op,mc]}" | tr ' ' '\n' | grep . | median)
	printf '| %s (median of %d) | %.0f | %.0f | %.2fx | %.2f / %.2f |\n' "$op" "$ROUNDS" "$a" "$b" "$(echo "$b / $a" | bc -l)" "$ca" "$cb"
done

# Large count: the prefill puts MILLIONS million keys per client; RSS is
# read once the timed gets are under way (everything is in by then).
keys=$((MILLIONS * 1000000))
for kind in mooncake mc; do
	p=$(port); start "$kind" "$p"
	before=$(started)
	bench "$p" BatchGet --num_keys "$keys" --duration 20 >"$W/large-$kind.out" &
	bpid=$!
	# The prefill is over when the timed phase logs "Clients started".
	for _ in $(seq 7200); do
		[ "$(started)" -gt "$before" ] && break
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
