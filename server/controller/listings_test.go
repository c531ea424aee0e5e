package controller

import (
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

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
	counter := &storagetest.ListCounter{Location: sw.loc}
	sw.loc = counter
	sw.restart()

	// The first round also recalls what earlier servers did.
	rounds := []string{"2026-12-01T10:00:10Z", "2026-12-01T10:00:20Z", "2026-12-01T10:10:01Z"}
	for _, at := range rounds {
		before := counter.Lists.Load()
		sw.at(at)
		if n := counter.Lists.Load() - before; n != 1 {
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
