package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

func foldedTarget() config.Target {
	return config.Target{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true,
		Deltas: &config.Deltas{CompactAfterRevisions: 1000}}
}

// storeChainBase puts an agent full backup at rev, whose revision was
// read from its snapshot: a chain starts from it.
func (sw *schedWorld) storeChainBase(name string, rev int64) {
	sw.t.Helper()
	m := &storage.Manifest{Name: name, SHA256: strings.Repeat("f", 64), CreateTime: sw.now,
		Source: storage.Source{Kind: ebv1.SourceAgent, Target: sw.target.Name},
		Etcd:   &storage.EtcdInfo{Revision: rev, SnapshotStatus: true}}
	backuptest.Put(sw.t, sw.loc, m, []byte("data of "+name))
}

// storeSegment puts chain's segment of revisions first..last.
func (sw *schedWorld) storeSegment(chain string, first, last int64) {
	sw.t.Helper()
	m := &storage.Manifest{Name: storage.SegmentName(chain, first), SHA256: fmt.Sprintf("%064d", first), CreateTime: sw.now,
		Source: storage.Source{Kind: ebv1.SourceDelta, Target: sw.target.Name},
		Delta:  &storage.Delta{Chain: chain, Epoch: 1, FirstRevision: first, LastRevision: last, Events: last - first + 1}}
	backuptest.Put(sw.t, sw.loc, m, []byte("segment "+m.Name))
}

func (sw *schedWorld) foldJobs() []batchv1.Job {
	var out []batchv1.Job
	for _, j := range sw.jobs() {
		if j.Labels[jobs.LabelComponent] == jobs.ComponentFold {
			out = append(out, j)
		}
	}
	return out
}

// A chain longer than compactAfterRevisions is folded by one Job at a
// time, pinned to the chain as stored; a failed fold is not retried at
// once, a later one folds the longer chain, and a folded full starts a
// chain too short to fold.
func TestFoldRoundFoldsALongChainOnce(t *testing.T) {
	sw := newSchedWorld(t, foldedTarget(), backuptest.MustTime(t, "2026-12-01T10:00:00Z"))
	sw.storeChainBase("cp-full", 100)
	sw.storeSegment("cp-full", 101, 600)
	sw.storeSegment("cp-full", 601, 1100)
	// Not contiguous: left out of the chain.
	sw.storeSegment("cp-full", 1500, 1600)
	sw.at("2026-12-01T10:00:10Z")
	if f := sw.foldJobs(); len(f) != 0 {
		t.Fatalf("a chain of exactly 1000 revisions was folded: %v", f[0].Name)
	}

	sw.storeSegment("cp-full", 1101, 1200)
	sw.at("2026-12-01T10:00:20Z")
	folds := sw.foldJobs()
	if len(folds) != 1 {
		t.Fatalf("%d fold jobs for a chain of 1100 revisions, want 1", len(folds))
	}
	j := folds[0]
	in, err := jobs.ParseFoldInputs(j.Annotations[jobs.AnnotationFoldInputs])
	if err != nil {
		t.Fatal(err)
	}
	if j.Annotations[jobs.AnnotationBackup] != "cp-fold-1200" || in.Full != (jobs.FoldRef{Name: "cp-full", SHA256: strings.Repeat("f", 64)}) ||
		in.ToRevision != 1200 || len(in.Segments) != 3 || in.Segments[2].Name != "cp-full.delta-1101" || in.Segments[2].SHA256 != fmt.Sprintf("%064d", 1101) {
		t.Fatalf("fold job %s of %s with inputs %+v", j.Name, j.Annotations[jobs.AnnotationBackup], in)
	}
	if err := sw.agents.Signer().Verify(&j); err != nil {
		t.Fatalf("the fold Job is not signed: %v", err)
	}

	// One at a time: the chain grew, the fold still runs.
	sw.storeSegment("cp-full", 1201, 1300)
	sw.at("2026-12-01T10:00:30Z")
	if n := len(sw.foldJobs()); n != 1 {
		t.Fatalf("%d fold jobs while one runs", n)
	}

	// It ends without a verdict (it learned nothing about the chain):
	// the next round folds the longer chain.
	sw.endFold(j, nil, 1)
	sw.at("2026-12-01T10:00:40Z")
	folds = sw.foldJobs()
	if len(folds) != 2 {
		t.Fatalf("%d fold jobs after one without a verdict, want the fold to 1300", len(folds))
	}
	if got := sw.foldJobs()[1].Annotations[jobs.AnnotationBackup]; got != "cp-fold-1300" && sw.foldJobs()[0].Annotations[jobs.AnnotationBackup] != "cp-fold-1300" {
		t.Fatalf("the second fold stores %s, want cp-fold-1300", got)
	}

	// It succeeds: the folded full is the newest chain base, whose chain
	// is empty; nothing more to fold.
	for _, f := range sw.foldJobs() {
		if f.Annotations[jobs.AnnotationBackup] == "cp-fold-1300" {
			sw.storeChainBase("cp-fold-1300", 1300)
			sw.endFold(f, &jobs.FoldVerdict{Succeeded: true, Backup: "cp-fold-1300", Revision: 1300}, 0)
		}
	}
	sw.at("2026-12-01T10:30:00Z")
	if n := len(sw.foldJobs()); n != 2 {
		t.Fatalf("%d fold jobs after the chain was folded, want the 2 finished ones", n)
	}
}

