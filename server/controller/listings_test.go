package controller

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// listCounter counts the listings of the location it wraps.
type listCounter struct {
	storage.Location
	lists atomic.Int64
}

func (c *listCounter) List(ctx context.Context) ([]*storage.Manifest, error) {
	c.lists.Add(1)
	return c.Location.List(ctx)
}

func (c *listCounter) SetVerification(ctx context.Context, name string, v *storage.Verification) error {
	return c.Location.(storage.VerificationWriter).SetVerification(ctx, name, v)
}

// A round lists each location once, however many of its parts read it:
// the schedules' recall, the delta supervisor, the chain folds and the
// drill schedule share the round's listing (they listed it each, every
// round, for every delta target).
func TestARoundListsEachLocationOnce(t *testing.T) {
	target := foldedTarget()
	target.Drill = &config.Drill{Schedule: "*/10 * * * *"}
	sw := newSchedWorld(t, target, backuptest.MustTime(t, "2026-12-01T10:00:00Z"))
	sw.storeChainBase("cp-full", 100)
	sw.storeSegment("cp-full", 101, 600)
	sw.storeFingerprinted("cp-1", backuptest.MustTime(t, "2026-12-01T09:00:00Z"))
	counter := &listCounter{Location: sw.loc}
	sw.loc = counter
	sw.restart()

	// The first round also recalls what earlier servers did.
	rounds := []string{"2026-12-01T10:00:10Z", "2026-12-01T10:00:20Z", "2026-12-01T10:10:01Z"}
	for _, at := range rounds {
		before := counter.lists.Load()
		sw.at(at)
		if n := counter.lists.Load() - before; n != 1 {
			t.Errorf("round at %s listed the location %d times, want 1", at, n)
		}
	}
	// The rounds did read the listing: a delta agent on cp-full's chain,
	// and the drill the schedule asked for at 10:10.
	var deltas int
	for _, j := range sw.jobs() {
		if j.Labels[jobs.LabelComponent] == jobs.ComponentDelta {
			deltas++
		}
	}
	if deltas != 1 {
		t.Errorf("%d delta agent Jobs, want 1", deltas)
	}
	if d := sw.drillJobs(); len(d) != 1 || d[0].Annotations[jobs.AnnotationBackup] != "cp-1" {
		t.Errorf("drill Jobs %v, want one of cp-1", d)
	}
}
