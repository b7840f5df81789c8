package master

import (
	"fmt"
	"math/big"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/kvcache-ops/mc/pkg/store"
)

// Tenants (--enable_multi_tenants, Mooncake's semantics at 3b5a594). The
// master keeps one key space: calls are scoped where they enter it (the
// RPC handlers of both wires, the admin API) with store.ScopeKey, so
// eviction, drain, the disk tier, the HA op log and restart carry every
// object's tenant in its key. The tenants' quota policy is Mooncake's
// YAML file (version 1, tenants: [{name, quota}]), read when the master
// starts (a fresh master per HA term reads it again) and written back,
// atomically, by the admin API's PUT and DELETE, as mooncake_master does.

// TenantConfig turns multi-tenant mode on.
type TenantConfig struct {
	// Enabled: keys are scoped by the caller's tenant and writes need a
	// tenant with a quota policy (TENANT_NOT_REGISTERED otherwise).
	Enabled bool
	// ConnectorType is where the policy lives: "file" (Mooncake's
	// default; its "etcd" is not supported by mc).
	ConnectorType string
	// ConnectorURI is the policy file.
	ConnectorURI string
}

// tenantTable holds the policies and the charged bytes per tenant.
type tenantTable struct {
	mu    sync.Mutex
	path  string
	accts map[string]*tenantAcct
	// charged and reserved: the ledger (below), by tenant.
	charged  map[string]uint64
	reserved map[string]uint64
	// eff are the effective quotas for capacity effCap (nil: to compute).
	eff    map[string]uint64
	effCap uint64
}

type tenantAcct struct {
	requested uint64
	explicit  bool
}

func newTenantTable(cfg TenantConfig) (*tenantTable, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	switch cfg.ConnectorType {
	case "", "file":
	default:
		return nil, fmt.Errorf("tenant_quota_connector_type %q: mc supports \"file\"", cfg.ConnectorType)
	}
	if cfg.ConnectorURI == "" {
		return nil, fmt.Errorf("--enable_multi_tenants: the tenant quota file connector needs a policy file (--tenant_quota_connector_uri FILE)")
	}
	pol, err := LoadTenantPolicy(cfg.ConnectorURI)
	if err != nil {
		return nil, err
	}
	t := &tenantTable{path: cfg.ConnectorURI, accts: map[string]*tenantAcct{}, charged: map[string]uint64{}, reserved: map[string]uint64{}}
	for name, q := range pol {
		t.accts[name] = &tenantAcct{requested: q, explicit: true}
	}
	return t, nil
}

// registered reports whether tenant has a quota policy.
func (t *tenantTable) registered(tenant string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.accts[tenant]
	return a != nil && a.explicit
}

// maxQuota is Mooncake's bound on a quota (and on a tenant's charge).
const maxQuota = 1<<63 - 1

// LoadTenantPolicy reads a tenant quota policy file.
func LoadTenantPolicy(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tenant quota policy: %w", err)
	}
	pol, err := ParseTenantPolicy(b)
	if err != nil {
		return nil, fmt.Errorf("tenant quota policy %s: %w", path, err)
	}
	return pol, nil
}

