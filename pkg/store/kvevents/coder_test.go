package kvevents

import (
	"bytes"
	"testing"
)

// appendEventFields is the event encoder eventCoder replaced: every
// field written one by one in Mooncake's order. eventCoder must give the
// same bytes.
func appendEventFields(b []byte, id uint64, ts int64, stored, legacy, withKey bool, tenant, backend, key, medium string, hash uint64, hashed bool) []byte {
	size := 13
	if legacy {
		size += 2
	}
	if withKey {
		size++
	}
	if stored {
		size += 3
		if legacy {
			size++
		}
	} else {
		size++
	}
	b = appendMapHeader(b, size)
	b = appendUint(appendStr(b, "event_id"), id)
	b = appendInt(appendStr(b, "timestamp"), ts)
	typ, legacyTyp := "removed", "BlockRemoved"
	if stored {
		typ, legacyTyp = "stored", "BlockStored"
	}
	b = appendStr(appendStr(b, "event_type"), typ)
	if legacy {
		b = appendStr(appendStr(b, "type"), legacyTyp)
	}
	for _, k := range [...]string{"model_name", "block_size", "additional_salt", "lora_name"} {
		b = appendNil(appendStr(b, k))
	}
	b = appendStr(appendStr(b, "tenant_id"), tenant)
	b = appendStr(appendStr(b, "backend_id"), backend)
	b = appendNil(appendStr(b, "group_id")) // mc has no object groups
	b = appendOptStr(appendStr(b, "medium"), medium)
	b = appendNil(appendStr(b, "dp_rank"))
	if withKey {
		b = appendStr(appendStr(b, "object_key"), key)
	}
	b = appendStr(b, "seq_hashes")
	if hashed {
		b = appendUint(appendArrayHeader(b, 1), hash)
	} else {
		b = appendArrayHeader(b, 0)
	}
	if legacy {
		b = appendStr(b, "block_hashes")
		if hashed {
			b = appendInt(appendArrayHeader(b, 1), int64(hash)) // Mooncake's int64 cast
		} else {
			b = appendArrayHeader(b, 0)
		}
	}
	b = appendStr(b, "base_block_idx")
	if stored {
		b = appendUint(b, 0)
		b = appendNil(appendStr(b, "parent_hash"))
		b = appendNil(appendStr(b, "token_ids"))
		if legacy {
			b = appendNil(appendStr(b, "parent_block_hash"))
		}
	} else {
		b = appendNil(b)
	}
	return b
}

// FuzzEventCoder: eventCoder's bytes are appendEventFields' for any
// event under any options, after any earlier batch's timestamp.
func FuzzEventCoder(f *testing.F) {
	f.Add(uint64(1), int64(1764259200123), int64(5), true, true, true, "default", "pool-a", "0x1f2e", "cpu", uint64(7982), true)
	f.Add(uint64(300), int64(-1), int64(0), false, false, true, "tenant-a", "", "plain", "", uint64(0), false)
	f.Add(uint64(1<<40), int64(1<<40), int64(-40), true, true, false, "", "b", "", "disk", uint64(1<<63), true)
	f.Fuzz(func(t *testing.T, id uint64, ts, prevTS int64, stored, legacy, withKey bool, tenant, backend, key, medium string, hash uint64, hashed bool) {
		c := newEventCoder(backend, legacy, withKey)
		c.startBatch(prevTS)
		_ = c.appendEvent(nil, id, !stored, tenant, key, medium, hash, hashed)
		c.startBatch(ts)
		prefix := []byte{0x93, 0x01}
		got := c.appendEvent(bytes.Clone(prefix), id, stored, tenant, key, medium, hash, hashed)
		want := appendEventFields(bytes.Clone(prefix), id, ts, stored, legacy, withKey, tenant, backend, key, medium, hash, hashed)
		if !bytes.Equal(got, want) {
			t.Fatalf("eventCoder:\n% x\nwant\n% x", got, want)
		}
		if n, bound := len(got)-len(prefix), c.maxEventSize(tenant, key, medium); n > bound {
			t.Fatalf("event of %d bytes: over maxEventSize's %d", n, bound)
		}
	})
}
