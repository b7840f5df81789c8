package store_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvcache-ops/mc/pkg/store"
)

// deadAddr is a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// A master that cannot be found is an error from New, for a client and a
// node alike, never a panic in New's cleanup (issue 34.4: a failed
// etcd:// dial left a nil *grpcWire in the client's wire interface and
// the cleanup closed it).
func TestNewWithUnreachableMaster(t *testing.T) {
	etcd := "etcd://" + deadAddr(t)
	for _, tc := range []struct {
		name, master string
		segment      uint64
		want         string
	}{
		{"etcd client", etcd, 0, "no leader within 300ms"},
		{"etcd node", etcd, 4 << 20, "no leader within 300ms"},
		{"grpc client", deadAddr(t), 0, "RPC_FAIL"},
		{"mooncake client", "mooncake://" + deadAddr(t), 0, "RPC_FAIL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				c   *store.Client
				err error
			)
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("store.New panicked: %v", r)
					}
				}()
				c, err = store.New(context.Background(), store.Config{
					Master: tc.master, EngineConfig: engineConfig(), SegmentSize: tc.segment,
					RPCTimeout: 300 * time.Millisecond, StagingSize: 1 << 20,
				})
			}()
			if err == nil {
				c.Close(context.Background())
				t.Fatalf("New succeeded against %s", tc.master)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