// ParseTenantPolicy parses Mooncake's policy YAML, refusing what
// mooncake_master refuses, with its reasons.
func ParseTenantPolicy(b []byte) (map[string]uint64, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("invalid YAML: %w", err)
	}
	if len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("tenant quota policy must be a YAML map")
	}
	doc := root.Content[0]
	field := func(m *yaml.Node, name string) *yaml.Node {
		for i := 0; i+1 < len(m.Content); i += 2 {
			if m.Content[i].Value == name {
				return m.Content[i+1]
			}
		}
		return nil
	}
	v := field(doc, "version")
	if v == nil || v.Kind != yaml.ScalarNode {
		return nil, fmt.Errorf("tenant quota policy version is required")
	}
	if n, err := strconv.Atoi(v.Value); err != nil {
		return nil, fmt.Errorf("invalid version: %q is not an integer", v.Value)
	} else if n != 1 {
		return nil, fmt.Errorf("unsupported tenant quota policy version: %d", n)
	}
	ts := field(doc, "tenants")
	if ts == nil || ts.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("tenants must be a YAML sequence")
	}
	out := make(map[string]uint64, len(ts.Content))
	for _, e := range ts.Content {
		if e.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("tenant entry must be a YAML map")
		}
		name, quota := field(e, "name"), field(e, "quota")
		if name == nil || name.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("tenant name is required")
		}
		if quota == nil || quota.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("tenant quota is required")
		}
		if name.Value == "" || store.CheckTenant(name.Value) != nil {
			return nil, fmt.Errorf("invalid tenant name %q", name.Value)
		}
		if _, dup := out[name.Value]; dup {
			return nil, fmt.Errorf("duplicate tenant name %q", name.Value)
		}
		q, err := ParseTenantQuota(quota.Value)
		if err != nil {
			return nil, fmt.Errorf("invalid quota for tenant %q: %w", name.Value, err)
		}
		out[name.Value] = q
	}
	return out, nil
}

// ParseTenantQuota reads a quota as Mooncake's policy file writes it: a
// positive integer and an optional unit B, KB, MB, GB, TB (powers of 1024).
func ParseTenantQuota(s string) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("quota must not be empty")
	}
	d := 0
	for d < len(s) && s[d] >= '0' && s[d] <= '9' {
		d++
	}
	if d == 0 {
		return 0, fmt.Errorf("quota must start with an integer")
	}
	n, err := strconv.ParseUint(s[:d], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("quota integer overflows uint64")
	}
	if n == 0 {
		return 0, fmt.Errorf("quota must be positive")
	}
	mult := map[string]uint64{"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}[s[d:]]
	if mult == 0 {
		return 0, fmt.Errorf("unsupported quota unit %q", s[d:])
	}
	if n > ^uint64(0)/mult {
		return 0, fmt.Errorf("quota byte value overflows uint64")
	}
	if n*mult > maxQuota {
		return 0, fmt.Errorf("quota exceeds maximum supported tenant charge")
	}
	return n * mult, nil
}

// FormatTenantPolicy writes a policy as mooncake_master saves it.
func FormatTenantPolicy(pol map[string]uint64) []byte {
	var b strings.Builder
	b.WriteString("version: 1\n\n")
	if len(pol) == 0 {
		b.WriteString("tenants: []\n")
		return []byte(b.String())
	}
	names := make([]string, 0, len(pol))
	for n := range pol {
		names = append(names, n)
	}
	sort.Strings(names)
	b.WriteString("tenants:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  - name: %s\n    quota: %d\n", strconv.Quote(n), pol[n])
	}
	return []byte(b.String())
}

