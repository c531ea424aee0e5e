package controller

import (
	"testing"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
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
	if got := newestChainBase([]*storage.Manifest{before, after, upload, other}, "app"); got != after {
		t.Fatalf("chain base is %v, want app-after (taken last)", got.Name)
	}
	// Taken at the same time (a clock's resolution): the higher revision.
	twin := full("app-twin", 1300, t0.Add(time.Hour))
	if got := newestChainBase([]*storage.Manifest{after, twin}, "app"); got != twin {
		t.Fatalf("chain base is %v, want app-twin (same time, higher revision)", got.Name)
	}
}
