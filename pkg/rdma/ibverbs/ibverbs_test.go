//go:build ibverbs && cgo

package ibverbs

import (
	"errors"
	"testing"

	"github.com/kvcache-ops/mc/pkg/rdma"
)

// TestDevices runs against whatever the machine has: without RDMA
// hardware or kernel support the list is empty and reported as
// rdma.ErrNoDevices, never as a failure.
func TestDevices(t *testing.T) {
	p, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := p.Devices()
	if errors.Is(err, rdma.ErrNoDevices) {
		t.Logf("no devices: %v", err)
		if _, err := p.Open("mlx5_0"); !errors.Is(err, rdma.ErrNoDevices) {
			t.Fatalf("open without devices: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Name == "" || len(d.Ports) == 0 {
			t.Errorf("device %+v", d)
		}
	}
}
