package structpack

// Monostate is std::monostate, and void where C++ has one (the value of
// tl::expected<void, E>, a void RPC result): type id 0xfa and no payload.
// Any struct type without fields is treated the same way.
type Monostate struct{}

// Aggregate marks a Go struct as a plain C++ aggregate, one struct_pack
// reflects without YLT_REFL. Put it in as a blank field:
//
//	type Extent struct {
//		_      structpack.Aggregate
//		Offset uint64
//		Length uint32
//	}
//
// The mark matters only when every member is trivially copyable: C++ then
// copies the struct with memcpy, padding included, and its literal carries
// the struct's alignment. Structs reflected through YLT_REFL (most Mooncake
// messages) and std::tuple never do that; that is what an unmarked struct
// stands for.
type Aggregate struct{}

// optionalTag and expectedTag let the codec recognise Optional and
// Expected by their first field, which survives defining a new type from
// them (type MaybeSize structpack.Optional[uint64]) where methods would not.
type (
	optionalTag struct{}
	expectedTag struct{}
)

// Optional is std::optional<T>: a byte 1 and the value, or a byte 0.
// The zero Optional is empty, as a default-constructed std::optional.
type Optional[T any] struct {
	_     optionalTag
	Value T
	Valid bool
}

// Some returns an Optional holding v.
func Some[T any](v T) Optional[T] { return Optional[T]{Value: v, Valid: true} }

// Expected is tl::expected<T, E>: a byte 1 and the value, or a byte 0 and
// the error. The zero Expected holds a zero value, as a default-constructed
// tl::expected does.
type Expected[T, E any] struct {
	_        expectedTag
	Value    T
	Error    E
	HasError bool
}

// ExpectedVoid is tl::expected<void, E>. void and std::monostate share a
// type id and write no bytes, so this is Expected with a Monostate value.
type ExpectedVoid[E any] = Expected[Monostate, E]

// Pair is std::pair<A, B>. C++ copies a pair of trivially copyable members
// with memcpy, padding included, as it does a plain aggregate.
type Pair[A, B any] struct {
	_      Aggregate
	First  A
	Second B
}

// Variant is implemented by a Go type standing for a std::variant. The
// type must be a struct with a single field, of an interface type, holding
// the current alternative; VariantAlternatives, called once per type on the
// zero value, lists one value of each alternative type in the C++
// declaration order, which fixes the index on the wire. For Mooncake's
// std::variant<MemoryDescriptor, NoFDescriptor, DiskDescriptor, ...>:
//
//	type DescriptorVariant struct{ Value any }
//
//	func (DescriptorVariant) VariantAlternatives() []any {
//		return []any{MemoryDescriptor{}, NoFDescriptor{}, DiskDescriptor{}, ...}
//	}
//
// The field may have a narrower interface type than any, as long as every
// alternative implements it. Alternatives are told apart by their dynamic
// type, so each must be a distinct non-pointer type. A nil field encodes as
// the Monostate alternative if there is one and is an error otherwise;
// decoding always stores a value of the alternative's type.
type Variant interface {
	VariantAlternatives() []any
}
