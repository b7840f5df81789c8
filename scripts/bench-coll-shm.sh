#!/usr/bin/env bash
# Issue 24 item 5: `mc bench coll` all_reduce of 64 MiB on 4 local ranks
# (--protocol auto: shared memory between the rank processes) against the
# 1-thread TCP engine at 1 MiB (`mc bench initiator --protocol tcp
# --threads 1 --block_size 1M`, its embedded loopback target), measured in
# the same run: ROUNDS interleaved rounds, each printed, then a markdown
# table of medians with the ratio (goal: busbw >= 0.5x the initiator).
# The all_reduce over loopback TCP (--protocol tcp) is beside them.
#
#   scripts/bench-coll-shm.sh [MC] [ROUNDS] [INITIATOR_DURATION]
set -euo pipefail
MC=${1:-bin/mc}
ROUNDS=${2:-3}
DUR=${3:-5s}
[ -x "$MC" ] || { echo "no mc binary at $MC (make build)" >&2; exit 1; }
command -v jq >/dev/null || { echo "bench-coll-shm needs jq" >&2; exit 1; }

initiator() {
	"$MC" bench initiator --protocol tcp --threads 1 --block_size 1M --duration "$DUR" -o json |
		jq -er '.results[0] | select(.transport == "tcp") | .bytes_per_sec / 1e9'
}
# coll PROTOCOL -> "busbw transport"
coll() {
	"$MC" bench coll --collective all_reduce --ranks 4 -b 64M -e 64M --iters 20 --warmup 3 --check --protocol "$1" -o json |
		jq -er '.results[0] | select(.correct == true) | "\(.busbw_gbps) \(.transport)"'
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

ini=() shm=() tcp=() ratio=()
for r in $(seq "$ROUNDS"); do
	i=$(initiator)
	read -r s st < <(coll auto)
	read -r t tt < <(coll tcp)
	[ "$st" = shm ] || { echo "round $r: --protocol auto moved the all_reduce's bytes through $st, not shm" >&2; exit 1; }
	[ "$tt" = tcp ] || { echo "round $r: --protocol tcp moved them through $tt" >&2; exit 1; }
	q=$(awk -v s="$s" -v i="$i" 'BEGIN {printf "%.2f", s / i}')
	printf 'round %d: initiator tcp 1 thread 1M read %.2f GB/s; all_reduce 4 ranks 64M busbw shm %.2f GB/s (%sx), tcp %.2f GB/s\n' "$r" "$i" "$s" "$q" "$t" >&2
	ini+=("$i") shm+=("$s") tcp+=("$t") ratio+=("$q")
done
mi=$(printf '%s\n' "${ini[@]}" | median)
ms=$(printf '%s\n' "${shm[@]}" | median)
mt=$(printf '%s\n' "${tcp[@]}" | median)
spread() { printf '%s\n' "$@" | sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.2f-%.2f", lo, hi}'; }
echo "| measure (same run, $ROUNDS rounds, medians) | GB/s | range | vs initiator |"
echo "|---|---|---|---|"
printf '| mc bench initiator --protocol tcp --threads 1 --block_size 1M (read) | %.2f | %s | 1 |\n' "$mi" "$(spread "${ini[@]}")"
printf '| mc bench coll all_reduce 4 ranks 64M, busbw, --protocol auto (shm) | %.2f | %s | %.2fx (rounds %s) |\n' "$ms" "$(spread "${shm[@]}")" "$(awk -v s="$ms" -v i="$mi" 'BEGIN {print s / i}')" "$(spread "${ratio[@]}")"
printf '| mc bench coll all_reduce 4 ranks 64M, busbw, --protocol tcp | %.2f | %s | %.2fx |\n' "$mt" "$(spread "${tcp[@]}")" "$(awk -v s="$mt" -v i="$mi" 'BEGIN {print s / i}')"
