package master

import (
	"context"
	"crypto/subtle"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Admin operations on the RPC ports. RemoveAll empties the whole store:
// with an admin token configured it asks for the token on gRPC too
// (metadata "authorization: Bearer TOKEN", as the admin HTTP API's
// header), and Mooncake's coro_rpc wire, which has no way to carry one,
// refuses it. The data plane stays open, as Mooncake's is: BatchRemove
// and RemoveByRegex (force included) act on the keys a caller names or
// matches, which any client of the RPC port can list and remove one by
// one anyway, so a token on them would only look like protection; bind
// the RPC port (--rpc_address) to the clients' network.

// errAdminTokenRPC is the refusal's text, naming how to send the token
// (mc's client adds the flags to give).
const errAdminTokenRPC = "an admin operation on a master with an admin token: send it as gRPC metadata authorization: Bearer TOKEN"

// adminAuthorized checks ctx's gRPC metadata for the admin token, when
// the master has one.
func (m *Master) adminAuthorized(ctx context.Context) error {
	tok := m.cfg.AdminToken
	if tok == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get("authorization")
	want := []byte("Bearer " + tok)
	for _, g := range got {
		if subtle.ConstantTimeCompare([]byte(g), want) == 1 {
			return nil
		}
	}
	if len(got) > 0 {
		return status.Error(codes.PermissionDenied, "admin token refused")
	}
	return status.Error(codes.Unauthenticated, errAdminTokenRPC)
}
