package ibverbs

import "testing"

func TestPlacement(t *testing.T) {
	pci, numa := placement("testdata", "mlx5_0")
	if pci != "0000:3b:00.0" || numa != 1 {
		t.Fatalf("got %q %d, want 0000:3b:00.0 1", pci, numa)
	}
	pci, numa = placement("testdata", "nosuch")
	if pci != "" || numa != -1 {
		t.Fatalf("missing device: got %q %d", pci, numa)
	}
}
