// Command soak is the client side of scripts/store-soak.sh: one store
// client process doing puts, upserts, gets and removals of values whose
// bytes encode their key and version, and judging every get against what
// the store acknowledged before the get began.
//
//	go build -o bin/mc-soak ./scripts/soak
//	bin/mc-soak --master 127.0.0.1:21051 --id 3 --journal soak/c3.journal --duration 60s
//
// Every operation is journaled (one line before, one after) to --journal,
// which a restarted client (the soak's chaos loop kills clients
// mid-operation) replays first, so it knows each key's versions across
// its own deaths. Key soak/c<id>/k<n> belongs to client id alone, and to
// one of its goroutines, so the operations on a key are sequential.
//
// A get's bytes are judged with the key's state when it began:
//
//	latest    the version of the last acknowledged put or upsert
//	uncertain a version whose put failed or whose writer was killed, and
//	          which nothing acknowledged has superseded since
//	absent    OBJECT_NOT_FOUND (a cache may always miss)
//	error     any other error (clean: the caller recomputes)
//	WRONG     bytes of another key, corrupt bytes, a version superseded
//	          by an acknowledged put, upsert or removal before the get
//	          began, or a version never put
//
// With --tenant, keys are the tenant's (a master with
// --enable-multi-tenants) and values name the tenant with the key
// ("T|soak/c0/k5"): clients of two tenants use the same key names, so a
// get answered from the other tenant's keys reads as WRONG.
//
// Journal lines (space separated, after the time): "B op key ver" before an operation,
// "E op key ver result ms [detail]" after it, "H op key ms" when an
// operation runs past its deadline by more than --hang-grace.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcache-ops/mc/pkg/engine"
	"github.com/kvcache-ops/mc/pkg/engine/rdmatransport"
	"github.com/kvcache-ops/mc/pkg/store"
)

type keyState struct {
	attempted uint64 // highest version ever tried
	floor     uint64 // lowest version a get may return (an ack's)
	latest    uint64 // version of the last acknowledged put (0: none)
	removedAt uint64 // attempted when the last acknowledged removal ran
}

type journal struct {
	mu sync.Mutex
	f  *os.File
}

func (j *journal) line(format string, args ...any) {
	s := time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...) + "\n"
	j.mu.Lock()
	_, _ = j.f.WriteString(s) // unbuffered: a SIGKILL loses nothing written
	j.mu.Unlock()
}

