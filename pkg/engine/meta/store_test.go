package meta

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// testRawStore checks what every storing backend's Store shares: raw reads
// with revisions where the store has them, listing in key order, and
// all-or-nothing compare-and-delete. revisions says whether rewriting the
// same bytes counts as a change (etcd's ModRevision does).
func testRawStore(t *testing.T, b Backend, canList, revisions bool) {
	ctx := context.Background()
	st, err := StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	pfx := st.Prefix()
	if err := b.PutSegment(ctx, tcpDesc("n2")); err != nil {
		t.Fatal(err)
	}
	if err := b.PutSegment(ctx, tcpDesc("n1")); err != nil {
		t.Fatal(err)
	}
	if err := b.PutRPCMeta(ctx, "n1", RPCMeta{IPOrHostName: "127.0.0.1", RPCPort: 15001}); err != nil {
		t.Fatal(err)
	}
	seg, found, err := st.ReadKey(ctx, SegmentKey(st.ClusterID(), "n1"))
	if err != nil || !found || !strings.Contains(string(seg.Value), `"name":"n1"`) {
		t.Fatalf("read n1: %+v %v %v", seg, found, err)
	}
	if revisions != (seg.Revision != 0) {
		t.Fatalf("revision %d, store has revisions: %v", seg.Revision, revisions)
	}
	if _, found, err := st.ReadKey(ctx, pfx+"ram/absent"); found || err != nil {
		t.Fatalf("read absent: %v %v", found, err)
	}

	kvs, err := st.ListKeys(ctx, pfx)
	if !canList {
		if !errors.Is(err, ErrNoList) {
			t.Fatalf("list on a store without a list call: %v", err)
		}
	} else {
		var keys []string
		for _, kv := range kvs {
			keys = append(keys, kv.Key)
		}
		want := pfx + "ram/n1," + pfx + "ram/n2," + pfx + "rpc_meta/n1"
		if strings.Join(keys, ",") != want || err != nil {
			t.Fatalf("list: %v %v, want %s", keys, err, want)
		}
	}

	rpc, _, err := st.ReadKey(ctx, RPCMetaKey(st.ClusterID(), "n1"))
	if err != nil {
		t.Fatal(err)
	}
	// Changed since read: nothing is deleted, not even the unchanged key.
	d := tcpDesc("n1")
	d.TCPDataPort = 17000
	if err := b.PutSegment(ctx, d); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.CompareAndDelete(ctx, seg, rpc); ok || err != nil {
		t.Fatalf("delete after a change: %v %v", ok, err)
	}
	if _, found, _ := st.ReadKey(ctx, rpc.Key); !found {
		t.Fatal("rpc meta deleted although the descriptor changed")
	}
	// Unchanged since read: both go.
	seg, _, _ = st.ReadKey(ctx, seg.Key)
	if ok, err := st.CompareAndDelete(ctx, seg, rpc); !ok || err != nil {
		t.Fatalf("delete unchanged: %v %v", ok, err)
	}
	for _, k := range []string{seg.Key, rpc.Key} {
		if _, found, _ := st.ReadKey(ctx, k); found {
			t.Fatalf("%s still there", k)
		}
	}
	// Gone already: not deleted by us.
	if ok, err := st.CompareAndDelete(ctx, seg); ok || err != nil {
		t.Fatalf("delete of a deleted key: %v %v", ok, err)
	}
	// The same bytes written again: a new registration for etcd.
	n2, _, _ := st.ReadKey(ctx, SegmentKey(st.ClusterID(), "n2"))
	if err := b.PutSegment(ctx, tcpDesc("n2")); err != nil {
		t.Fatal(err)
	}
	ok, err := st.CompareAndDelete(ctx, n2)
	if err != nil || ok == revisions {
		t.Fatalf("delete after a rewrite of the same bytes: deleted=%v err=%v (revisions %v)", ok, err, revisions)
	}

	// Raw writes and deletes, outside Mooncake's key layout.
	raw := "mc-test/raw/k"
	if err := st.WriteKey(ctx, raw, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := st.WriteKey(ctx, raw, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if kv, found, err := st.ReadKey(ctx, raw); err != nil || !found || string(kv.Value) != "v2" {
		t.Fatalf("read after write: %q found=%v err=%v", kv.Value, found, err)
	}
	if err := st.DeleteKey(ctx, raw); err != nil {
		t.Fatal(err)
	}
	if _, found, err := st.ReadKey(ctx, raw); found || err != nil {
		t.Fatalf("read after delete: found=%v err=%v", found, err)
	}
	if err := st.DeleteKey(ctx, raw); err != nil {
		t.Fatalf("delete of an absent key: %v", err)
	}
}

func TestRawStoreMemory(t *testing.T) {
	b := NewMemory()
	defer b.Close()
	testRawStore(t, b, true, false)
	if !mustStore(t, b).AtomicDelete() {
		t.Fatal("memory compare-and-delete is atomic")
	}
}

func TestRawStoreEtcd(t *testing.T) {
	ee := startEtcd(t)
	for _, cluster := range []string{"", "c1"} {
		b, err := Open(context.Background(), ee.Endpoints()[0], Options{ClusterID: cluster})
		if err != nil {
			t.Fatal(err)
		}
		testRawStore(t, b, true, true)
		if !mustStore(t, b).AtomicDelete() {
			t.Fatal("etcd compare-and-delete is atomic")
		}
		b.Close()
	}
}

func TestRawStoreEtcdListPages(t *testing.T) {
	ee := startEtcd(t)
	ctx := context.Background()
	b, err := Open(ctx, ee.Endpoints()[0], Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 2*listPage + 7
	for i := 0; i < n; i++ {
		if err := b.PutRPCMeta(ctx, strings.Repeat("x", i%5+1)+string(rune('a'+i%26))+strings.Repeat("0", i/26), RPCMeta{IPOrHostName: "h", RPCPort: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// A key just past the prefix must not be listed.
	if err := b.PutRPCMeta(ctx, "z", RPCMeta{IPOrHostName: "h", RPCPort: 1}); err != nil {
		t.Fatal(err)
	}
	kvs, err := mustStore(t, b).ListKeys(ctx, "mooncake/rpc_meta/x")
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != n {
		t.Fatalf("listed %d keys, want %d", len(kvs), n)
	}
	for i := 1; i < len(kvs); i++ {
		if kvs[i-1].Key >= kvs[i].Key {
			t.Fatalf("not sorted or repeated: %s then %s", kvs[i-1].Key, kvs[i].Key)
		}
	}
}

func TestRawStoreHTTP(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler())
	defer srv.Close()
	b, err := Open(context.Background(), srv.URL+"/metadata", Options{ClusterID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	testRawStore(t, b, false, false)
	if mustStore(t, b).AtomicDelete() {
		t.Fatal("HTTP has no conditional delete")
	}
}

func TestStoreOfP2P(t *testing.T) {
	b, err := Open(context.Background(), P2PHandshake, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := StoreOf(b); !errors.Is(err, ErrNoStore) {
		t.Fatalf("P2P store: %v", err)
	}
}

func mustStore(t *testing.T, b Backend) Store {
	t.Helper()
	st, err := StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
