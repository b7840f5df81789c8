package kvevents

// eventCoder writes event maps in Mooncake's field order and forms for
// one publisher's options. What no event changes (field names, the nil
// fields, the backend id) is encoded once, at newEventCoder; what one
// message's events share (the timestamp, and the fields around it) once
// per message, at startBatch. Its output is byte for byte what encoding
// every field one by one gives (appendEventFields in the tests).
type eventCoder struct {
	legacy, withKey bool
	// Per kind, removed [0] and stored [1]:
	head [2][]byte // map header, "event_id"
	// after the event id up to the tenant's value: "timestamp" and its
	// value (startBatch), "event_type", "type", the nil fields,
	// "tenant_id"
	mid   [2][]byte
	after [2][]byte // after the tenant, without the timestamp
	// backend_id and its value, group_id nil, "medium"
	backend []byte
	// dp_rank nil, "object_key" (withKey)
	dp []byte
	// "seq_hashes", "block_hashes"
	seqHashes, blockHashes []byte
	tail                   [2][]byte // from base_block_idx to the end
	// "default" encoded, the tenant of nearly every event
	defaultTenant []byte
	// fixedMax bounds an event's bytes but its tenant, key and medium
	fixedMax int
}

func newEventCoder(backend string, legacy, withKey bool) *eventCoder {
	c := &eventCoder{legacy: legacy, withKey: withKey}
	for k, stored := range []bool{false, true} {
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
		c.head[k] = appendStr(appendMapHeader(nil, size), "event_id")
		typ, legacyTyp := "removed", "BlockRemoved"
		if stored {
			typ, legacyTyp = "stored", "BlockStored"
		}
		b := appendStr(appendStr(nil, "event_type"), typ)
		if legacy {
			b = appendStr(appendStr(b, "type"), legacyTyp)
		}
		for _, f := range [...]string{"model_name", "block_size", "additional_salt", "lora_name"} {
			b = appendNil(appendStr(b, f))
		}
		c.after[k] = appendStr(b, "tenant_id")
		b = appendStr(nil, "base_block_idx")
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
		c.tail[k] = b
	}
	b := appendStr(appendStr(nil, "backend_id"), backend)
	b = appendNil(appendStr(b, "group_id")) // mc has no object groups
	c.backend = appendStr(b, "medium")
	c.dp = appendNil(appendStr(nil, "dp_rank"))
	if withKey {
		c.dp = appendStr(c.dp, "object_key")
	}
	c.seqHashes, c.blockHashes = appendStr(nil, "seq_hashes"), appendStr(nil, "block_hashes")
	c.defaultTenant = appendStr(nil, DefaultTenantID)
	c.startBatch(0)
	for k := range c.head {
		// the id and the two hashes 9 bytes at most each, the
		// timestamp's value too (in mid after startBatch)
		n := len(c.head[k]) + 9 + len(c.mid[k]) + 9 + len(c.backend) + len(c.dp) + len(c.seqHashes) + 10 + len(c.blockHashes) + 10 + len(c.tail[k])
		c.fixedMax = max(c.fixedMax, n)
	}
	return c
}

// maxEventSize bounds the bytes appendEvent writes for an event of
// tenant, key and medium (each string's header is 5 bytes at most).
func (c *eventCoder) maxEventSize(tenant, key, medium string) int {
	return c.fixedMax + 15 + len(tenant) + len(key) + len(medium)
}

// startBatch sets the timestamp of the events appended next.
func (c *eventCoder) startBatch(ts int64) {
	for k := range c.mid {
		b := appendInt(appendStr(c.mid[k][:0], "timestamp"), ts)
		c.mid[k] = append(b, c.after[k]...)
	}
}

// appendEvent appends one event's map.
func (c *eventCoder) appendEvent(b []byte, id uint64, stored bool, tenant, key, medium string, hash uint64, hashed bool) []byte {
	k := 0
	if stored {
		k = 1
	}
	b = append(b, c.head[k]...)
	b = appendUint(b, id)
	b = append(b, c.mid[k]...)
	if tenant == DefaultTenantID {
		b = append(b, c.defaultTenant...)
	} else {
		b = appendStr(b, tenant)
	}
	b = append(b, c.backend...)
	b = appendOptStr(b, medium)
	b = append(b, c.dp...)
	if c.withKey {
		b = appendStr(b, key)
	}
	b = append(b, c.seqHashes...)
	if hashed {
		b = appendUint(appendArrayHeader(b, 1), hash)
	} else {
		b = appendArrayHeader(b, 0)
	}
	if c.legacy {
		b = append(b, c.blockHashes...)
		if hashed {
			b = appendInt(appendArrayHeader(b, 1), int64(hash)) // Mooncake's int64 cast
		} else {
			b = appendArrayHeader(b, 0)
		}
	}
	return append(b, c.tail[k]...)
}
