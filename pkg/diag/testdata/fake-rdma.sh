#!/bin/sh
# Stand-in for iproute2's rdma in tests (synthesised, not a real capture).
# FAKE_RDMA_MODE picks the behaviour:
#   nonetlink  what rdma prints on a host without RDMA netlink
#   fail       an unrelated failure
#   hang       never answers (the caller's timeout must fire)
#   growth     `-j resource show` whose QP counts rise by 600 per call on
#              mlx5_0..1 (the call count is kept in FAKE_RDMA_STATE);
#              `-j resource show qp` lists three QPs on mlx5_0
#   empty      an empty JSON array (no devices)
# FAKE_RDMA_SLEEP, when set, is how long each call takes first (seconds).
[ -n "$FAKE_RDMA_SLEEP" ] && sleep "$FAKE_RDMA_SLEEP"
case "$FAKE_RDMA_MODE" in
nonetlink)
	echo "Failed to open NETLINK_RDMA socket" >&2
	exit 1 ;;
fail)
	echo "rdma: something else broke" >&2
	exit 2 ;;
hang)
	exec sleep 30 ;;
empty)
	echo "[]"
	exit 0 ;;
esac
if [ "$*" = "-j resource show qp" ]; then
	printf '[{"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":1,"type":"GSI","state":"RTS","comm":"ib_core"},\n'
	printf '{"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":7,"type":"RC","state":"ERR","pid":4242,"comm":"python3"},\n'
	printf '{"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":8,"type":"RC","state":"RTS","pid":4242,"comm":"python3"}]\n'
	exit 0
fi
[ "$*" = "-j resource show" ] || { echo "unexpected arguments: $*" >&2; exit 1; }
n=0
[ -n "$FAKE_RDMA_STATE" ] && [ -f "$FAKE_RDMA_STATE" ] && n=$(cat "$FAKE_RDMA_STATE")
[ -n "$FAKE_RDMA_STATE" ] && echo $((n + 1)) > "$FAKE_RDMA_STATE"
a=$((9000 + n * 600))
b=$((9010 + n * 600))
printf '[{"ifindex":0,"ifname":"mlx5_0","pd":12,"cq":40,"qp":%d,"cm_id":0,"mr":1600,"ctx":11,"srq":0}\n,{"ifindex":1,"ifname":"mlx5_1","pd":12,"cq":40,"qp":%d,"cm_id":0,"mr":1600,"ctx":11,"srq":0}\n,{"ifindex":2,"ifname":"mlx5_2","pd":12,"cq":40,"qp":130,"cm_id":0,"mr":1600,"ctx":11,"srq":0}\n]\n' "$a" "$b"
