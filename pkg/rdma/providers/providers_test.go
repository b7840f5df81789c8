package providers

import (
	"io"
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
	if _, err := Open("soft"); err == nil {
		t.Fatal("bad MC_SOFT_NICS accepted")
	}
}