// saveTenantPolicy replaces the policy file atomically (a temporary file,
// fsync'd, renamed over it, the directory fsync'd).
func saveTenantPolicy(path string, pol map[string]uint64) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp.*")
	if err != nil {
		return fmt.Errorf("save tenant quota policy: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(FormatTenantPolicy(pol))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save tenant quota policy %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// MultiTenant reports whether keys are scoped by tenant.
func (m *Master) MultiTenant() bool { return m.tenants != nil }

// ReadTenant resolves the tenant of a read-side call (get, exist, remove,
// regex, admin reads): the default tenant without multi-tenant mode (the
// call's tenant is ignored, as Mooncake's), else the call's, "" meaning
// the default one; an invalid id is INVALID_PARAMS.
func (m *Master) ReadTenant(raw string) (string, error) {
	if m.tenants == nil {
		return store.DefaultTenant, nil
	}
	t := store.ResolveTenant(raw)
	if err := store.CheckTenant(t); err != nil {
		return "", err
	}
	return t, nil
}

// WriteTenant resolves the tenant of a put or upsert: as ReadTenant, but
// an empty id on Mooncake's wire (emptyIsDefault false), an invalid id and
// (at a start) a tenant without a quota policy are TENANT_NOT_REGISTERED,
// as mooncake_master answers.
func (m *Master) WriteTenant(raw string, emptyIsDefault, start bool) (string, error) {
	if m.tenants == nil {
		return store.DefaultTenant, nil
	}
	if raw == "" && !emptyIsDefault {
		return "", store.Errorf(store.TenantNotRegistered, "the call names no tenant")
	}
	t := store.ResolveTenant(raw)
	if err := store.CheckTenant(t); err != nil {
		return "", store.Errorf(store.TenantNotRegistered, "%v", err)
	}
	if start && !m.tenants.registered(t) {
		return "", store.Errorf(store.TenantNotRegistered, "tenant %q has no quota policy", t)
	}
	return t, nil
}

// failErrsN is one error per item.
func failErrsN(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// userKeys strips tenant t's scope from stored keys (all t's).
func userKeys(t string, stored []string) []string {
	if t == store.DefaultTenant {
		return stored
	}
	out := make([]string, len(stored))
	for i, k := range stored {
		out[i], _ = store.KeyOfTenant(t, k)
	}
	return out
}

// keyScope selects the stored keys of one tenant, or every key (all:
// without multi-tenant mode, or for an admin's tenant "", as Mooncake's
// RemoveAll with an empty tenant id clears every tenant).
type keyScope struct {
	all    bool
	tenant string
}

func (m *Master) scope(tenant string) keyScope {
	return keyScope{all: m.tenants == nil || tenant == "", tenant: tenant}
}

// user is stored's user key if it is in scope.
func (sc keyScope) user(stored string) (string, bool) {
	if sc.all {
		return stored, true
	}
	return store.KeyOfTenant(sc.tenant, stored)
}

// users strips the scope of stored keys in scope.
func (sc keyScope) users(stored []string) []string {
	if sc.all {
		return stored
	}
	return userKeys(sc.tenant, stored)
}

// TenantQuota is a tenant's quota state (store.TenantQuota).
type TenantQuota = store.TenantQuota

// tenantUsage counts each tenant's objects and the memory bytes they hold
// (size x memory replicas, Mooncake's charge; a put in progress counts
// its granted replicas), by a scan of the objects: exact by construction.
func (m *Master) tenantUsage() map[string]*TenantQuota {
	out := map[string]*TenantQuota{}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, o := range sh.objects {
			t, _ := store.SplitKey(k)
			q := out[t]
			if q == nil {
				q = &TenantQuota{TenantID: t}
				out[t] = q
			}
			q.Objects++
			q.ChargedBytes += o.size * uint64(len(o.replicas))
			if u := o.upsert; u != nil {
				q.ChargedBytes += u.size * uint64(len(u.refs))
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// TenantQuotas lists the tenants with a policy or objects, sorted, with
// their effective quotas for the capacity mounted now (Mooncake's: the
// requested quotas while their sum fits the capacity, else shares of it
// in proportion, the remainder bytes to the largest fractions).
func (m *Master) TenantQuotas() ([]TenantQuota, error) {
	if m.tenants == nil {
		return nil, store.Errorf(store.UnavailableInCurrentMode, "the master runs without --enable_multi_tenants")
	}
	usage := m.tenantUsage()
	m.tenants.mu.Lock()
	req := map[string]uint64{}
	for t, a := range m.tenants.accts {
		if a.explicit {
			req[t] = a.requested
		}
	}
	m.tenants.mu.Unlock()
	eff := effectiveQuotas(req, m.space.capacity.Load())
	names := map[string]bool{}
	for t := range req {
		names[t] = true
	}
	for t, u := range usage {
		if u.Objects > 0 {
			names[t] = true
		}
	}
	out := make([]TenantQuota, 0, len(names))
	for t := range names {
		q := TenantQuota{TenantID: t}
		if u := usage[t]; u != nil {
			q = *u
		}
		r, explicit := req[t]
		q.RequestedQuotaBytes, q.HasExplicitPolicy, q.AdmissionClosed = r, explicit, !explicit
		q.EffectiveQuotaBytes = eff[t]
		q.OverQuota = q.ChargedBytes > q.EffectiveQuotaBytes
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TenantID < out[j].TenantID })
	return out, nil
}

// TenantQuotaOf is one tenant's state; OBJECT_NOT_FOUND for a tenant with
// neither a policy nor objects, as mooncake_master answers.
func (m *Master) TenantQuotaOf(tenant string) (TenantQuota, error) {
	all, err := m.TenantQuotas()
	if err != nil {
		return TenantQuota{}, err
	}
	for _, q := range all {
		if q.TenantID == tenant {
			return q, nil
		}
	}
	return TenantQuota{}, store.Errorf(store.ObjectNotFound, "tenant %q has no quota policy and no objects", tenant)
}

// SetTenantQuota sets tenant's requested quota, saving the policy file
// first (PERSISTENT_FAIL when it cannot be written: nothing changes).
func (m *Master) SetTenantQuota(tenant string, bytes uint64) (TenantQuota, error) {
	if m.tenants == nil {
		return TenantQuota{}, store.Errorf(store.UnavailableInCurrentMode, "the master runs without --enable_multi_tenants")
	}
	if bytes == 0 || bytes > maxQuota {
		return TenantQuota{}, store.Errorf(store.InvalidParams, "Tenant quota must be in [1, 2^63 - 1] bytes")
	}
	t := m.tenants
	t.mu.Lock()
	pol := t.policyLocked()
	pol[tenant] = bytes
	if err := saveTenantPolicy(t.path, pol); err != nil {
		t.mu.Unlock()
		m.log.Error(err.Error())
		return TenantQuota{}, store.Errorf(store.PersistentFail, "%v", err)
	}
	t.accts[tenant] = &tenantAcct{requested: bytes, explicit: true}
	t.eff = nil
	t.mu.Unlock()
	m.log.Info(fmt.Sprintf("tenant %q: quota set to %d bytes", tenant, bytes))
	return m.TenantQuotaOf(tenant)
}

// DeleteTenantQuota removes tenant's policy: OBJECT_NOT_FOUND without
// one, TENANT_NOT_EMPTY while it holds objects (Mooncake's answers). The
// answer is what is left of the tenant (nil: nothing).
func (m *Master) DeleteTenantQuota(tenant string) (*TenantQuota, error) {
	if m.tenants == nil {
		return nil, store.Errorf(store.UnavailableInCurrentMode, "the master runs without --enable_multi_tenants")
	}
	t := m.tenants
	t.mu.Lock()
	a := t.accts[tenant]
	if a == nil || !a.explicit {
		t.mu.Unlock()
		return nil, store.Errorf(store.ObjectNotFound, "tenant %q has no quota policy", tenant)
	}
	// Closed first, so no put of the tenant starts while it is checked
	// for objects; reopened if it has some.
	a.explicit = false
	t.mu.Unlock()
	if u := m.tenantUsage()[tenant]; u != nil && u.Objects > 0 {
		t.mu.Lock()
		a.explicit = true
		t.mu.Unlock()
		return nil, store.Errorf(store.TenantNotEmpty, "tenant %q still holds %d objects (%d bytes): remove them first", tenant, u.Objects, u.ChargedBytes)
	}
	t.mu.Lock()
	pol := t.policyLocked()
	if err := saveTenantPolicy(t.path, pol); err != nil {
		a.explicit = true
		t.mu.Unlock()
		m.log.Error(err.Error())
		return nil, store.Errorf(store.PersistentFail, "%v", err)
	}
	delete(t.accts, tenant)
	t.eff = nil
	t.mu.Unlock()
	m.log.Info(fmt.Sprintf("tenant %q: quota policy deleted", tenant))
	if q, err := m.TenantQuotaOf(tenant); err == nil {
		return &q, nil
	}
	return nil, nil
}

// policyLocked is the explicit policies (t.mu held).
func (t *tenantTable) policyLocked() map[string]uint64 {
	pol := map[string]uint64{}
	for n, a := range t.accts {
		if a.explicit {
			pol[n] = a.requested
		}
	}
	return pol
}

// effectiveQuotas is Mooncake's BuildEffectiveQuotaAssignments.
func effectiveQuotas(req map[string]uint64, capacity uint64) map[string]uint64 {
	out := make(map[string]uint64, len(req))
	var sumHi, sumLo uint64
	for _, r := range req {
		var c uint64
		sumLo, c = bits.Add64(sumLo, r, 0)
		sumHi += c
	}
	if sumHi == 0 && sumLo <= capacity {
		for t, r := range req {
			out[t] = r
		}
		return out
	}
	type share struct {
		t    string
		base uint64
		rem  *big.Int
	}
	sum := new(big.Int).Lsh(new(big.Int).SetUint64(sumHi), 64)
	sum.Add(sum, new(big.Int).SetUint64(sumLo))
	var shares []share
	var assigned uint64
	for t, r := range req {
		p := new(big.Int).Mul(new(big.Int).SetUint64(capacity), new(big.Int).SetUint64(r))
		q, rem := new(big.Int).QuoRem(p, sum, new(big.Int))
		shares = append(shares, share{t, q.Uint64(), rem})
		assigned += q.Uint64()
	}
	sort.Slice(shares, func(i, j int) bool {
		if c := shares[i].rem.Cmp(shares[j].rem); c != 0 {
			return c > 0
		}
		return shares[i].t < shares[j].t
	})
	left := capacity - assigned
	for _, s := range shares {
		if left > 0 {
			s.base++
			left--
		}
		out[s.t] = s.base
	}
	return out
}

// The ledger: each tenant's charged bytes, the memory its objects hold
// (chargeOf), kept as the objects change (every place an object enters or
// leaves a shard or its replicas change calls recharge), and the bytes
// reserved by puts admitted and not yet placed. tenantUsage recounts the
// same from the objects; a test holds the two equal under a storm.

// chargeOf is the memory bytes o holds (size x memory replicas, a
// resizing upsert's new replicas too): Mooncake's charge.
func chargeOf(o *Object) uint64 {
	c := o.size * uint64(len(o.replicas))
	if u := o.upsert; u != nil {
		c += u.size * uint64(len(u.refs))
	}
	return c
}

// shift moves stored key's tenant's charge from before to after.
func (t *tenantTable) shift(key string, before, after uint64) {
	if t == nil || before == after {
		return
	}
	tenant, _ := store.SplitKey(key)
	t.mu.Lock()
	t.charged[tenant] += after
	t.charged[tenant] -= before
	t.mu.Unlock()
}

// charge is chargeOf(o) on a multi-tenant master, else 0 (no ledger).
func (m *Master) charge(o *Object) uint64 {
	if m.tenants == nil {
		return 0
	}
	return chargeOf(o)
}

// recharge records that o (in its shard) held before bytes and holds
// chargeOf(o) now.
func (m *Master) recharge(o *Object, before uint64) {
	if m.tenants != nil {
		m.tenants.shift(o.key, before, chargeOf(o))
	}
}

// ChargedBytes is the ledger's charge of tenant.
func (m *Master) ChargedBytes(tenant string) uint64 {
	if m.tenants == nil {
		return 0
	}
	m.tenants.mu.Lock()
	defer m.tenants.mu.Unlock()
	return m.tenants.charged[tenant]
}

// TenantRecount is tenant's charge recounted from its objects.
func (m *Master) TenantRecount(tenant string) uint64 {
	if u := m.tenantUsage()[tenant]; u != nil {
		return u.ChargedBytes
	}
	return 0
}

// admit reserves need bytes of tenant's quota for a put, when the charged
// and reserved bytes leave room under its effective quota; else it says
// by how much the tenant is over (the deficit).
func (t *tenantTable) admit(tenant string, need, capacity uint64) (deficit uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.accts[tenant]
	if a == nil || !a.explicit {
		return 0, false
	}
	if t.effCap != capacity || t.eff == nil {
		req := map[string]uint64{}
		for n, x := range t.accts {
			if x.explicit {
				req[n] = x.requested
			}
		}
		t.eff, t.effCap = effectiveQuotas(req, capacity), capacity
	}
	used := t.charged[tenant] + t.reserved[tenant]
	if limit := t.eff[tenant]; used > limit || need > limit-used {
		return used + need - limit, false
	}
	t.reserved[tenant] += need
	return 0, true
}

// unreserve gives back a put's reservation.
func (t *tenantTable) unreserve(tenant string, need uint64) {
	t.mu.Lock()
	t.reserved[tenant] -= need
	t.mu.Unlock()
}

// admitPuts reserves quota for each item of a put start (items of one
// tenant, the batch's), evicting the tenant's own objects, in the store's
// eviction order, when it is over; an item that still does not fit fails
// with TENANT_QUOTA_EXCEEDED (Mooncake's, after its two eviction retries).
// It returns the reservations to give back once the items are placed.
func (m *Master) admitPuts(items []PutItem, cfg store.ReplicateConfig, out []ReplicaResult) (release func()) {
	if m.tenants == nil || len(items) == 0 {
		return func() {}
	}
	type res struct {
		tenant string
		need   uint64
	}
	var held []res
	for i, it := range items {
		if out[i].Err != nil {
			continue
		}
		tenant, _ := store.SplitKey(it.Key)
		need := it.Size * uint64(max(cfg.ReplicaNum, 1))
		var ok, busy bool
		var offloading uint64
		for try := 0; try <= 2; try++ {
			var deficit uint64
			if deficit, ok = m.tenants.admit(tenant, need, m.space.capacity.Load()); ok || deficit == 0 || offloading >= deficit {
				break
			}
			if try == 2 {
				break
			}
			own := func(o *Object) bool { t, _ := store.SplitKey(o.key); return t == tenant }
			freed, later, blocked := m.evictRound(phaseTenantQuota, deficit-min(deficit, offloading), own, freshFirst)
			offloading += later
			busy = busy || blocked.writing > 0
			if freed+later == 0 {
				break
			}
		}
		if !ok {
			if offloading > 0 || busy || m.tenantBusy(tenant) {
				// Its own objects are going to disk (or being
				// written): the charge drops once the writes land. As
				// any put whose room is being offloaded, it does not
				// wait for them (NO_AVAILABLE_HANDLE, retry), and
				// evicts no more meanwhile.
				// A quotaRefusal: the store's eviction for room
				// (makeRoom) leaves it alone, as room is not what
				// it lacks.
				out[i].Err = &quotaRefusal{store.Errorf(store.NoAvailableHandle, "tenant %q: %d more bytes would exceed its quota until its own objects being offloaded to disk or written land (%s started by this put); retry", tenant, need, fmtBytes(offloading))}
			} else if m.tenants.registered(tenant) {
				out[i].Err = store.Errorf(store.TenantQuotaExceeded, "tenant %q: %d more bytes would exceed its quota, and none of its own objects could be evicted for them", tenant, need)
			} else {
				out[i].Err = store.Errorf(store.TenantNotRegistered, "tenant %q has no quota policy", tenant)
			}
			continue
		}
		held = append(held, res{tenant, need})
	}
	return func() {
		for _, h := range held {
			m.tenants.unreserve(h.tenant, h.need)
		}
	}
}

// reservePromotion reserves the quota o's promotion from disk into
// memory needs (one replica of its size); false when its tenant has no
// room (or no policy). Without multi-tenant mode it always may.
func (m *Master) reservePromotion(o *Object) (uint64, bool) {
	if m.tenants == nil {
		return 0, true
	}
	tenant, _ := store.SplitKey(o.key)
	if _, ok := m.tenants.admit(tenant, o.size, m.space.capacity.Load()); !ok {
		return 0, false
	}
	return o.size, true
}

// unreservePromotion gives back a promotion's reservation (bytes).
func (m *Master) unreservePromotion(key string, bytes uint64) {
	if m.tenants == nil || bytes == 0 {
		return
	}
	tenant, _ := store.SplitKey(key)
	m.tenants.unreserve(tenant, bytes)
}

// quotaRefusal marks admitPuts' NO_AVAILABLE_HANDLE refusal: the item
// has no quota reserved, and only the tenant's own objects leaving make
// room for it. The store's eviction for room retries the placement of
// NO_AVAILABLE_HANDLE items (evictForPuts), and placing this one would
// charge the tenant past its quota, so it leaves quota refusals alone
// (as it does watermark refusals).
type quotaRefusal struct{ err error }

func (q *quotaRefusal) Error() string { return q.err.Error() }
func (q *quotaRefusal) Unwrap() error { return q.err }

// tenantBusy reports whether some object of tenant is being offloaded to
// disk or written: such objects are in no eviction list meanwhile, and
// the charge they hold drops once their writes land. A scan, made only
// for a put about to be refused.
func (m *Master) tenantBusy(tenant string) bool {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, o := range sh.objects {
			if !o.busyOnTier() && o.state == stateComplete && o.upsert == nil {
				continue
			}
			if t, _ := store.SplitKey(k); t == tenant {
				sh.mu.Unlock()
				return true
			}
		}
		sh.mu.Unlock()
	}
	return false
}

// tenantCollector exports each tenant's quota state under
// mooncake_master's metric names (master_admin_service.cpp), read when
// /metrics is scraped.
type tenantCollector struct{ m *Master }

var (
	tenantLabels       = []string{"tenant_id"}
	descTenantReq      = prometheus.NewDesc("mooncake_tenant_quota_requested_bytes", "Requested tenant quota in bytes", tenantLabels, nil)
	descTenantEff      = prometheus.NewDesc("mooncake_tenant_quota_effective_bytes", "Effective tenant quota in bytes", tenantLabels, nil)
	descTenantCharged  = prometheus.NewDesc("mooncake_tenant_quota_charged_bytes", "Tenant quota charge in bytes", tenantLabels, nil)
	descTenantClosed   = prometheus.NewDesc("mooncake_tenant_quota_admission_closed", "Tenant quota admission closed flag", tenantLabels, nil)
	descTenantOver     = prometheus.NewDesc("mooncake_tenant_quota_over_quota", "Tenant over-quota flag", tenantLabels, nil)
	descTenantExplicit = prometheus.NewDesc("mooncake_tenant_quota_explicit_policy", "Tenant explicit policy flag", tenantLabels, nil)
	descTenantObjects  = prometheus.NewDesc("mc_tenant_objects", "Objects of the tenant (mc's)", tenantLabels, nil)
	descTenantCap      = prometheus.NewDesc("mooncake_tenant_quota_allocatable_capacity_bytes", "Global tenant quota allocatable capacity in bytes", nil, nil)
	descTenantReqSum   = prometheus.NewDesc("mooncake_tenant_quota_requested_bytes_sum", "Global requested tenant quota sum in bytes", nil, nil)
	descTenantEffSum   = prometheus.NewDesc("mooncake_tenant_quota_effective_bytes_sum", "Global effective tenant quota sum in bytes", nil, nil)
)

func (tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTenantReq, descTenantEff, descTenantCharged, descTenantClosed, descTenantOver, descTenantExplicit, descTenantObjects, descTenantCap, descTenantReqSum, descTenantEffSum} {
		ch <- d
	}
}

func (c tenantCollector) Collect(ch chan<- prometheus.Metric) {
	qs, err := c.m.TenantQuotas()
	if err != nil {
		return
	}
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	var req, eff float64
	for _, q := range qs {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, q.TenantID)
		}
		g(descTenantReq, float64(q.RequestedQuotaBytes))
		g(descTenantEff, float64(q.EffectiveQuotaBytes))
		g(descTenantCharged, float64(q.ChargedBytes))
		g(descTenantClosed, flag(q.AdmissionClosed))
		g(descTenantOver, flag(q.OverQuota))
		g(descTenantExplicit, flag(q.HasExplicitPolicy))
		g(descTenantObjects, float64(q.Objects))
		req += float64(q.RequestedQuotaBytes)
		eff += float64(q.EffectiveQuotaBytes)
	}
	ch <- prometheus.MustNewConstMetric(descTenantCap, prometheus.GaugeValue, float64(c.m.space.capacity.Load()))
	ch <- prometheus.MustNewConstMetric(descTenantReqSum, prometheus.GaugeValue, req)
	ch <- prometheus.MustNewConstMetric(descTenantEffSum, prometheus.GaugeValue, eff)
}