func main() {
	master := flag.String("master", "127.0.0.1:50051", "master RPC address (host:port or etcd://H:P)")
	id := flag.Int("id", 0, "client id: its keys are soak/c<id>/k<n>")
	jpath := flag.String("journal", "", "journal file (appended; replayed at start)")
	dur := flag.Duration("duration", time.Minute, "how long to run")
	nkeys := flag.Int("keys", 96, "keys of this client")
	workers := flag.Int("workers", 4, "goroutines (each owns keys n%workers)")
	sizes := flag.String("sizes", "4096,65536,262144,1048576", "value sizes, bytes, comma-separated")
	deadline := flag.Duration("op-timeout", 8*time.Second, "each operation's deadline")
	grace := flag.Duration("hang-grace", 10*time.Second, "an operation still running this long past its deadline is a hang")
	checksums := flag.Bool("checksums", true, "store.Config.Checksums")
	tenant := flag.String("tenant", "", "the tenant of this client's keys (default: none given)")
	protocol := flag.String("protocol", "tcp", "transport: tcp, auto (shared memory with same-host nodes) or rdma")
	devices := flag.String("device-name", "soft0", "RDMA NICs with --protocol rdma (soft*: the software NIC)")
	flag.Parse()
	if *jpath == "" {
		fmt.Fprintln(os.Stderr, "mc-soak: --journal is required")
		os.Exit(64)
	}
	var sz []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 64 {
			fmt.Fprintf(os.Stderr, "mc-soak: --sizes: %q is not a size of at least 64 bytes\n", s)
			os.Exit(64)
		}
		sz = append(sz, n)
	}
	states := make([]keyState, *nkeys)
	if err := replay(*jpath, *id, states); err != nil {
		fmt.Fprintf(os.Stderr, "mc-soak: replay %s: %v\n", *jpath, err)
		os.Exit(2)
	}
	f, err := os.OpenFile(*jpath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mc-soak: %v\n", err)
		os.Exit(2)
	}
	j := &journal{f: f}
	end := time.Now().Add(*dur)
	ctx, cancel := context.WithDeadline(context.Background(), end.Add(*deadline))
	defer cancel()

	ecfg := engine.Config{BindAddress: "127.0.0.1", HandshakeAddr: "127.0.0.1:0", Protocol: *protocol}
	if *protocol == "rdma" {
		rc, err := rdmatransport.ConfigFromEnv()
		if err == nil {
			rc.Devices, err = rdmatransport.ParseDevices(*devices)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "mc-soak: --device-name: %v\n", err)
			os.Exit(64)
		}
		ecfg.Transports = append(ecfg.Transports, rdmatransport.Factory(rc))
	}
	var c *store.Client
	for {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		c, err = store.New(cctx, store.Config{Master: *master, Checksums: *checksums, Tenant: *tenant,
			EngineConfig: ecfg,
			Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		ccancel()
		if err == nil {
			break
		}
		j.line("N connect 0 error %q", err.Error())
		if time.Now().After(end) {
			os.Exit(0)
		}
		time.Sleep(500 * time.Millisecond)
	}
	defer c.Close(context.Background())

	var inflight sync.Map // worker -> *opStart
	var hangs atomic.Int64
	go func() { // watchdog
		for range time.Tick(time.Second) {
			inflight.Range(func(_, v any) bool {
				o := v.(*opStart)
				if !o.reported && time.Since(o.at) > *deadline+*grace {
					o.reported = true
					hangs.Add(1)
					j.line("H %s %s %d", o.op, o.key, time.Since(o.at).Milliseconds())
				}
				return true
			})
		}
	}()

	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			for time.Now().Before(end) {
				n := w + *workers*rng.IntN((*nkeys+*workers-1-w) / *workers)
				if n >= *nkeys {
					continue
				}
				key := fmt.Sprintf("soak/c%d/k%d", *id, n)
				name := key // what the values say they are
				if *tenant != "" {
					name = *tenant + "|" + key
				}
				st := &states[n]
				r := rng.IntN(100)
				octx, ocancel := context.WithTimeout(context.Background(), *deadline)
				o := &opStart{at: time.Now(), key: key}
				inflight.Store(w, o)
				switch {
				case r < 45:
					o.op = "get"
					doGet(octx, c, j, key, name, st)
				case r < 75:
					o.op = "upsert"
					doPut(octx, c, j, key, name, st, sz[rng.IntN(len(sz))], true)
				case r < 85:
					o.op = "put"
					doPut(octx, c, j, key, name, st, sz[rng.IntN(len(sz))], false)
				default:
					o.op = "rm"
					doRm(octx, c, j, key, st)
				}
				inflight.Delete(w)
				ocancel()
			}
		}(w)
	}
	wg.Wait()
	if hangs.Load() > 0 {
		os.Exit(3)
	}
}

type opStart struct {
	at       time.Time
	op, key  string
	reported bool
}

// value is size bytes that name key and version and fill the rest from
// a generator seeded by both, so any byte of another key or version, or
// any torn or shifted range, shows.
func value(key string, ver uint64, size int) []byte {
	b := make([]byte, size)
	hdr := fmt.Sprintf("%s v=%d ", key, ver)
	n := copy(b, hdr)
	h := fnv.New64a()
	h.Write([]byte(hdr))
	x := h.Sum64() | 1
	for i := n; i < size; i++ {
		if (i-n)%8 == 0 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		b[i] = byte(x >> (8 * ((i - n) % 8)))
	}
	return b
}

