package alloc_test

import (
	"errors"
	"fmt"

	"github.com/kvcache-ops/mc/pkg/store/alloc"
)

func Example() {
	// A segment of 1 MiB registered at 0x7f0000000000 by a node.
	seg, err := alloc.New(0x7f0000000000, 1<<20)
	if err != nil {
		panic(err)
	}
	a, _ := seg.Alloc(1000) // rounded up to 1024
	b, _ := seg.Alloc(4096)
	fmt.Printf("%#x %#x used %d\n", a, b, seg.Used())

	if _, err := seg.Alloc(2 << 20); errors.Is(err, alloc.ErrNoSpace) {
		fmt.Println("2 MiB: no space")
	}
	if err := seg.Free(a, 1000); err != nil {
		panic(err)
	}
	fmt.Println(errors.Is(seg.Free(a, 1000), alloc.ErrBadFree)) // double free

	// A new master rebuilds the segment from the replicas it still holds,
	// and never places a new object over them.
	again, err := alloc.NewWithUsed(0x7f0000000000, 1<<20, []alloc.Range{{Addr: b, Len: 4096}})
	if err != nil {
		panic(err)
	}
	c, _ := again.Alloc(4096)
	fmt.Printf("%#x available %d largest %d\n", c, again.Available(), again.LargestFree())
	// Output:
	// 0x7f0000000000 0x7f0000000400 used 5120
	// 2 MiB: no space
	// true
	// 0x7f0000001400 available 1040384 largest 1039360
}
