// Package cororpc speaks yalantinglibs' coro_rpc framing, the transport under
// Mooncake Store's master RPC (mooncake_master and its clients). It moves
// opaque bodies: the struct_pack encoding of arguments and results belongs to
// the caller (pkg/structpack), so this package knows nothing of Mooncake's
// types, only of frames, function ids, sequence numbers and RPC errors.
//
// The main types are [Client], which multiplexes calls on one connection and
// reconnects after the peer restarts, and [Server], which dispatches requests
// by function id to [Handler]s and answers several at once per connection.
// [RequestHeader] and [ResponseHeader] are the wire headers, encoded and
// decoded by pure functions; [ReadRequest] and [ReadResponse] read one frame
// under a length limit.
//
// # Behaviour taken from coro_rpc
//
// Learned by reading yalantinglibs at 7801bc9 (the commit Mooncake 3b5a594
// pins), never copied:
//
//   - include/ylt/coro_rpc/impl/protocol/coro_rpc_protocol.hpp: the 20-byte
//     request header and 16-byte response header, little-endian and packed;
//     magic 21 (0x15); a header whose magic differs or whose version is
//     above 0 is a protocol error that ends the connection; a request with a
//     serialize_type other than 0 (struct_pack) ends it too
//     (impl/coro_connection.hpp). The response's msg_type is always 0. An
//     error response carries the error code in err_code and, as its body,
//     the struct_pack encoding of the message string; codes above 255 do not
//     fit the byte, so err_code is 255 and the body is the struct_pack
//     encoding of pair<uint16 code, string message> instead
//     (prepare_response). See errbody.go for the hand decoding of those two
//     shapes. prepare_response sends code 255 itself as a bare string under
//     err_code 255, which coro_rpc's client cannot decode; this package
//     sends it as a pair and decodes either.
//   - include/ylt/coro_rpc/impl/errno.h: the error codes ([Errc]).
//   - include/ylt/coro_rpc/impl/router.hpp: a function id is the first four
//     bytes of MD5 of the handler's qualified name, read big-endian
//     (struct_pack/md5_constexpr.hpp, MD5Hash32Constexpr); an unknown
//     function id is answered with function_not_registered (11) and the
//     message "the rpc function not registered", and the connection goes on
//     reading requests. A handler that throws answers rpc_throw_exception
//     (10) with the exception's text; bad arguments answer
//     invalid_rpc_arguments (4) (impl/rpc_execute.hpp).
//   - include/ylt/coro_rpc/impl/coro_rpc_client.hpp: sequence numbers start
//     at 0 and count up per connection; a response whose sequence number
//     matches no call in flight makes the client drop the connection and fail
//     every call on it; the default request timeout is 30 s.
//
// coro_rpc enforces no message length limit of its own beyond what the u32
// length fields hold (bodies and attachments above 4 GiB are refused with
// message_too_large when sending); the reader allocates whatever a header
// announces. This package refuses, before allocating, any frame whose body
// plus attachment exceeds a configurable limit, [DefaultMaxMessageLen] unless
// set otherwise. Its server also charges each frame to a byte budget before
// reading it (ServerOptions.Budget), reads bodies as they arrive rather than
// at the announced size, and drops a connection whose frame does not arrive
// within ServerOptions.ReadTimeout.
//
// Where this package departs from coro_rpc on purpose: a call whose context
// ends is failed alone and its late response discarded (coro_rpc closes the
// socket on a timeout, failing every call in flight), and a response whose
// error body cannot be decoded is reported as an [RPCError] without dropping
// the connection, since the framing is intact.
package cororpc
