package cmd

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kvcache-ops/mc/pkg/store"
	"github.com/kvcache-ops/mc/pkg/store/master"
	"github.com/kvcache-ops/mc/pkg/units"
)

// Mooncake's real client takes its offload directory and size from the
// environment once --enable_offload is given.
const (
	mooncakeOffloadPathEnv = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
	mooncakeOffloadSizeEnv = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"
	mooncakeOffloadPath    = "/data/file_storage"
	// mooncakeOffloadBufferEnv is Mooncake's offload read buffer size:
	// mc's --ssd-staging-size.
	mooncakeOffloadBufferEnv = "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES"
)

func addTierFlags(f *pflag.FlagSet, o *serveStoreOptions) {
	f.StringVar(&o.SSDDir, "ssd-dir", "", "give this node's segment a disk tier in this existing directory: objects evicted from DRAM are offloaded there and read back from it")
	sizeVar(f, &o.SSDSize, "ssd-size", 0, "capacity of the disk tier, e.g. 200G (0: 90% of the space available in --ssd-dir at start)")
	f.BoolVar(&o.EnableOffload, "enable-offload", false, "Mooncake's spelling of a disk tier: in $"+mooncakeOffloadPathEnv+" (default "+mooncakeOffloadPath+"), of $"+mooncakeOffloadSizeEnv+" bytes (default as --ssd-size)")
	sizeVar(f, &o.SSDStagingSize, "ssd-staging-size", 0, "the node's staging pool for disk reads, memory apart from the segment that disk objects are read into for their readers, e.g. 256M (0: a quarter of --segment-size, 16M to 1280M; $"+mooncakeOffloadBufferEnv+" with --enable-offload)")
	durationVar(f, &o.SSDStagingTTL, "ssd-staging-ttl", master.DefaultStagingTTL, "master: how long a staged disk read holds its staging range when its reader does not hand it back (it died, or reads through Mooncake's wire); the role of Mooncake's client_buffer_gc_ttl_ms, which counts milliseconds where a bare number here is seconds")
	f.IntVar(&o.PromoteAfter, "promote-after", master.DefaultPromoteAfter, "master: the disk read on which an object is promoted back into DRAM (0: never; earlier reads are staged for the read only)")
}

// tierConfig is the node's disk tier from --ssd-dir / --enable-offload,
// nil without one.
func (o serveStoreOptions) tierConfig(segSize int64) (*store.TierConfig, error) {
	dir, size, staging := o.SSDDir, o.SSDSize, o.SSDStagingSize
	if o.EnableOffload {
		if env := os.Getenv(mooncakeOffloadBufferEnv); staging == 0 && env != "" {
			n, err := units.ParseSize(env)
			if err != nil || n <= 0 {
				return nil, usagef("invalid $%s %q: want bytes with an optional unit (256M, 2G)", mooncakeOffloadBufferEnv, env)
			}
			staging = n
		}
		if dir == "" {
			if dir = os.Getenv(mooncakeOffloadPathEnv); dir == "" {
				dir = mooncakeOffloadPath
			}
		}
		if env := os.Getenv(mooncakeOffloadSizeEnv); size == 0 && env != "" {
			n, err := units.ParseSize(env)
			if err != nil || n <= 0 {
				return nil, usagef("invalid $%s %q: want bytes with an optional unit (200G, 2T)", mooncakeOffloadSizeEnv, env)
			}
			size = n
		}
	}
	if dir == "" {
		if size != 0 {
			return nil, usagef("--ssd-size %d without --ssd-dir: give the disk tier a directory", size)
		}
		if staging != 0 {
			return nil, usagef("--ssd-staging-size %d without --ssd-dir: a staging pool is for a disk tier's reads", staging)
		}
		return nil, nil
	}
	switch {
	case segSize == 0:
		return nil, usagef("--ssd-dir %s needs a segment to offload from: give --segment-size", dir)
	case store.IsMooncakeAddress(o.Master):
		return nil, usagef("--ssd-dir needs an mc master; --master %s is a mooncake_master", o.Master)
	}
	cfg := &store.TierConfig{Dir: dir}
	if size < 0 {
		return nil, usagef("invalid --ssd-size %d: want bytes", size)
	}
	cfg.Capacity = uint64(size)
	if staging < 0 {
		return nil, usagef("invalid --ssd-staging-size %d: want bytes", staging)
	}
	cfg.StagingSize = uint64(staging)
	return cfg, nil
}

// printDiskTiers is `mc store stat`'s part for the nodes' disk tiers.
func printDiskTiers(p *printer, s storeStat) {
	if len(s.DiskTiers) == 0 {
		return
	}
	rows := make([][]string, 0, len(s.DiskTiers))
	for _, t := range s.DiskTiers {
		state := "connected"
		if !t.Connected {
			state = "away"
		}
		rows = append(rows, []string{t.Segment, state, humanBytes(t.Used), humanBytes(t.Capacity), strconv.FormatUint(t.Records, 10),
			strconv.Itoa(t.DiskReplicas), strconv.FormatUint(t.Offloads, 10), strconv.FormatUint(t.Promotions, 10),
			strconv.FormatUint(t.DiskHits, 10), humanBytes(t.StagingUsed) + " / " + humanBytes(t.StagingSize), t.Dir})
	}
	p.Table("disk tiers", []string{"segment", "state", "used", "capacity", "records", "disk replicas", "offloads", "promotions", "disk hits", "staging", "dir"}, rows)
	if c := s.DiskTier; c != nil {
		p.Table("", []string{"disk tier", "value"}, [][]string{
			{"offloads (refused: disk full / failed)", fmt.Sprintf("%d (%d / %d), %s", c.Offloads, c.OffloadFull, c.OffloadFailed, humanBytes(c.OffloadBytes))},
			{"gets served from DRAM / from disk", fmt.Sprintf("%d / %d", c.MemHits, c.DiskHits)},
			{"promotions", strconv.FormatUint(c.Promotions, 10)},
			{"staged reads handed back / freed by the TTL (reader gone)", fmt.Sprintf("%d / %d", c.StagedReleased, c.StagedReclaimed)},
			{"reads that waited for staging room", strconv.FormatUint(c.StagingWaits, 10)},
			{"disk replicas evicted by their tier", strconv.FormatUint(c.DiskEvicted, 10)},
			{"disk reads failed (replica dropped)", strconv.FormatUint(c.LoadFailures, 10)},
		})
	}
}

// parseSSDCapacities reads --ssd-capacity-blocks: blocks, 0 for none.
func parseSSDCapacities(list []string) ([]int, error) {
	out := make([]int, 0, len(list))
	for _, s := range list {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return nil, usagef("invalid --ssd-capacity-blocks %q: want a number of blocks, 0 for no disk tier", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// tierHits reads the master's DRAM and disk hit counters from its admin
// API, for the online replay's split.
func (o storeClientOptions) tierHits() (func(context.Context) (uint64, uint64, error), error) {
	a, err := o.admin()
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (uint64, uint64, error) {
		m, err := a.Metrics(ctx)
		if err != nil {
			return 0, 0, err
		}
		return uint64(m["mem_cache_hit_nums_"]), uint64(m["file_cache_hit_nums_"]), nil
	}, nil
}
