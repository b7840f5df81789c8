package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// DefaultQuotaBackendBytes is etcd's own default quota (2 GiB).
const DefaultQuotaBackendBytes = 2 << 30

// lowDiskBytes: less free space than this on the data dir's filesystem is
// reported at every check (etcd exits when a write fails).
const lowDiskBytes = 256 << 20

// maintainer keeps an embedded etcd usable: it reports a NOSPACE alarm
// and recovers from it (compact, defragment, disarm), defragments a
// database mostly made of free pages when it nears the quota (etcd's
// quota counts the file, free pages included), and reports a filling
// disk. Each finding is logged with what to do.
type maintainer struct {
	ee    *EmbeddedEtcd
	cli   *clientv3.Client
	ep    string
	quota int64
	log   *slog.Logger
	// lastWarn rate-limits the repeated warnings (database near its
	// quota, disk low) to one a minute.
	lastQuotaWarn, lastDiskWarn time.Time
}

func (ee *EmbeddedEtcd) startMaintenance(cfg EtcdConfig, log *slog.Logger) error {
	ep := ee.Endpoints()[0]
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd maintenance client: %w", err)
	}
	quota := cfg.QuotaBackendBytes
	if quota <= 0 {
		quota = DefaultQuotaBackendBytes
	}
	m := &maintainer{ee: ee, cli: cli, ep: ep, quota: quota, log: log}
	ctx, cancel := context.WithCancel(context.Background())
	ee.stopMaint = cancel
	ee.maintDone = make(chan struct{})
	go func() {
		defer close(ee.maintDone)
		defer cli.Close()
		t := time.NewTicker(cfg.Maintenance)
		defer t.Stop()
		for {
			m.check(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// check runs one round of maintenance.
func (m *maintainer) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	m.checkDisk()
	st, err := m.cli.Status(ctx, m.ep)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn(fmt.Sprintf("etcd maintenance: status of %s: %v", m.ep, err))
		}
		return
	}
	alarms, err := m.cli.AlarmList(ctx)
	if err != nil {
		m.log.Warn(fmt.Sprintf("etcd maintenance: alarms of %s: %v", m.ep, err))
		return
	}
	for _, a := range alarms.Alarms {
		if a.Alarm == pb.AlarmType_NOSPACE {
			m.recoverNoSpace(ctx, st, a)
			return
		}
	}
	switch {
	case st.DbSize >= m.quota/2 && st.DbSizeInUse <= st.DbSize/2:
		// etcd's quota counts the file: free pages count against it.
		if err := m.defrag(ctx); err != nil {
			m.log.Warn(fmt.Sprintf("etcd maintenance: defragment %s (database %s, %s in use, quota %s): %v", m.ep, mib(st.DbSize), mib(st.DbSizeInUse), mib(m.quota), err))
		}
	case st.DbSize >= m.quota*8/10 && time.Since(m.lastQuotaWarn) >= time.Minute:
		m.lastQuotaWarn = time.Now()
		m.log.Warn(fmt.Sprintf("etcd database at %s of its %s quota (%s in use): at the quota etcd refuses every write (NOSPACE) and HA masters stop; "+
			"remove keys or restart with a larger --quota-backend-bytes", mib(st.DbSize), mib(m.quota), mib(st.DbSizeInUse)))
	}
}

// recoverNoSpace: the database reached the quota and etcd refuses every
// write. History is compacted to the current revision (keys stay; a
// watcher from an older revision resyncs), the file defragmented, and
// the alarm disarmed if that made room.
func (m *maintainer) recoverNoSpace(ctx context.Context, st *clientv3.StatusResponse, a *pb.AlarmMember) {
	m.log.Error(fmt.Sprintf("etcd NOSPACE alarm: its database (%s, %s in use) reached the %s quota: etcd refuses every write, so HA store masters cannot lead or commit (puts time out) and engines cannot publish segments; "+
		"compacting history to revision %d, defragmenting and disarming", mib(st.DbSize), mib(st.DbSizeInUse), mib(m.quota), st.Header.Revision))
	if _, err := m.cli.Compact(ctx, st.Header.Revision); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		m.log.Error(fmt.Sprintf("etcd NOSPACE recovery: compact to revision %d: %v; by hand: etcdctl --endpoints %s compaction %d && etcdctl defrag && etcdctl alarm disarm", st.Header.Revision, err, m.ep, st.Header.Revision))
		return
	}
	if err := m.defrag(ctx); err != nil {
		m.log.Error(fmt.Sprintf("etcd NOSPACE recovery: defragment: %v; by hand: etcdctl --endpoints %s defrag && etcdctl alarm disarm", err, m.ep))
		return
	}
	after, err := m.cli.Status(ctx, m.ep)
	if err != nil {
		m.log.Error(fmt.Sprintf("etcd NOSPACE recovery: status: %v", err))
		return
	}
	if after.DbSize >= m.quota*9/10 {
		m.log.Error(fmt.Sprintf("etcd NOSPACE: still %s (%s in use) of the %s quota after compaction and defragmentation: the keys themselves fill it; "+
			"remove keys (etcdctl del --prefix ...) or restart with a larger --quota-backend-bytes, then etcdctl alarm disarm", mib(after.DbSize), mib(after.DbSizeInUse), mib(m.quota)))
		return
	}
	if _, err := m.cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm}); err != nil {
		m.log.Error(fmt.Sprintf("etcd NOSPACE recovery: disarm: %v; by hand: etcdctl --endpoints %s alarm disarm", err, m.ep))
		return
	}
	m.log.Warn(fmt.Sprintf("etcd NOSPACE alarm cleared: database now %s (%s in use) of the %s quota; writes are accepted again", mib(after.DbSize), mib(after.DbSizeInUse), mib(m.quota)))
}

func (m *maintainer) defrag(ctx context.Context) error {
	before, err := m.cli.Status(ctx, m.ep)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := m.cli.Defragment(ctx, m.ep); err != nil {
		return err
	}
	after, err := m.cli.Status(ctx, m.ep)
	if err != nil {
		return err
	}
	m.log.Info(fmt.Sprintf("etcd defragmented in %s: database %s -> %s (%s in use)", time.Since(start).Round(time.Millisecond), mib(before.DbSize), mib(after.DbSize), mib(after.DbSizeInUse)))
	return nil
}

// checkDisk reports a data dir whose filesystem is nearly full: etcd
// exits when a write fails.
func (m *maintainer) checkDisk() {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(m.ee.dataDir, &fs); err != nil {
		return
	}
	free := int64(fs.Bavail) * int64(fs.Bsize)
	if free >= lowDiskBytes || time.Since(m.lastDiskWarn) < time.Minute {
		return
	}
	m.lastDiskWarn = time.Now()
	m.log.Error(fmt.Sprintf("etcd data dir %s: only %s free on its filesystem: etcd exits when a write fails (and HA store masters stop); free space there or restart with --data-dir elsewhere", m.ee.dataDir, mib(free)))
}
