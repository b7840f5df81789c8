#!/usr/bin/env bash
# make demo's store part: start `mc serve store` on its embedded default (a
# master with one segment) on free loopback ports, put a value, get it back,
# show `mc store stat`, stop it.
set -euo pipefail
mc=${MC:-./bin/mc}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()' 2>/dev/null || echo $((20000 + RANDOM % 20000)); }
rpc=$(free_port); admin=$(free_port)
tmp=$(mktemp -d)
"$mc" serve store --rpc_address 127.0.0.1 --rpc_port "$rpc" --metrics_port "$admin" \
	--local-hostname 127.0.0.1 --segment-size 256M >"$tmp/serve.log" 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
m=(--master "127.0.0.1:$rpc" --admin "http://127.0.0.1:$admin")
for _ in $(seq 100); do "$mc" store ls "${m[@]}" >/dev/null 2>&1 && break; sleep 0.05; done
echo "\$ mc serve store   # master + a 256 MiB segment, RPC 127.0.0.1:$rpc, admin :$admin"
head -c 4194304 /dev/urandom >"$tmp/block.bin"
echo "\$ mc store put demo/block-0 block.bin"
"$mc" store put demo/block-0 "$tmp/block.bin" "${m[@]}"
echo "\$ mc store get demo/block-0 --file copy.bin"
"$mc" store get demo/block-0 --file "$tmp/copy.bin" "${m[@]}"
cmp "$tmp/block.bin" "$tmp/copy.bin" && echo "copy.bin is byte-identical to block.bin"
echo "\$ mc store stat"
"$mc" store stat "${m[@]}"
