package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// ZMTP 3.0 (rfc.zeromq.org/spec/23) with the NULL mechanism: what a
// libzmq PUB and SUB speak over tcp:// and ipc://. Only the parts a
// publisher of KV events and its subscribers need are here: the greeting,
// READY, message frames, and subscriptions as messages (3.0) or as
// SUBSCRIBE/CANCEL commands (3.1). Our greeting says 3.0, so a libzmq
// peer speaks 3.0 to us.

const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
	greetingLen = 64
	// handshakeTimeout bounds a peer's greeting and READY.
	handshakeTimeout = 10 * time.Second
	// maxSubscriberFrame bounds what a subscriber may send us
	// (subscriptions are topics: short).
	maxSubscriberFrame = 64 << 10
	// maxPublisherFrame bounds a frame a subscriber accepts.
	maxPublisherFrame = 256 << 20
)

// ParseEndpoint checks a ZMQ endpoint: tcp://HOST:PORT (HOST may be * for
// every interface, as libzmq takes it) or ipc://PATH. It returns the
// network and address to listen on or dial.
func ParseEndpoint(ep string) (network, addr string, err error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return "", "", fmt.Errorf("endpoint %q: want tcp://HOST:PORT or ipc://PATH", ep)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("endpoint %q: want tcp://HOST:PORT: %w", ep, err)
		}
		if _, err := net.LookupPort("tcp", port); err != nil || port == "" {
			return "", "", fmt.Errorf("endpoint %q: bad port %q", ep, port)
		}
		if host == "*" {
			host = ""
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case "ipc":
		if rest == "" {
			return "", "", fmt.Errorf("endpoint %q: want ipc://PATH", ep)
		}
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("endpoint %q: transport %q is not supported: want tcp:// or ipc://", ep, scheme)
}

func greeting(asServer bool) []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	if asServer {
		g[32] = 1
	}
	return g
}

// readGreeting reads and checks a peer's greeting.
func readGreeting(r io.Reader) error {
	var g [greetingLen]byte
	if _, err := io.ReadFull(r, g[:10]); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if g[0] != 0xff || g[9]&1 != 1 {
		return errors.New("peer is not a ZMTP 3 peer (bad greeting signature)")
	}
	if _, err := io.ReadFull(r, g[10:]); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if g[10] < 3 {
		return fmt.Errorf("peer speaks ZMTP %d.%d: want 3.0 or later", g[10], g[11])
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("peer asks for security mechanism %q: only NULL is supported", mech)
	}
	return nil
}

func appendFrame(b []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		b = append(b, flags|flagLong)
		b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	} else {
		b = append(b, flags, byte(len(body)))
	}
	return append(b, body...)
}

// messageRoom is the framing a message's payload needs in front of it:
// the topic frame (2 bytes), the sequence number's (10) and the
// payload's header (9 when long, 2 when short).
const messageRoom = 2 + 10 + 9

// frameMessage frames a KV events message in place: buf holds
// messageRoom bytes of room, then the payload. It writes the empty topic
// frame, the 8-byte big-endian sequence number frame and the payload's
// frame header into the room (the short form for a payload of 255 bytes
// or less, as appendFrame) and returns the framed message, a suffix of
// buf.
func frameMessage(buf []byte, seq uint64) []byte {
	n := len(buf) - messageRoom
	at := 0
	if n <= 255 {
		at = 7 // the short header is 7 bytes shorter
		buf[messageRoom-2], buf[messageRoom-1] = 0, byte(n)
	} else {
		buf[messageRoom-9] = flagLong
		binary.BigEndian.PutUint64(buf[messageRoom-8:messageRoom], uint64(n))
	}
	h := buf[at:]
	h[0], h[1] = flagMore, 0
	h[2], h[3] = flagMore, 8
	binary.BigEndian.PutUint64(h[4:12], seq)
	return h
}

func readyCommand(socketType string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(socketType)))
	body = append(body, socketType...)
	return appendFrame(nil, flagCommand, body)
}

// readFrame reads one frame; bodies over limit are refused.
func readFrame(r *bufio.Reader, limit uint64) (flags byte, body []byte, err error) {
	return readFrameInto(r, limit, nil)
}

// readFrameInto reads one frame into buf's array when it is large
// enough (else a new one); bodies over limit are refused.
func readFrameInto(r *bufio.Reader, limit uint64, buf []byte) (flags byte, body []byte, err error) {
	if flags, err = r.ReadByte(); err != nil {
		return 0, nil, err
	}
	var n uint64
	if flags&flagLong != 0 {
		var sz [8]byte
		if _, err = io.ReadFull(r, sz[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(sz[:])
	} else {
		c, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n = uint64(c)
	}
	if n > limit {
		return 0, nil, fmt.Errorf("frame of %d bytes: over the limit of %d", n, limit)
	}
	if uint64(cap(buf)) >= n {
		body = buf[:n]
	} else {
		body = make([]byte, n)
	}
	_, err = io.ReadFull(r, body)
	return flags, body, err
}

// parseCommand splits a command frame's body into its name and data.
func parseCommand(body []byte) (name string, data []byte, err error) {
	if len(body) < 1 || int(body[0]) > len(body)-1 {
		return "", nil, errors.New("malformed command frame")
	}
	return string(body[1 : 1+body[0]]), body[1+body[0]:], nil
}

// socketTypeOf reads Socket-Type from READY's properties.
func socketTypeOf(props []byte) (string, error) {
	for len(props) > 0 {
		nl := int(props[0])
		if len(props) < 1+nl+4 {
			return "", errors.New("malformed READY properties")
		}
		name := string(props[1 : 1+nl])
		vl := binary.BigEndian.Uint32(props[1+nl:])
		props = props[1+nl+4:]
		if uint64(vl) > uint64(len(props)) {
			return "", errors.New("malformed READY properties")
		}
		if strings.EqualFold(name, "Socket-Type") {
			return string(props[:vl]), nil
		}
		props = props[vl:]
	}
	return "", errors.New("READY without Socket-Type")
}

// handshake runs the greeting and READY exchange on c as socketType,
// accepting a peer whose type is one of peers.
func handshake(c net.Conn, r *bufio.Reader, asServer bool, socketType string, peers ...string) error {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	out := append(greeting(asServer), readyCommand(socketType)...)
	if _, err := c.Write(out); err != nil {
		return fmt.Errorf("send greeting: %w", err)
	}
	if err := readGreeting(r); err != nil {
		return err
	}
	flags, body, err := readFrame(r, maxSubscriberFrame)
	if err != nil {
		return fmt.Errorf("read READY: %w", err)
	}
	name, props, err := parseCommand(body)
	if flags&flagCommand == 0 || err != nil || name != "READY" {
		return errors.New("peer did not send READY")
	}
	st, err := socketTypeOf(props)
	if err != nil {
		return err
	}
	for _, p := range peers {
		if st == p {
			return nil
		}
	}
	return fmt.Errorf("peer is a %s socket: want %s", st, strings.Join(peers, " or "))
}
