#!/usr/bin/env bash
# Issue 24 item 5: 1 MiB gets from a client on the node's host, through
# shared memory against loopback TCP, in the same run. The node is another
# process (`mc serve store --protocol auto`, master and a 2 GiB segment);
# each round is one `mc bench store --vs-tcp` (every row from a tcp client,
# then from the default auto client, which says which transport its engine
# moved the bytes with), at concurrency 1 and 4. Prints every round, then
# a markdown table of medians with the ratio (goal: >= 2x).
#
#   scripts/bench-store-shm.sh [MC] [ROUNDS] [DURATION]
set -euo pipefail
MC=${1:-bin/mc}
ROUNDS=${2:-3}
DUR=${3:-4s}
[ -x "$MC" ] || { echo "no mc binary at $MC (make build)" >&2; exit 1; }
command -v jq >/dev/null || { echo "bench-store-shm needs jq" >&2; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
W=$(mktemp -d /tmp/mc-bench-store-shm.XXXXXX)
RPC=$(port) ADMIN=$(port)
"$MC" serve store --protocol auto --segment-size 2G --rpc_port "$RPC" --metrics_port "$ADMIN" --local-hostname 127.0.0.1 >"$W/serve.log" 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null; wait $SPID 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 200); do grep -q "reached at" "$W/serve.log" && break; sleep 0.1; done
grep -q "reached at" "$W/serve.log" || { echo "mc serve store did not start:" >&2; cat "$W/serve.log" >&2; exit 1; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
spread() { sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.2f-%.2f", lo, hi}'; }
: >"$W/rows"
for r in $(seq "$ROUNDS"); do
	# One line per concurrency: "conc tcp_GBps shm_GBps ratio transport_of_tcp_row transport_of_auto_row".
	"$MC" bench store --master "127.0.0.1:$RPC" --admin "http://127.0.0.1:$ADMIN" --value-size 1M --op get --concurrency 1,4 --duration "$DUR" --vs-tcp -o json |
		jq -r '.results as $r | range(0; $r | length; 2) as $i |
			"\($r[$i].concurrency) \($r[$i].gb_per_sec) \($r[$i+1].gb_per_sec) \($r[$i+1].vs_tcp) \($r[$i].transport) \($r[$i+1].transport) \($r[$i].errors + $r[$i+1].errors)"' >"$W/round"
	while read -r c t s q tt st e; do
		[ "$tt" = tcp ] && [ "$st" = shm ] && [ "$e" = 0 ] || { echo "round $r x$c: transports $tt/$st, $e errors: want tcp then shm, none" >&2; exit 1; }
		printf 'round %d: 1M get x%d: tcp %.2f GB/s, shm %.2f GB/s, %.2fx\n' "$r" "$c" "$t" "$s" "$q" >&2
		echo "$c $t $s $q" >>"$W/rows"
	done <"$W/round"
done
echo "| 1 MiB gets, client on the node's host ($ROUNDS rounds, medians; range) | tcp GB/s | shm GB/s | shm / tcp |"
echo "|---|---|---|---|"
for c in 1 4; do
	col() { awk -v c="$c" -v k="$1" '$1 == c {print $k}' "$W/rows"; }
	printf '| concurrency %d | %.2f (%s) | %.2f (%s) | %.2fx (%s) |\n' "$c" \
		"$(col 2 | median)" "$(col 2 | spread)" "$(col 3 | median)" "$(col 3 | spread)" "$(col 4 | median)" "$(col 4 | spread)"
done
