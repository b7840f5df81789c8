package rdma

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
)

func quietLogs(b *testing.B) {
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.Cleanup(func() { slog.SetDefault(old) })
}

func paths(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "server" + strconv.Itoa(i) + "@mlx5_" + strconv.Itoa(i%8)
	}
	return out
}

func BenchmarkStoreGetHit(b *testing.B) {
	s, _ := bareStore(SIEVE, 4096)
	ps := paths(4096)
	for _, p := range ps {
		s.Insert(p)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if s.Get(ps[i&4095]) == nil {
				b.Fatal("miss")
			}
			i++
		}
	})
}

func BenchmarkStoreInsertEvict(b *testing.B) {
	quietLogs(b)
	for _, kind := range []StoreType{SIEVE, FIFO} {
		b.Run(kind.String(), func(b *testing.B) {
			s, _ := bareStore(kind, 1024)
			ps := paths(1 << 16)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := s.Insert(ps[i&(1<<16-1)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkReclaim100k(b *testing.B) {
	const n = 100000
	s, destroyed := bareStore(FIFO, n)
	ps := paths(n)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for _, p := range ps {
			s.Insert(p)
		}
		s.DeleteAll()
		*destroyed = 0
		b.StartTimer()
		if got := s.Reclaim(); got != n || *destroyed != n {
			b.Fatalf("reclaimed %d", got)
		}
	}
}
