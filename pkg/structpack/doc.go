// Package structpack encodes and decodes Go values in the byte layout of
// yalantinglibs struct_pack, the serialization under coro_rpc, which is
// what Mooncake's master RPC speaks. It knows nothing about Mooncake: a
// caller declares Go types that mirror the C++ types of a call and this
// package turns them into the bytes a C++ peer writes and reads, and into
// the same type literal and type hash, so a peer of another version is
// recognised instead of misread.
//
// The behaviour follows yalantinglibs at commit 7801bc9 (the one Mooncake
// pins), read from include/ylt/struct_pack/: type_id.hpp (type ids),
// type_calculate.hpp (get_types_literal, get_size_literal, the type hash),
// md5_constexpr.hpp (the hash is the first four MD5 bytes read big-endian),
// alignment.hpp and reflection.hpp (is_trivial_serializable and the
// alignment written into literals of trivially copyable structs),
// type_trait.hpp, packer.hpp (serialize_metainfo, serialize_one),
// unpacker.hpp (deserialize_metainfo, deserialize_one), calculate_size.hpp
// and size_info.hpp (get_serialize_runtime_info: how the width of container
// lengths is chosen), varint.hpp (varints, which this package does not
// support); and from include/ylt/coro_rpc/impl/coro_rpc_client.hpp,
// rpc_execute.hpp and protocol/struct_pack_protocol.hpp for how coro_rpc
// packs arguments and results.
//
// # Message layout
//
// A message is a little-endian uint32 hash head, then an optional metainfo
// byte, then the payload. The head is the type hash (bit 0 clear) with bit
// 0 set when a metainfo byte follows. Metainfo bit 2 says the type literal
// follows it, NUL-terminated (C++ builds without NDEBUG write it; Marshal
// writes it unless WithLiteral(false)); bits 3-4 give the width of every
// container length in the message: 0 one byte, 1 two, 2 four, 3 eight
// bytes. The encoder picks the width as struct_pack does, from the largest
// container (string, vector, map) anywhere in the message: below 2^8 one
// byte, below 2^16 two, below 2^32 four, else eight. Width 1 needs no
// metainfo; any other width forces one. Bits 0-1 announce struct_pack
// "compatible" members, which this package refuses.
//
// # Type literal and hash
//
// The literal is a byte string describing the C++ type: one type id per
// fundamental (int32 0x01, uint32 0x02, int64 0x03, uint64 0x04, int8 0x05,
// uint8 0x06, int16 0x07, uint16 0x08, bool 0x0b, char 0x0c, float 0x11,
// double 0x12); std::string 0x80 0x0c; std::array 0x81 T N; maps 0x82 K V;
// std::vector 0x84 T; std::optional 0x85 T; std::variant 0x86 T... 0xff;
// tl::expected 0x87 T E; monostate and void 0xfa; a struct, pair or tuple
// 0xfd members... 0xff. A struct that C++ copies with memcpy (every member
// trivially copyable and the type not reflected through YLT_REFL, such as
// std::pair<uint64_t, uint64_t>) carries two size literals before its 0xff:
// its pack alignment and its alignment, each 8 for that pair, and a size
// literal below 127 is the byte size+129: that is the 0x89 0x89 in
// fd 04 04 89 89 ff. Larger sizes are base-127 digits, least significant
// first, each +1, the last +129. The hash is the first four bytes of
// MD5(literal) read big-endian, with bit 0 cleared.
//
// # Go types
//
//	bool, int8..int64, uint8..uint64   the same C++ type (enums: their underlying type)
//	int, uint, uintptr                 int64_t, uint64_t (size_t, uintptr_t)
//	float32, float64                   float, double
//	string                             std::string
//	[]T                                std::vector<T>; []byte is std::vector<uint8_t>, use string for std::string
//	[N]T (N > 0)                       std::array<T, N>
//	map[K]V                            std::map or std::unordered_map (one type id); encoded in ascending key order
//	Optional[T]                        std::optional<T>
//	Expected[T, E], ExpectedVoid[E]    tl::expected<T, E>, tl::expected<void, E>
//	Monostate, struct{}                std::monostate, void
//	Pair[A, B]                         std::pair<A, B>
//	a Variant                          std::variant<...>
//	struct                             a YLT_REFL struct or std::tuple: members in declaration order
//	struct with an Aggregate field     a plain C++ aggregate (no YLT_REFL): memcpy layout when all members allow it
//
// Struct fields map in declaration order. Unexported fields are refused
// (a silently dropped member would change the C++ type), except blank
// Aggregate markers; a field tagged `structpack:"-"` is skipped (and, if
// exported, zeroed on decode). Embedded fields are ordinary members, not flattened.
// Pointers, interfaces outside a Variant, channels, funcs, complex numbers,
// recursive types, zero-length arrays and sets are refused, as are
// struct_pack varints, compatible members and user-defined serializers,
// and maps whose std::pair<K, V> entry C++ would memcpy with padding
// (such as map<int32_t, uint64_t>): packer.hpp writes that padding and
// unpacker.hpp does not read it, so not even two C++ peers agree on them.
//
// std::monostate writes nothing on its own (a variant alternative, an
// expected<void>), but inside something C++ copies with memcpy (a trivially
// copyable struct, array or vector element) it takes its sizeof, one byte.
// A top-level pointer passed to Marshal or Literal stands for its target.
//
// # RPC bodies
//
// coro_rpc packs a call's arguments with one struct_pack serialize call:
// no arguments give an empty body, one argument is packed as itself (the
// Ping request is a bare std::pair<uint64_t, uint64_t>), several as one
// std::tuple of them, which has the same literal and bytes as a Go struct
// with those fields (MarshalArgs, UnmarshalArgs). A result is packed as
// its return type, a void result as std::monostate.
//
// # Decoding
//
// Unmarshal checks the hash (and the embedded literal, if any) before
// anything else and returns a *HashMismatchError on a mismatch. It never
// allocates from a length it has not checked against the bytes left, and
// refuses a bool, optional or expected discriminator other than 0 or 1, a
// variant index out of range, duplicate map keys and trailing bytes, each
// with a *DecodeError naming the type, the path and the offset. Padding
// inside memcpy'd structs is skipped unread, as C++ ignores it. Decoding
// reuses the capacity of slices already in the target, as encoding/json
// does, and overwrites every field it decodes.
package structpack