// A fold that reached a verdict that the chain does not fold holds the
// chain's next fold back for foldRetryAfter.
func TestFailedFoldWaitsBeforeTheNext(t *testing.T) {
	sw := newSchedWorld(t, foldedTarget(), backuptest.MustTime(t, "2026-12-01T10:00:00Z"))
	sw.storeChainBase("cp-full", 100)
	sw.storeSegment("cp-full", 101, 1200)
	sw.at("2026-12-01T10:00:10Z")
	folds := sw.foldJobs()
	if len(folds) != 1 {
		t.Fatalf("%d fold jobs", len(folds))
	}
	sw.endFold(folds[0], &jobs.FoldVerdict{Message: "the chain does not replay"}, 3)
	sw.storeSegment("cp-full", 1201, 1300)
	sw.at("2026-12-01T10:05:00Z")
	if n := len(sw.foldJobs()); n != 1 {
		t.Fatalf("a new fold %s after a failed one", sw.foldJobs()[1].Name)
	}
	sw.now = sw.now.Add(foldRetryAfter)
	sw.c.round(context.Background(), sw.w)
	if n := len(sw.foldJobs()); n != 2 {
		t.Fatalf("%d fold jobs %v after the retry delay, want the fold to 1300", n, foldRetryAfter)
	}
}

// A chain of more segments than one fold reads is ended by a full backup.
func TestChainTooLongToFoldStartsAFullBackup(t *testing.T) {
	sw := newSchedWorld(t, foldedTarget(), backuptest.MustTime(t, "2026-12-01T10:00:00Z"))
	sw.storeChainBase("cp-full", 100)
	for i := range int64(jobs.MaxFoldSegments + 1) {
		sw.storeSegment("cp-full", 101+2*i, 102+2*i)
	}
	sw.at("2026-12-01T10:00:10Z")
	if n := len(sw.foldJobs()); n != 0 {
		t.Fatalf("%d fold jobs for a chain of %d segments", n, jobs.MaxFoldSegments+1)
	}
	var full bool
	for _, j := range sw.jobs() {
		full = full || j.Labels[jobs.LabelComponent] == jobs.ComponentBackup && strings.HasPrefix(j.Annotations[jobs.AnnotationBackup], "cp-chain-")
	}
	if !full {
		t.Fatalf("no full backup started; jobs %v", sw.backupsOfJobs())
	}
}

// endFold ends fold Job j with verdict (nil: none) as its termination
// message.
func (sw *schedWorld) endFold(j batchv1.Job, verdict *jobs.FoldVerdict, exitCode int32) {
	sw.t.Helper()
	msg := ""
	if verdict != nil {
		b, _ := json.Marshal(verdict)
		msg = string(b)
	}
	sw.endAgent(j, msg, exitCode)
}
