package tier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// A record on disk is a 32-byte header, the key, the value, and zero
// padding to the next BlockSize boundary, so every record starts where an
// O_DIRECT read or write may start:
//
//	off  0  magic    u32  "MCT1", or "MCT2": the value starts on a block
//	off  4  key_len  u32
//	off  8  size     u64  value bytes
//	off 16  version  u64  the object version the master gave it
//	off 24  data_crc u32  CRC32C (Castagnoli) of the value
//	off 28  hdr_crc  u32  CRC32C of bytes 0..27 and the key
//
// Integers are little-endian. The header has a checksum of its own so that
// a torn or flipped header is never trusted for the length it claims (the
// scan then looks for the next record at the following block).
//
// A value of alignedMin bytes or more is written as MCT2: the key is
// padded to the next block and the value starts there, so a read can put
// it with O_DIRECT straight into the block-aligned memory it is read for
// (a staging range in the node's segment), with no bounce buffer and no
// copy; only its checksum pass is left. A smaller value follows its key
// (MCT1), where the padding would cost more than the copy it saves. Both
// are read, whichever wrote them.
const (
	// BlockSize is the alignment of records in a data file and of the
	// buffers O_DIRECT transfers use.
	BlockSize = 4096
	// MaxKeyLen bounds a key, as the store's master does.
	MaxKeyLen = 4096
	// MaxValueLen bounds a value a header may claim (64 GiB): a larger
	// size is corruption, not a record.
	MaxValueLen = 1 << 36

	headerLen    = 32
	recordMagic  = 0x3154434d // "MCT1" as little-endian bytes
	alignedMagic = 0x3254434d // "MCT2": the value on a block boundary

	// alignedMin is the smallest value written as MCT2: at most one block
	// of padding, a few per cent of it.
	alignedMin = 64 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Record describes one value on disk.
type Record struct {
	Key     string
	Size    uint64 // value bytes
	Version uint64
}

// header is a decoded, checked record header.
type header struct {
	key     string
	size    uint64
	version uint64
	dataCRC uint32
	aligned bool // MCT2
}

// valueOff is where the value starts, from the record's start.
func (h header) valueOff() uint64 { return valueOff(len(h.key), h.aligned) }

// recordLen is the bytes the record takes on disk, padding included.
func (h header) recordLen() uint64 { return alignUp(h.valueOff() + h.size) }

func valueOff(k int, aligned bool) uint64 {
	if aligned {
		return alignUp(uint64(headerLen + k))
	}
	return uint64(headerLen + k)
}

// alignedValue says whether a value of n bytes is written as MCT2.
func alignedValue(n uint64) bool { return n >= alignedMin }

// recordLen is the bytes a record of a key of k bytes and a value of n
// bytes takes on disk, padding included.
func recordLen(k int, n uint64) uint64 {
	a := alignedValue(n)
	return alignUp(valueOff(k, a) + n)
}

func alignUp(n uint64) uint64 { return (n + BlockSize - 1) &^ (BlockSize - 1) }

// encodeRecord writes the record of key, version and value into b, which
// must hold recordLen(len(key), len(value)) bytes; the padding is zeroed.
// It returns the value's CRC32C, as the header holds it.
func encodeRecord(b []byte, key string, version uint64, value []byte) uint32 {
	return encodeRecordAs(b, key, version, value, alignedValue(uint64(len(value))))
}

// encodeRecordAs is encodeRecord with the format chosen (tests write MCT1
// records of any size, as earlier versions did).
func encodeRecordAs(b []byte, key string, version uint64, value []byte, aligned bool) uint32 {
	le := binary.LittleEndian
	magic, voff := uint32(recordMagic), valueOff(len(key), aligned)
	if aligned {
		magic = alignedMagic
	}
	le.PutUint32(b[0:], magic)
	le.PutUint32(b[4:], uint32(len(key)))
	le.PutUint64(b[8:], uint64(len(value)))
	le.PutUint64(b[16:], version)
	// The value is copied and checksummed in one pass (checkCopy).
	crc := checkCopy(0, b[voff:], value)
	le.PutUint32(b[24:], crc)
	copy(b[headerLen:], key)
	le.PutUint32(b[28:], headerCRC(b[:28], b[headerLen:headerLen+len(key)]))
	clear(b[headerLen+len(key) : voff])
	end := voff + uint64(len(value))
	clear(b[end:alignUp(end)])
	return crc
}

func headerCRC(fixed, key []byte) uint32 {
	return crc32.Update(crc32.Checksum(fixed, castagnoli), castagnoli, key)
}

// Decoding errors; each wraps ErrCorrupt.
var (
	errShortHeader = fmt.Errorf("%w: shorter than a record header", ErrCorrupt)
	errMagic       = fmt.Errorf("%w: no record magic", ErrCorrupt)
	errHeaderCRC   = fmt.Errorf("%w: header checksum mismatch", ErrCorrupt)
	errDataCRC     = fmt.Errorf("%w: value checksum (CRC32C) mismatch", ErrCorrupt)
	errTruncated   = fmt.Errorf("%w: record truncated", ErrCorrupt)
)

// decodeHeader checks and decodes the header at the start of b, which
// must include the key (headerLen + key_len bytes; the key length is known
// after the first 8 bytes, see headerNeed).
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerLen {
		return header{}, errShortHeader
	}
	le := binary.LittleEndian
	magic := le.Uint32(b[0:])
	if magic != recordMagic && magic != alignedMagic {
		return header{}, errMagic
	}
	k := le.Uint32(b[4:])
	if k == 0 || k > MaxKeyLen {
		return header{}, fmt.Errorf("%w: key length %d outside 1..%d", ErrCorrupt, k, MaxKeyLen)
	}
	if len(b) < headerLen+int(k) {
		return header{}, fmt.Errorf("%w: key of %d bytes does not fit %d bytes", ErrCorrupt, k, len(b))
	}
	key := b[headerLen : headerLen+int(k)]
	if le.Uint32(b[28:]) != headerCRC(b[:28], key) {
		return header{}, errHeaderCRC
	}
	h := header{key: string(key), size: le.Uint64(b[8:]), version: le.Uint64(b[16:]), dataCRC: le.Uint32(b[24:]), aligned: magic == alignedMagic}
	if h.size > MaxValueLen {
		return header{}, fmt.Errorf("%w: value length %d exceeds %d", ErrCorrupt, h.size, uint64(MaxValueLen))
	}
	return h, nil
}

