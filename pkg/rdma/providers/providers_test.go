package providers

import (
	"io"
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	t.Setenv("MC_SOFT_NICS", "softA:0:16,softB")
	for _, kind := range []string{"soft", "auto", ""} {
		p, err := Open(kind)
		if err != nil {
			t.Fatalf("%q: %v", kind, err)
		}
		// No RDMA hardware here: auto falls back to the soft NICs.
		devs, err := p.Devices()
		if err != nil || len(devs) != 2 || devs[0].Name != "softA" || devs[0].MaxQP != 16 {
			t.Fatalf("%q: %+v %v", kind, devs, err)
		}
		if c, ok := p.(io.Closer); ok {
			c.Close()
		}
	}
	if _, err := Open("verbs"); err == nil {
		t.Fatal("unknown provider accepted")
	}
	t.Setenv("MC_SOFT_NICS", "a:zz")
	for _, kind := range []string{"soft", "auto"} {
		// A failed open is a nil interface, not a nil *soft.Provider in
		// one that a caller's "if p != nil { close }" would call into.
		if p, err := Open(kind); err == nil || p != nil {
			t.Fatalf("%q with bad MC_SOFT_NICS: %#v, %v; want a nil provider and an error", kind, p, err)
		}
	}
}

func TestGIDIndexFromEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "MC_GID_INDEX" {
				return v
			}
			return ""
		}
	}
	if o, err := ibverbsOptions(env("3")); err != nil || o.GIDIndex != 3 {
		t.Fatalf("MC_GID_INDEX=3: %+v %v", o, err)
	}
	if o, err := ibverbsOptions(env("")); err != nil || o.GIDIndex != 0 {
		t.Fatalf("unset: %+v %v", o, err)
	}
	for _, bad := range []string{"x", "-1", "256"} {
		if _, err := ibverbsOptions(env(bad)); err == nil || !strings.Contains(err.Error(), "MC_GID_INDEX") {
			t.Fatalf("MC_GID_INDEX=%q: %v", bad, err)
		}
	}
	t.Setenv("MC_GID_INDEX", "nope")
	if _, err := Open("soft"); err == nil {
		t.Fatal("Open ignored a malformed MC_GID_INDEX")
	}
}
