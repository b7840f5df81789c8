package store

import (
	"fmt"
	"strings"
)

// Tenants (Mooncake's tenant_id.h at 3b5a594): with multi-tenant mode on,
// every key lives in its tenant's namespace. mc keeps one key space inside
// the master and scopes keys where they enter it (the RPC handlers of both
// wires and the admin API), so every internal path (eviction, drain, the
// disk tier, the HA op log, restart) carries the tenant with the key
// without knowing about tenants.
//
// A stored key is the tenant, Mooncake's separator (NUL) and the user's
// key, except for the default tenant, whose keys are stored as they are:
// a user key never holds a NUL (CheckKey), so the two forms never collide,
// and a pool that turns the mode on or off keeps the default tenant's
// objects under the keys they had (Mooncake's ParseScopedKey reads a key
// without a separator as the default tenant's too).

// DefaultTenant is the tenant of a call that names none.
const DefaultTenant = "default"

// TenantSeparator separates a stored key's tenant from its user key.
const TenantSeparator = '\x00'

// MaxTenantLength bounds a tenant id (Mooncake has no bound; mc bounds
// what it reads off the network).
const MaxTenantLength = 256

// CheckTenant validates a tenant id as Mooncake's TenantId::IsValid does:
// not empty (an empty id on the wire means "default" and is resolved
// before this check), not starting with the reserved '_', no byte below
// 0x20 and no DEL. mc also bounds its length.
func CheckTenant(t string) error {
	switch {
	case t == "":
		return Errorf(InvalidParams, "empty tenant id")
	case len(t) > MaxTenantLength:
		return Errorf(InvalidParams, "tenant id of %d bytes exceeds the limit of %d", len(t), MaxTenantLength)
	case t[0] == '_':
		return Errorf(InvalidParams, "tenant id %q starts with '_', which is reserved", t)
	}
	for i := 0; i < len(t); i++ {
		if b := t[i]; b < 0x20 || b == 0x7f {
			return Errorf(InvalidParams, "tenant id %q contains control character %q at byte %d", t, rune(b), i)
		}
	}
	return nil
}

// ResolveTenant is a call's tenant: "" is the default tenant, as
// Mooncake's TenantId.
func ResolveTenant(t string) string {
	if t == "" {
		return DefaultTenant
	}
	return t
}

// ScopeKey is the stored form of tenant t's key k (t resolved and valid).
func ScopeKey(t, k string) string {
	if t == DefaultTenant && strings.IndexByte(k, TenantSeparator) < 0 {
		return k
	}
	return t + string(TenantSeparator) + k
}

// ScopeKeys scopes keys for tenant t; when they stay as they are (the
// default tenant's) it returns keys itself.
func ScopeKeys(t string, keys []string) []string {
	if !NeedsScope(t, keys) {
		return keys
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = t + string(TenantSeparator) + k
	}
	return out
}

// NeedsScope reports whether tenant t's keys differ from their stored
// form: always but for the default tenant, whose keys are stored as they
// are unless one holds a NUL (which CheckKey then refuses; scoped, it
// cannot pass for another tenant's key).
func NeedsScope(t string, keys []string) bool {
	if t != DefaultTenant {
		return true
	}
	for _, k := range keys {
		if strings.IndexByte(k, TenantSeparator) >= 0 {
			return true
		}
	}
	return false
}

// SplitKey is a stored key's tenant and user key.
func SplitKey(stored string) (tenant, key string) {
	if i := strings.IndexByte(stored, TenantSeparator); i >= 0 {
		return stored[:i], stored[i+1:]
	}
	return DefaultTenant, stored
}

// KeyOfTenant is the user key of stored if it is tenant t's.
func KeyOfTenant(t, stored string) (string, bool) {
	tt, k := SplitKey(stored)
	return k, tt == t
}

// CheckStoredKey validates a key as the master stores it: a user key
// (CheckKey), or a valid tenant, the separator and a user key.
func CheckStoredKey(stored string) error {
	i := strings.IndexByte(stored, TenantSeparator)
	if i < 0 {
		return CheckKey(stored)
	}
	if CheckTenant(stored[:i]) != nil {
		// Not a scoped key: a key with a NUL.
		return CheckKey(stored)
	}
	if stored[:i] == DefaultTenant {
		// The default tenant's key is scoped only when it holds a NUL.
		return CheckKey(stored[i+1:])
	}
	if err := CheckKey(stored[i+1:]); err != nil {
		return fmt.Errorf("tenant %q: %w", stored[:i], err)
	}
	return nil
}
