package kvevents

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// Event is one decoded KV event. Fields holds the whole map as sent,
// nil fields included.
type Event struct {
	ID        uint64
	Timestamp int64 // unix milliseconds
	Type      string
	TenantID  string
	BackendID string
	Medium    string
	ObjectKey string
	SeqHashes []uint64
	Fields    map[string]any
}

// Batch is one published message.
type Batch struct {
	Seq       uint64
	Timestamp int64 // unix milliseconds
	Events    []Event
	DPRank    uint64
}

// DecodePayload decodes a message's msgpack payload
// [timestamp_ms, [event...], dp_rank].
func DecodePayload(b []byte) (ts int64, events []Event, dpRank uint64, err error) {
	v, rest, err := decodeValue(b)
	if err != nil {
		return 0, nil, 0, err
	}
	if len(rest) != 0 {
		return 0, nil, 0, fmt.Errorf("payload: %d bytes after the batch", len(rest))
	}
	arr, ok := v.([]any)
	if !ok || len(arr) < 2 {
		return 0, nil, 0, errors.New("payload: want [timestamp, [events], dp_rank]")
	}
	ts, ok = asInt(arr[0])
	if !ok {
		return 0, nil, 0, fmt.Errorf("payload: timestamp %v is not an integer", arr[0])
	}
	if len(arr) > 2 {
		if r, ok := asInt(arr[2]); ok && r >= 0 {
			dpRank = uint64(r)
		}
	}
	evs, ok := arr[1].([]any)
	if !ok {
		return 0, nil, 0, errors.New("payload: events are not a list")
	}
	for i, x := range evs {
		m, ok := x.(map[string]any)
		if !ok {
			return 0, nil, 0, fmt.Errorf("payload: event %d is not a map", i)
		}
		e := Event{Fields: m}
		if id, ok := m["event_id"].(uint64); ok {
			e.ID = id
		}
		e.Timestamp, _ = asInt(m["timestamp"])
		e.Type, _ = m["event_type"].(string)
		if e.Type == "" {
			switch m["type"] {
			case "BlockStored":
				e.Type = "stored"
			case "BlockRemoved":
				e.Type = "removed"
			}
		}
		e.TenantID, _ = m["tenant_id"].(string)
		e.BackendID, _ = m["backend_id"].(string)
		e.Medium, _ = m["medium"].(string)
		e.ObjectKey, _ = m["object_key"].(string)
		if hs, ok := m["seq_hashes"].([]any); ok {
			for _, h := range hs {
				switch h := h.(type) {
				case uint64:
					e.SeqHashes = append(e.SeqHashes, h)
				case int64:
					e.SeqHashes = append(e.SeqHashes, uint64(h))
				}
			}
		}
		events = append(events, e)
	}
	return ts, events, dpRank, nil
}

func asInt(v any) (int64, bool) {
	switch v := v.(type) {
	case uint64:
		return int64(v), true
	case int64:
		return v, true
	}
	return 0, false
}

// Subscriber is a SUB socket connected to a publisher, subscribed to
// every topic.
type Subscriber struct {
	c net.Conn
	r *bufio.Reader
	// frames are NextRaw's, read into again by the next call
	frames [][]byte
}

// Subscribe connects to endpoint (tcp://HOST:PORT or ipc://PATH).
func Subscribe(ctx context.Context, endpoint string) (*Subscriber, error) {
	network, addr, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	// The handshake ends with ctx too (a peer that accepts and never
	// answers).
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	r := bufio.NewReaderSize(c, 64<<10)
	if err := handshake(c, r, false, "SUB", "PUB", "XPUB"); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%s: %w", endpoint, err)
	}
	if _, err := c.Write(appendFrame(nil, 0, []byte{1})); err != nil { // subscribe to ""
		_ = c.Close()
		return nil, fmt.Errorf("%s: subscribe: %w", endpoint, err)
	}
	return &Subscriber{c: c, r: r}, nil
}

// Next reads the next message: its frames are the topic, the sequence
// number and the payload.
func (s *Subscriber) Next() (Batch, error) {
	seq, payload, err := s.NextRaw()
	if err != nil {
		return Batch{}, err
	}
	b := Batch{Seq: seq}
	b.Timestamp, b.Events, b.DPRank, err = DecodePayload(payload)
	if err != nil {
		return Batch{}, fmt.Errorf("message %d: %w", b.Seq, err)
	}
	return b, nil
}

// NextRaw reads the next message and returns its sequence number and
// its msgpack payload undecoded, for a consumer that forwards or stores
// the stream as it came. The payload is read into the same buffer by
// every call: it holds until the next.
func (s *Subscriber) NextRaw() (seq uint64, payload []byte, err error) {
	frames := s.frames[:0]
	for {
		var buf []byte
		if n := len(frames); n < cap(frames) {
			buf = frames[:n+1][n]
		}
		flags, body, err := readFrameInto(s.r, maxPublisherFrame, buf[:0])
		if err != nil {
			return 0, nil, err
		}
		if flags&flagCommand != 0 {
			continue
		}
		frames = append(frames, body)
		s.frames = frames
		if flags&flagMore == 0 {
			break
		}
		if len(frames) > 16 {
			return 0, nil, errors.New("message of more than 16 frames: not a KV event batch")
		}
	}
	if len(frames) != 3 || len(frames[1]) != 8 {
		return 0, nil, fmt.Errorf("message of %d frames: want topic, 8-byte sequence number, payload", len(frames))
	}
	return binary.BigEndian.Uint64(frames[1]), frames[2], nil
}

// Close closes the connection (a pending Next returns an error).
func (s *Subscriber) Close() error { return s.c.Close() }