// headerNeed is how many bytes decodeHeader needs given the first 8 bytes
// of a record (at least headerLen; more for a long key). Garbage gives a
// bounded answer, so a caller can always read that much.
func headerNeed(b []byte) int {
	if len(b) < 8 {
		return headerLen
	}
	k := binary.LittleEndian.Uint32(b[4:])
	return headerLen + int(min(k, MaxKeyLen))
}

// decodeRecord checks the record at the start of b (header, key, and
// value checksum) and returns it with its value, a slice of b.
func decodeRecord(b []byte) (Record, []byte, error) {
	h, err := decodeHeader(b)
	if err != nil {
		return Record{}, nil, err
	}
	start := h.valueOff()
	if uint64(len(b)) < start || uint64(len(b))-start < h.size {
		return Record{Key: h.key, Size: h.size, Version: h.version}, nil, errTruncated
	}
	v := b[start : start+h.size]
	rec := Record{Key: h.key, Size: h.size, Version: h.version}
	if crc32.Checksum(v, castagnoli) != h.dataCRC {
		return rec, nil, errDataCRC
	}
	return rec, v, nil
}

// isCorrupt reports whether err says the bytes were wrong (as opposed to
// an I/O failure).
func isCorrupt(err error) bool { return errors.Is(err, ErrCorrupt) }
