package cmd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/units"
)

func newStoreTenantsCmd(p *printer) *cobra.Command {
	var o storeClientOptions
	cmd := &cobra.Command{
		Use:   "tenants [ls | set NAME SIZE | rm NAME]",
		Short: "List, set and remove tenant quotas (a master with --enable-multi-tenants)",
		Long: `tenants reads and changes the tenant quota policy of a master in multi-tenant
mode through Mooncake's admin API (/api/v1/tenant_quotas; mooncake_master
answers the same): ls (the default) lists each tenant with a policy or
objects: its requested quota, its effective quota (the requested one while
the quotas fit the mounted capacity, else its share of it), the bytes it is
charged, its objects and whether it is over its quota. set NAME SIZE sets a
tenant's quota (SIZE as the policy file writes it, 512, 64MB or 2GB in
powers of 1024, or 2GiB), rm NAME removes it (refused, TENANT_NOT_EMPTY,
while the tenant holds objects). set and rm change the policy file and need
the master's admin token when it has one.`,
		Example: `  mc store tenants
  mc store tenants set team-a 64GB
  mc store tenants rm team-a`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := refuseGiven(cmd, "picks the keys a verb uses; tenants names the tenant as its argument (set NAME, rm NAME)", "tenant"); err != nil {
				return err
			}
			verb := "ls"
			if len(args) > 0 {
				verb, args = args[0], args[1:]
			}
			a, err := o.admin()
			if err != nil {
				return fmt.Errorf("tenants: %w", err)
			}
			ctx := cmd.Context()
			switch verb {
			case "ls":
				if len(args) != 0 {
					return usagef("store tenants ls: takes no arguments")
				}
				qs, err := a.TenantQuotas(ctx)
				if err != nil {
					return fmt.Errorf("tenants ls: %w", tenantsErr(err))
				}
				return printTenants(p, qs)
			case "set":
				if len(args) != 2 {
					return usagef("store tenants set: want NAME SIZE")
				}
				if err := checkTenantName(args[0]); err != nil {
					return usagef("store tenants set: invalid tenant %q: %w", args[0], err)
				}
				n, err := tenantQuotaSize(args[1])
				if err != nil {
					return usagef("store tenants set: invalid SIZE %q: %w", args[1], err)
				}
				q, err := a.SetTenantQuota(ctx, args[0], n)
				if err != nil {
					return fmt.Errorf("tenants set %s: %w", args[0], tenantsErr(err))
				}
				return printTenants(p, []store.TenantQuota{q})
			case "rm":
				if len(args) != 1 {
					return usagef("store tenants rm: want NAME")
				}
				if err := checkTenantName(args[0]); err != nil {
					return usagef("store tenants rm: invalid tenant %q: %w", args[0], err)
				}
				if _, err := a.DeleteTenantQuota(ctx, args[0]); err != nil {
					return fmt.Errorf("tenants rm %s: %w", args[0], tenantsErr(err))
				}
				if p.JSON() {
					return p.PrintJSON(map[string]any{"tenant_id": args[0], "removed": true})
				}
				fmt.Fprintf(p.Out, "tenant %s: quota policy removed\n", args[0])
				return nil
			}
			return usagef("store tenants: unknown verb %q: want ls, set NAME SIZE or rm NAME", verb)
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// tenantsErr says what a master without tenants means: its admin API
// answers UNAVAILABLE_IN_CURRENT_MODE with that name for a message
// (Mooncake's body), which read "UNAVAILABLE_IN_CURRENT_MODE:
// UNAVAILABLE_IN_CURRENT_MODE".
func tenantsErr(err error) error {
	if store.CodeOf(err) == store.UnavailableInCurrentMode {
		return store.Errorf(store.UnavailableInCurrentMode, "the master runs without tenants (start it with --enable-multi-tenants and --tenant-quota-connector-uri)")
	}
	return err
}

// tenantQuotaSize reads a quota as Mooncake's policy file writes it
// (powers of 1024: 2GB is 2 GiB), or as mc's sizes (2GiB).
func tenantQuotaSize(s string) (uint64, error) {
	n, err := master.ParseTenantQuota(s)
	if err == nil {
		return n, nil
	}
	if m, uerr := units.ParseSize(s); uerr == nil && m > 0 {
		return uint64(m), nil
	}
	return 0, err
}

func printTenants(p *printer, qs []store.TenantQuota) error {
	if p.JSON() {
		if qs == nil {
			qs = []store.TenantQuota{}
		}
		return p.PrintJSON(map[string]any{"tenants": qs})
	}
	rows := make([][]string, 0, len(qs))
	for _, q := range qs {
		policy := "yes"
		if !q.HasExplicitPolicy {
			policy = "no (closed)"
		}
		rows = append(rows, []string{q.TenantID, humanBytes(q.RequestedQuotaBytes), humanBytes(q.EffectiveQuotaBytes),
			humanBytes(q.ChargedBytes), strconv.FormatUint(q.Objects, 10), strconv.FormatBool(q.OverQuota), policy})
	}
	p.Table("", []string{"tenant", "requested", "effective", "charged", "objects", "over_quota", "policy"}, rows)
	return nil
}

// checkTenantName is store.CheckTenant, and refuses a name of only
// spaces: the master would take it, but on a command line it is a
// quoting mistake.
func checkTenantName(t string) error {
	if t != "" && strings.TrimSpace(t) == "" {
		return fmt.Errorf("a tenant id of only spaces")
	}
	return store.CheckTenant(t)
}
