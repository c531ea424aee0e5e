package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// After a restore without a revision bump, the target's new full backup
// has a lower revision than the one before the restore: the new chain
// starts from it all the same (revision alone kept the old full, whose
// chain had ended, and started a full backup every round).
func TestNewestChainBaseGoesByWhenTheStateWasTaken(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	full := func(name string, rev int64, at time.Time) *storage.Manifest {
		return &storage.Manifest{Name: name, CreateTime: at.Add(time.Second),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "app", StartTime: at},
			Etcd:   &storage.EtcdInfo{Revision: rev, SnapshotStatus: true}}
	}
	before := full("app-before", 5000, t0)
	after := full("app-after", 1200, t0.Add(time.Hour))
	upload := &storage.Manifest{Name: "uploaded", CreateTime: t0.Add(2 * time.Hour),
		Source: storage.Source{Kind: ebv1.SourceUpload, Target: "app"}, Etcd: &storage.EtcdInfo{Revision: 9000, SnapshotStatus: true}}
	other := full("other", 1, t0.Add(3*time.Hour))
	other.Source.Target = "other"
	if got := storage.NewestChainBase([]*storage.Manifest{before, after, upload, other}, "app"); got != after {
		t.Fatalf("chain base is %v, want app-after (taken last)", got.Name)
	}
	// Taken at the same time (a clock's resolution): the higher revision.
	twin := full("app-twin", 1300, t0.Add(time.Hour))
	if got := storage.NewestChainBase([]*storage.Manifest{after, twin}, "app"); got != twin {
		t.Fatalf("chain base is %v, want app-twin (same time, higher revision)", got.Name)
	}
}

// Retention counts the fulls a target's delta capture takes: a target
// with deltas and no schedule does not grow until someone prunes it by
// hand. When the full that starts a new chain is stored, the older
// chains go with their segments; an on-demand backup stays.
func TestRetentionAfterANewChainBase(t *testing.T) {
	target := config.Target{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true,
		Deltas: &config.Deltas{}, Retention: &config.Retention{KeepLast: 1}}
	sw := newSchedWorld(t, target, backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
	sw.storeChainBase("cp-chain-20261201-080000", 100)
	sw.storeSegment("cp-chain-20261201-080000", 101, 150)
	sw.now = backuptest.MustTime(t, "2026-12-01T09:00:00Z")
	sw.storeChainBase("cp-chain-20261201-090000", 200)
	sw.storeSegment("cp-chain-20261201-090000", 201, 250)
	sw.store("by-hand", false, backuptest.MustTime(t, "2026-12-01T09:10:00Z"))
	// The chain ends (etcd compacted past its agent): the controller
	// starts a full backup for the next chain.
	end := &storage.Manifest{Name: storage.SegmentName("cp-chain-20261201-090000", 251), SHA256: strings.Repeat("e", 64), CreateTime: sw.now,
		Source: storage.Source{Kind: ebv1.SourceDelta, Target: "cp"},
		Delta:  &storage.Delta{Chain: "cp-chain-20261201-090000", Epoch: 1, FirstRevision: 251, LastRevision: 260, Events: 10, EndReason: "compacted"}}
	backuptest.Put(t, sw.loc, end, []byte("segment"))
	sw.at("2026-12-01T10:00:00Z")
	next := schedule.ChainName("cp", sw.now)
	if !slices.Contains(sw.backupsOfJobs(), next) {
		t.Fatalf("backup Jobs %v; want one of %s", sw.backupsOfJobs(), next)
	}
	sw.storeChainBase(next, 300)
	sw.finishJob(next, true, false)
	sw.at("2026-12-01T10:01:00Z")
	backuptest.Equal(t, "stored", sw.stored(), []string{"by-hand", next})
}
