package meta

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdBackend stores descriptors in etcd v3 under Mooncake's keys.
type etcdBackend struct {
	cli  *clientv3.Client
	addr string // endpoints joined by ',' for error messages
	opts Options
}

func newEtcd(endpoints []string, opts Options) (*etcdBackend, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: opts.timeout(),
		// The client logs every retry at warn level; callers get the error.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(endpoints, ","), err)
	}
	return &etcdBackend{cli: cli, addr: strings.Join(endpoints, ","), opts: opts}, nil
}

// call bounds one etcd operation and turns "no answer in time" into an
// error naming the server.
func (e *etcdBackend) call(ctx context.Context, op func(ctx context.Context) error) error {
	limit := callLimit(ctx, e.opts.timeout())
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	err := op(ctx)
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		// The client retries a dead endpoint until the deadline; say so
		// rather than a bare "context deadline exceeded".
		return &unreachableError{what: "metadata server", addr: e.addr, err: fmt.Errorf("no answer within %v: %w", limit, context.DeadlineExceeded)}
	}
	if status.Code(err) == codes.Unavailable {
		return &unreachableError{what: "metadata server", addr: e.addr, err: trimGRPC(err)}
	}
	return fmt.Errorf("etcd %s: %w", e.addr, err)
}

// trimGRPC keeps a gRPC status error to its message.
func trimGRPC(err error) error {
	if s, ok := status.FromError(err); ok && s.Code() != codes.OK {
		if s.Code() == codes.DeadlineExceeded {
			return context.DeadlineExceeded
		}
		return errors.New(s.Message())
	}
	return err
}

func (e *etcdBackend) get(ctx context.Context, key string) ([]byte, bool, error) {
	var resp *clientv3.GetResponse
	err := e.call(ctx, func(ctx context.Context) (err error) {
		resp, err = e.cli.Get(ctx, key)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

func (e *etcdBackend) put(ctx context.Context, key string, v []byte) error {
	err := e.call(ctx, func(ctx context.Context) error {
		_, err := e.cli.Put(ctx, key, string(v))
		return err
	})
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

func (e *etcdBackend) del(ctx context.Context, key string) error {
	err := e.call(ctx, func(ctx context.Context) error {
		_, err := e.cli.Delete(ctx, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

func (e *etcdBackend) close() error { return e.cli.Close() }
