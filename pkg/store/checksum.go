package store

import "hash/crc32"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the checksum mc's writers record with an object at PutEnd
// and its readers check before they return the bytes: 1<<32 | the
// CRC32C (Castagnoli, the CPU's crc32 instruction) of value. 0 means no
// checksum (an object written by Mooncake's clients, or with checksums
// off), so a value whose CRC is 0 still has one.
func Checksum(value []byte) uint64 { return 1<<32 | uint64(crc32.Checksum(value, castagnoli)) }