// decode says which key and version b claims and whether the rest of
// its bytes are that value's.
func decode(b []byte) (key string, ver uint64, ok bool) {
	fields := strings.SplitN(string(b[:min(len(b), 4200)]), " ", 3)
	if len(fields) < 3 || !strings.HasPrefix(fields[1], "v=") {
		return "", 0, false
	}
	v, err := strconv.ParseUint(fields[1][2:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	want := value(fields[0], v, len(b))
	return fields[0], v, string(want) == string(b)
}

func doPut(ctx context.Context, c *store.Client, j *journal, key, name string, st *keyState, size int, upsert bool) {
	st.attempted++
	v := st.attempted
	op := "put"
	if upsert {
		op = "upsert"
	}
	j.line("B %s %s %d", op, key, v)
	t := time.Now()
	var err error
	if upsert {
		err = c.Upsert(ctx, key, value(name, v, size))
	} else {
		err = c.Put(ctx, key, value(name, v, size))
	}
	ms := time.Since(t).Milliseconds()
	switch {
	case err == nil:
		st.floor, st.latest = v, v
		j.line("E %s %s %d ok %d", op, key, v, ms)
	case !upsert && store.CodeOf(err) == store.ObjectAlreadyExists:
		// Not stored, and certainly not: v can never be read.
		j.line("E %s %s %d exists %d", op, key, v, ms)
	default:
		j.line("E %s %s %d error %d %q", op, key, v, ms, err.Error())
	}
}

func doRm(ctx context.Context, c *store.Client, j *journal, key string, st *keyState) {
	j.line("B rm %s %d", key, st.attempted)
	t := time.Now()
	err := c.Remove(ctx, key, false)
	ms := time.Since(t).Milliseconds()
	switch {
	case err == nil:
		st.floor, st.latest, st.removedAt = st.attempted+1, 0, st.attempted
		j.line("E rm %s %d ok %d", key, st.attempted, ms)
	case store.CodeOf(err) == store.ObjectNotFound:
		j.line("E rm %s %d nf %d", key, st.attempted, ms)
	default:
		j.line("E rm %s %d error %d %q", key, st.attempted, ms, err.Error())
	}
}

func doGet(ctx context.Context, c *store.Client, j *journal, key, name string, st *keyState) {
	floor, attempted, latest := st.floor, st.attempted, st.latest
	t := time.Now()
	b, err := c.Get(ctx, key)
	ms := time.Since(t).Milliseconds()
	if err != nil {
		res := "error"
		if errors.Is(err, store.ErrObjectNotFound) {
			res = "absent"
		}
		j.line("E get %s 0 %s %d %q", key, res, ms, err.Error())
		return
	}
	k, v, ok := decode(b)
	switch {
	case k != name:
		j.line("E get %s %d WRONG %d %q", key, v, ms, fmt.Sprintf("bytes of key %q (%d bytes)", k, len(b)))
	case !ok:
		j.line("E get %s %d WRONG %d %q", key, v, ms, fmt.Sprintf("corrupt value claiming version %d (%d bytes)", v, len(b)))
	case v > attempted:
		j.line("E get %s %d WRONG %d %q", key, v, ms, fmt.Sprintf("version %d was never put (highest %d)", v, attempted))
	case v < floor:
		j.line("E get %s %d WRONG %d %q", key, v, ms, fmt.Sprintf("stale: version %d superseded (floor %d, latest ack %d, removed at %d)", v, floor, latest, st.removedAt))
	case v == latest:
		j.line("E get %s %d latest %d", key, v, ms)
	default:
		j.line("E get %s %d uncertain %d", key, v, ms)
	}
}

// replay rebuilds the keys' states from an earlier incarnation's journal:
// a "B" with no "E" (killed mid-operation) counts as attempted.
func replay(path string, id int, states []keyState) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	prefix := fmt.Sprintf("soak/c%d/k", id)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 0 {
			fs = fs[1:] // the time
		}
		if len(fs) < 4 || !strings.HasPrefix(fs[2], prefix) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(fs[2], prefix))
		if err != nil || n < 0 || n >= len(states) {
			continue
		}
		v, _ := strconv.ParseUint(fs[3], 10, 64)
		st := &states[n]
		switch {
		case fs[0] == "B" && (fs[1] == "put" || fs[1] == "upsert"):
			st.attempted = max(st.attempted, v)
		case fs[0] == "E" && (fs[1] == "put" || fs[1] == "upsert") && len(fs) > 4 && fs[4] == "ok":
			st.floor, st.latest = v, v
		case fs[0] == "E" && fs[1] == "rm" && len(fs) > 4 && fs[4] == "ok":
			st.floor, st.latest, st.removedAt = v+1, 0, v
		}
	}
	return sc.Err()
}
