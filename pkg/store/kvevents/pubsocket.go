package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// pubSocket is the PUB side: it accepts subscribers and hands each
// message to every subscriber whose subscriptions match its topic (the
// first frame), through that subscriber's own bounded queue.
type pubSocket struct {
	ln    net.Listener
	hwm   int
	log   *slog.Logger
	mu    sync.Mutex
	subs  map[*subscriberConn]struct{}
	drops atomic.Uint64
	wg    sync.WaitGroup
	done  chan struct{}
}

type subscriberConn struct {
	c      net.Conn
	q      chan []byte
	topics [][]byte // guarded by pubSocket.mu
	gone   chan struct{}
	once   sync.Once
}

func newPubSocket(ln net.Listener, hwm int, log *slog.Logger) *pubSocket {
	s := &pubSocket{ln: ln, hwm: hwm, log: log, subs: make(map[*subscriberConn]struct{}), done: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s
}

func (s *pubSocket) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Warn(fmt.Sprintf("kv events: accept: %v", err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve runs one subscriber: the handshake, then its subscriptions (read
// here) and its messages (written by a goroutine of its own).
func (s *pubSocket) serve(c net.Conn) {
	defer s.wg.Done()
	r := bufio.NewReader(c)
	if err := handshake(c, r, true, "PUB", "SUB", "XSUB"); err != nil {
		s.log.Warn(fmt.Sprintf("kv events: subscriber %s: %v", c.RemoteAddr(), err))
		_ = c.Close()
		return
	}
	sc := &subscriberConn{c: c, q: make(chan []byte, s.hwm), gone: make(chan struct{})}
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		_ = c.Close()
		return
	default:
	}
	s.subs[sc] = struct{}{}
	s.mu.Unlock()
	s.wg.Add(1)
	go s.write(sc)
	err := s.readSubscriptions(sc, r)
	s.drop(sc)
	select {
	case <-s.done:
	default:
		s.log.Info(fmt.Sprintf("kv events: subscriber %s left: %v", c.RemoteAddr(), err))
	}
}

func (s *pubSocket) readSubscriptions(sc *subscriberConn, r *bufio.Reader) error {
	for {
		flags, body, err := readFrame(r, maxSubscriberFrame)
		if err != nil {
			return err
		}
		var sub bool
		var topic []byte
		switch {
		case flags&flagCommand != 0:
			name, data, err := parseCommand(body)
			if err != nil {
				return err
			}
			switch name {
			case "SUBSCRIBE":
				sub, topic = true, data
			case "CANCEL":
				topic = data
			default:
				continue
			}
		case len(body) == 0:
			continue
		case body[0] == 1 || body[0] == 0:
			sub, topic = body[0] == 1, body[1:]
		default:
			continue
		}
		s.mu.Lock()
		if sub {
			sc.topics = append(sc.topics, bytes.Clone(topic))
		} else {
			for i, t := range sc.topics {
				if bytes.Equal(t, topic) {
					sc.topics = append(sc.topics[:i], sc.topics[i+1:]...)
					break
				}
			}
		}
		s.mu.Unlock()
	}
}

func (s *pubSocket) write(sc *subscriberConn) {
	defer s.wg.Done()
	for {
		select {
		case m := <-sc.q:
			if _, err := sc.c.Write(m); err != nil {
				s.drop(sc)
				return
			}
		case <-sc.gone:
			return
		}
	}
}

func (s *pubSocket) drop(sc *subscriberConn) {
	sc.once.Do(func() {
		s.mu.Lock()
		delete(s.subs, sc)
		s.mu.Unlock()
		close(sc.gone)
		_ = sc.c.Close()
	})
}

// send frames one message (empty topic, sequence number, payload) and
// queues it for every matching subscriber; a full queue drops it for
// that subscriber alone.
func (s *pubSocket) send(payload []byte, seq uint64) {
	m := make([]byte, 0, 2+10+9+len(payload))
	m = appendFrame(m, flagMore, nil)
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	m = appendFrame(m, flagMore, sb[:])
	m = appendFrame(m, 0, payload)
	s.mu.Lock()
	defer s.mu.Unlock()
	for sc := range s.subs {
		if !matches(sc.topics, nil) {
			continue
		}
		select {
		case sc.q <- m:
		default:
			s.drops.Add(1)
		}
	}
}

// matches: a subscription is a prefix of the topic.
func matches(topics [][]byte, topic []byte) bool {
	for _, t := range topics {
		if bytes.HasPrefix(topic, t) {
			return true
		}
	}
	return false
}

// stats counts subscribers that receive messages, and messages dropped
// for subscribers that fell behind.
func (s *pubSocket) stats() (subscribed int, drops uint64) {
	s.mu.Lock()
	for sc := range s.subs {
		if matches(sc.topics, nil) {
			subscribed++
		}
	}
	s.mu.Unlock()
	return subscribed, s.drops.Load()
}

func (s *pubSocket) close() error {
	close(s.done)
	err := s.ln.Close()
	s.mu.Lock()
	subs := make([]*subscriberConn, 0, len(s.subs))
	for sc := range s.subs {
		subs = append(subs, sc)
	}
	s.mu.Unlock()
	for _, sc := range subs {
		s.flush(sc)
		s.drop(sc)
	}
	s.wg.Wait()
	return err
}

// flush gives a subscriber a moment to take what is queued for it
// before its connection closes (ZMQ_LINGER; Mooncake's is 0).
func (s *pubSocket) flush(sc *subscriberConn) {
	deadline := time.Now().Add(200 * time.Millisecond)
	for len(sc.q) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
