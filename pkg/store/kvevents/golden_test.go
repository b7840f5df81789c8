package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// goldenEvents queues what every golden case publishes: hashed keys in
// each form ParseSeqHash takes, keys that are no hash (short, 32 bytes
// and over, 256 bytes and over), tenants' keys, both media and none,
// removals, then (fill) enough events for a second message, then a new
// term.
func goldenEvents(p *Publisher, fill bool) {
	p.Stored("1234567", MediumCPU)
	p.Stored("0x1f2e", MediumCPU)
	p.Stored("plainkey", MediumCPU)
	p.Removed("1234567", MediumCPU)
	p.Stored("tenant-a\x000xABC", MediumDisk)
	p.Removed("tenant-a\x00plain", MediumDisk)
	p.Removed("0X1F2E", "")
	p.Stored("18446744073709551615", MediumCPU)
	p.Stored("-1", MediumCPU)
	p.Stored(" +42", MediumCPU)
	p.Stored("0x8000000000000000", MediumCPU) // block_hashes: Mooncake's int64 cast makes it negative
	p.Stored(strings.Repeat("k", 40), MediumCPU)
	p.Stored(strings.Repeat("long-key-", 30), MediumDisk)
	p.Stored("", MediumCPU) // no key: never sent
	for i := range MooncakeMaxBatch {
		if fill {
			p.Stored(fmt.Sprint(1000+i), MediumCPU)
		}
	}
	p.NewTerm()
	p.Stored("7", MediumCPU)
	p.Removed("7", MediumCPU)
}

// TestGoldenWire: the bytes on the wire, frames and msgpack, for the
// events of goldenEvents under each option: testdata/wire-*.golden (a
// hex dump per message). go test -run TestGoldenWire -update rewrites
// them; review their diff as code, for they are what Mooncake's
// consumers decode.
func TestGoldenWire(t *testing.T) {
	clock := func() time.Time { return time.UnixMilli(1764259200123) }
	for _, c := range []struct {
		name string
		cfg  Config
		fill bool
	}{
		{"default", Config{}, true},
		{"no-legacy", Config{NoLegacyFields: true}, false},
		{"no-object-key", Config{NoObjectKey: true}, false},
		{"queue-full", Config{QueueCapacity: 6}, true},
		{"short-frame", Config{NoLegacyFields: true, NoObjectKey: true}, false}, // a payload under 256 bytes
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			// mooncake_master's batching: the fill's events end one
			// message and begin the next, as its kMaxBatchSize splits them.
			cfg.now, cfg.BackendID, cfg.MaxBatch = clock, "pool-a", MooncakeMaxBatch
			p := newTestPublisher(t, cfg)
			conn, r := rawSubscriber(t, p)
			if c.name == "short-frame" {
				p.Removed("1", "")
			} else {
				goldenEvents(p, c.fill)
			}
			publishNow(p)
			go p.run() // for Close
			var dump bytes.Buffer
			for i := range p.Stats().PublishedBatches {
				m, err := readRawMessage(conn, r)
				if err != nil {
					t.Fatalf("message %d: %v", i+1, err)
				}
				fmt.Fprintf(&dump, "message %d, %d bytes\n%s", i+1, len(m), hex.Dump(m))
			}
			path := filepath.Join("testdata", "wire-"+c.name+".golden")
			if *update {
				if err := os.WriteFile(path, dump.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dump.Bytes(), want) {
				got := path + ".got"
				_ = os.WriteFile(got, dump.Bytes(), 0o644)
				t.Errorf("wire bytes differ from %s (written to %s; diff them)", path, got)
			}
		})
	}
}

// rawSubscriber connects to p as a SUB subscribed to everything and
// returns the connection for reading the bytes as they come.
func rawSubscriber(t *testing.T, p *Publisher) (net.Conn, *bufio.Reader) {
	t.Helper()
	network, addr, err := ParseEndpoint(p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	r := bufio.NewReader(c)
	if err := handshake(c, r, false, "SUB", "PUB"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte{0, 1, 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscriber", func() bool { return p.Stats().Subscribers == 1 })
	return c, r
}

// readRawMessage reads one message's frames as they are on the wire.
func readRawMessage(c net.Conn, r *bufio.Reader) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var m []byte
	for {
		flags, err := r.ReadByte()
		if err != nil {
			return nil, err
		}
		m = append(m, flags)
		var n uint64
		if flags&flagLong != 0 {
			var sz [8]byte
			if _, err := io.ReadFull(r, sz[:]); err != nil {
				return nil, err
			}
			m, n = append(m, sz[:]...), binary.BigEndian.Uint64(sz[:])
		} else {
			b, err := r.ReadByte()
			if err != nil {
				return nil, err
			}
			m, n = append(m, b), uint64(b)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, err
		}
		m = append(m, body...)
		if flags&flagMore == 0 {
			return m, nil
		}
	}
}
