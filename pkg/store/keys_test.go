package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvcache-ops/mc/pkg/cororpc"
	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/store/mooncake"
	pb "github.com/kvcache-ops/mc/pkg/store/storepb"
)

// badKeys break the key rule (store.CheckKey), each with what the error
// must say.
var badKeys = map[string]string{
	"a\nb":          `control character '\n' at byte 1`,
	"tab\there":     `control character '\t' at byte 3`,
	"del\x7f":       `control character '\x7f' at byte 3`,
	"c1\u0085":      `control character '\u0085' at byte 2`,
	"bad\xffutf8":   "not valid UTF-8 (byte 0xff at 3)",
	"trunc\xe6\x97": "not valid UTF-8 (byte 0xe6 at 5)",
	"nul\x00":       "NUL byte at 3",
	"":              "empty key",
}

func TestCheckKey(t *testing.T) {
	for _, k := range []string{"k", "model:llama-70b@rank0/layer 3", "模型/层0", `"quoted"`, "emoji🙂", strings.Repeat("é", store.MaxKeyLength/2)} {
		if err := store.CheckKey(k); err != nil {
			t.Errorf("CheckKey(%q) = %v, want nil", k, err)
		}
	}
	for k, want := range badKeys {
		err := store.CheckKey(k)
		if !errors.Is(err, store.ErrInvalidKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckKey(%q) = %v, want INVALID_KEY saying %q", k, err, want)
		}
	}
}

// A key that breaks the rule is refused by the client with INVALID_KEY
// on every verb and both wires, alone in its batch: the other keys of the
// batch go through. Before, a key with a newline was stored, and a key
// that is not UTF-8 failed the whole gRPC batch with RPC_FAIL ("string
// field contains invalid UTF-8").
func TestClientRefusesBadKeys(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(16 << 20)
	ctx := context.Background()
	for name, cl := range map[string]*store.Client{"grpc": c.client(0), "mooncake": c.mooncakeClient(0)} {
		for bad, want := range badKeys {
			keys := []string{name + "/ok1", bad, name + "/ok2"}
			isBad := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, store.ErrInvalidKey) || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %s %q: %v, want INVALID_KEY saying %q", name, what, bad, err, want)
				}
			}
			errs := cl.BatchPut(ctx, keys, [][]byte{[]byte("1"), []byte("2"), []byte("3")})
			isBad("put", errs[1])
			if errs[0] != nil || errs[2] != nil {
				t.Errorf("%s: put beside %q: %v", name, bad, errs)
			}
			isBad("upsert", cl.Upsert(ctx, bad, []byte("x")))
			vals, errs := cl.BatchGet(ctx, keys)
			isBad("get", errs[1])
			if errs[0] != nil || errs[2] != nil || string(vals[0]) != "1" || string(vals[2]) != "3" {
				t.Errorf("%s: get beside %q: %q %v", name, bad, vals, errs)
			}
			ex, errs := cl.BatchExist(ctx, keys)
			isBad("exist", errs[1])
			if !ex[0] || ex[1] || !ex[2] || errs[0] != nil || errs[2] != nil {
				t.Errorf("%s: exist beside %q: %v %v", name, bad, ex, errs)
			}
			_, err := cl.Query(ctx, bad)
			isBad("query", err)
			errs = cl.BatchRemove(ctx, keys, true) // the get above leased them
			isBad("remove", errs[1])
			if errs[0] != nil || errs[2] != nil {
				t.Errorf("%s: remove beside %q: %v", name, bad, errs)
			}
		}
		if _, err := cl.GetReplicaListByRegex(ctx, "\xff"); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("%s: regex not UTF-8: %v, want INVALID_PARAMS", name, err)
		}
	}
	if n := c.m.Stats().Keys; n != 0 {
		t.Errorf("%d keys left stored", n)
	}
}

// The master refuses a key that breaks the rule on both wires, from a
// peer that does not check (another implementation, an older mc).
func TestMasterRefusesBadKeys(t *testing.T) {
	c := startMaster(t, master.Config{})
	c.client(16 << 20)
	ctx := context.Background()
	raw := rawClient(t, c.addr)
	mc := mooncake.NewClient(c.addr, &cororpc.Options{})
	t.Cleanup(func() { mc.Close() })
	client := mooncake.UUID{First: 1, Second: 2}
	for bad := range badKeys {
		if utf8.ValidString(bad) {
			// gRPC carries only UTF-8: the others cannot be sent on it.
			r, err := raw.BatchPutStart(ctx, &pb.BatchPutStartRequest{ClientId: store.UUIDToPB(store.NewUUID()), Items: []*pb.PutStartItem{{Key: bad, Length: 10}}, Config: &pb.ReplicateConfig{ReplicaNum: 1}})
			if err != nil || r.Results[0].Code != int32(store.InvalidKey) {
				t.Errorf("gRPC put start %q: %v %v, want INVALID_KEY", bad, r, err)
			}
			e, err := raw.BatchExistKey(ctx, &pb.BatchKeysRequest{Keys: []string{bad}})
			if err != nil || e.Results[0].Code != int32(store.InvalidKey) {
				t.Errorf("gRPC exist %q: %v %v, want INVALID_KEY", bad, e, err)
			}
		}
		_, errs, err := mc.BatchPutStart(ctx, client, []string{bad}, []uint64{10}, mooncake.ReplicateConfig{ReplicaNum: 1}, false)
		var me *mooncake.Error
		if err != nil || !errors.As(errs[0], &me) || me.Code != mooncake.ErrorCode(store.InvalidKey) {
			t.Errorf("Mooncake wire put start %q: %v %v, want INVALID_KEY", bad, errs, err)
		}
		_, errs, err = mc.BatchExistKey(ctx, []string{bad})
		if err != nil || !errors.As(errs[0], &me) || me.Code != mooncake.ErrorCode(store.InvalidKey) {
			t.Errorf("Mooncake wire exist %q: %v %v, want INVALID_KEY", bad, errs, err)
		}
	}
	if n := c.m.Stats().Keys; n != 0 {
		t.Errorf("%d keys stored", n)
	}
}
