package server

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

const testNS = "etcdbackup-system"

// schedWorld is a server with one filesystem location, a fake cluster and
// a clock the test moves; rounds of the scheduler are run by hand.
type schedWorld struct {
	t      *testing.T
	now    time.Time
	dir    string
	cs     *fake.Clientset
	loc    storage.Location
	target config.Target
	srv    *Server
	w      *watcher
}

func newSchedWorld(t *testing.T, target config.Target, now time.Time) *schedWorld {
	t.Helper()
	sw := &schedWorld{t: t, now: now, dir: t.TempDir(), cs: fake.NewClientset(), target: target}
	var err error
	if sw.loc, err = filesystem.New(sw.dir); err != nil {
		t.Fatal(err)
	}
	sw.restart()
	return sw
}

// restart replaces the server by a new one on the same storage and
// cluster, as a restarted pod would be.
func (sw *schedWorld) restart() {
	sw.t.Helper()
	l, err := jobs.New(sw.cs, testNS, config.Agents{Image: "agent:dev"})
	if err != nil {
		sw.t.Fatal(err)
	}
	if err := l.Start(sw.t.Context(), []config.Target{sw.target}); err != nil {
		sw.t.Fatal(err)
	}
	sw.srv, err = New(Config{
		Locations:  []NamedLocation{{Name: "default", Location: sw.loc}},
		Targets:    []config.Target{sw.target},
		Agents:     l,
		Now:        func() time.Time { return sw.now },
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		sw.t.Fatal(err)
	}
	// What watch sets up before its loop; the test runs the rounds.
	if sw.w = sw.srv.newWatcher(); sw.w == nil {
		sw.t.Fatal("watch set up nothing")
	}
}

// at moves the clock to s (RFC 3339) and runs one round.
func (sw *schedWorld) at(s string) {
	sw.t.Helper()
	var err error
	if sw.now, err = time.Parse(time.RFC3339, s); err != nil {
		sw.t.Fatal(err)
	}
	sw.srv.round(context.Background(), sw.w)
}

func (sw *schedWorld) jobs() []batchv1.Job {
	sw.t.Helper()
	list, err := sw.cs.BatchV1().Jobs(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		sw.t.Fatal(err)
	}
	return list.Items
}

func (sw *schedWorld) backupsOfJobs() []string {
	var out []string
	for _, j := range sw.jobs() {
		out = append(out, j.Annotations[jobs.AnnotationBackup])
	}
	slices.Sort(out)
	return out
}

// store puts a backup in storage as an agent of the target would.
func (sw *schedWorld) store(name string, scheduled bool, created time.Time) {
	sw.t.Helper()
	ctx := context.Background()
	up, err := sw.loc.Create(ctx, name)
	if err != nil {
		sw.t.Fatal(err)
	}
	if _, err := up.Write([]byte("data of " + name)); err != nil {
		sw.t.Fatal(err)
	}
	m := &storage.Manifest{Name: name, Size: int64(len("data of " + name)), SHA256: strings.Repeat("0", 64), CreateTime: created,
		Source: storage.Source{Kind: sourceAgent, Target: sw.target.Name}}
	if scheduled {
		m.Labels = map[string]string{LabelScheduled: "true", LabelTarget: sw.target.Name}
	}
	if err := up.Commit(ctx, m); err != nil {
		sw.t.Fatal(err)
	}
}

// finish ends the Job of backup as the Job controller would; a
// successful agent has stored its backup first.
func (sw *schedWorld) finish(backup string, ok bool) {
	sw.t.Helper()
	for _, j := range sw.jobs() {
		if j.Annotations[jobs.AnnotationBackup] != backup {
			continue
		}
		cond := batchv1.JobFailed
		if ok {
			cond = batchv1.JobComplete
			sw.store(backup, j.Labels[jobs.LabelScheduled] == "true", sw.now)
		}
		j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: cond, Status: corev1.ConditionTrue})
		j.Status.CompletionTime = &metav1.Time{Time: sw.now}
		if _, err := sw.cs.BatchV1().Jobs(testNS).UpdateStatus(context.Background(), &j, metav1.UpdateOptions{}); err != nil {
			sw.t.Fatal(err)
		}
		sw.synced()
		return
	}
	sw.t.Fatalf("no job of backup %q", backup)
}

// synced waits until the server's agent caches hold what the test
// changed through the fake clientset.
func (sw *schedWorld) synced() {
	sw.t.Helper()
	if err := sw.srv.agents.Sync(sw.t.Context()); err != nil {
		sw.t.Fatal(err)
	}
}

func (sw *schedWorld) stored() []string {
	sw.t.Helper()
	ms, err := sw.loc.List(context.Background())
	if err != nil {
		sw.t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

func (sw *schedWorld) runs(result string) float64 {
	return testutil.ToFloat64(sw.srv.metrics.runs.WithLabelValues(sw.target.Name, "default", result))
}

func (sw *schedWorld) skipped(reason string) float64 {
	return testutil.ToFloat64(sw.srv.metrics.skipped.WithLabelValues(sw.target.Name, reason))
}

func scheduledTarget5m() config.Target {
	return config.Target{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true, Schedule: "*/5 * * * *"}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %q, want %q", what, got, want)
	}
}

func TestScheduleStartsRunsNamedAndLabelledAtTheirTime(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), mustTime(t, "2026-12-01T10:02:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	equal(t, "jobs on a fresh start (no catching up)", sw.backupsOfJobs(), nil)
	sw.at("2026-12-01T10:04:59Z")
	equal(t, "jobs before the time", sw.backupsOfJobs(), nil)
	sw.at("2026-12-01T10:05:01Z")
	equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
	j := sw.jobs()[0]
	if j.Labels[jobs.LabelScheduled] != "true" {
		t.Errorf("job labels %v: want %s=true", j.Labels, jobs.LabelScheduled)
	}
	for _, want := range []string{"--labels=etcdbackup.io/scheduled=true", "--labels=etcdbackup.io/target=cp", "--name=cp-20261201-100500"} {
		if !slices.Contains(j.Spec.Template.Spec.Containers[0].Args, want) {
			t.Errorf("agent args %q lack %q", j.Spec.Template.Spec.Containers[0].Args, want)
		}
	}
	if p := testutil.ToFloat64(sw.srv.metrics.period.WithLabelValues("cp")); p != 300 {
		t.Errorf("schedule period metric %v, want 300", p)
	}
}

func TestScheduleSkipsARunWhileTheTargetsBackupRuns(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), mustTime(t, "2026-12-01T10:02:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	sw.at("2026-12-01T10:05:00Z")
	sw.at("2026-12-01T10:10:00Z")
	equal(t, "jobs while the first runs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
	if n := sw.skipped(skipRunning); n != 1 {
		t.Errorf("skipped (running) = %v, want 1", n)
	}
	// An on-demand backup of the target counts as running too.
	sw.finish("cp-20261201-100500", true)
	if _, err := sw.srv.CreateBackup(context.Background(), &ebv1.CreateBackupRequest{Target: "cp", Name: "by-hand"}); err != nil {
		t.Fatal(err)
	}
	sw.at("2026-12-01T10:15:00Z")
	equal(t, "jobs while an on-demand one runs", sw.backupsOfJobs(), []string{"by-hand", "cp-20261201-100500"})
	if n := sw.skipped(skipRunning); n != 2 {
		t.Errorf("skipped (running) = %v, want 2", n)
	}
	sw.finish("by-hand", false)
	sw.at("2026-12-01T10:20:00Z")
	equal(t, "jobs once none runs", sw.backupsOfJobs(), []string{"by-hand", "cp-20261201-100500", "cp-20261201-102000"})
	if s, f := sw.runs(resultSucceeded), sw.runs(resultFailed); s != 1 || f != 1 {
		t.Errorf("runs succeeded %v failed %v, want 1 and 1", s, f)
	}
}

func TestScheduleAfterARestart(t *testing.T) {
	t.Run("a run still going is not started again", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), mustTime(t, "2026-12-01T10:02:00Z"))
		sw.at("2026-12-01T10:02:00Z")
		sw.at("2026-12-01T10:05:00Z")
		sw.restart()
		sw.at("2026-12-01T10:06:00Z")
		sw.at("2026-12-01T10:09:00Z")
		equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		sw.at("2026-12-01T10:10:00Z")
		equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		if n := sw.skipped(skipRunning); n != 1 {
			t.Errorf("skipped (running) = %v, want 1", n)
		}
	})
	t.Run("a missed run within startingDeadline runs once, late", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), mustTime(t, "2026-12-01T10:07:00Z"))
		sw.store("cp-20261201-100000", true, mustTime(t, "2026-12-01T10:00:30Z"))
		sw.restart()
		sw.at("2026-12-01T10:07:00Z") // 10:05 was missed; 2 m late < the 5 m period
		equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		sw.at("2026-12-01T10:08:00Z")
		equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		if got := testutil.ToFloat64(sw.srv.metrics.lastSuccess.WithLabelValues("cp", "default")); got != float64(mustTime(t, "2026-12-01T10:00:30Z").Unix()) {
			t.Errorf("last success after restart = %v, want the stored backup's time", got)
		}
	})
	t.Run("several missed runs start only the latest", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), mustTime(t, "2026-12-01T10:00:00Z"))
		sw.store("cp-20261201-090000", true, mustTime(t, "2026-12-01T09:00:30Z"))
		sw.restart()
		sw.at("2026-12-01T10:03:00Z")
		equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100000"})
	})
	t.Run("a run later than startingDeadline is skipped", func(t *testing.T) {
		target := scheduledTarget5m()
		target.StartingDeadline = &metav1.Duration{Duration: time.Minute}
		sw := newSchedWorld(t, target, mustTime(t, "2026-12-01T10:07:00Z"))
		sw.store("cp-20261201-100000", true, mustTime(t, "2026-12-01T10:00:30Z"))
		sw.restart()
		sw.at("2026-12-01T10:07:00Z")
		equal(t, "jobs", sw.backupsOfJobs(), nil)
		if n := sw.skipped(skipMissed); n != 1 {
			t.Errorf("skipped (missed) = %v, want 1", n)
		}
		sw.at("2026-12-01T10:10:00Z")
		equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-101000"})
	})
	t.Run("finished runs are counted once", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), mustTime(t, "2026-12-01T10:02:00Z"))
		sw.at("2026-12-01T10:02:00Z")
		sw.at("2026-12-01T10:05:00Z")
		sw.now = mustTime(t, "2026-12-01T10:06:40Z")
		sw.finish("cp-20261201-100500", true)
		sw.at("2026-12-01T10:07:00Z")
		sw.at("2026-12-01T10:08:00Z")
		if n := sw.runs(resultSucceeded); n != 1 {
			t.Fatalf("runs succeeded = %v, want 1", n)
		}
		if n := testutil.CollectAndCount(sw.srv.metrics.duration); n != 1 {
			t.Errorf("duration series = %d, want 1", n)
		}
		if got := testutil.ToFloat64(sw.srv.metrics.size.WithLabelValues("cp")); got != float64(len("data of cp-20261201-100500")) {
			t.Errorf("size = %v", got)
		}
		sw.restart()
		sw.at("2026-12-01T10:09:00Z")
		if n := sw.runs(resultSucceeded); n != 0 {
			t.Errorf("after a restart, runs succeeded = %v, want 0 (counted before)", n)
		}
		// One that finished while the server was down is counted by the
		// next one.
		sw.at("2026-12-01T10:10:00Z")
		sw.restart()
		sw.finish("cp-20261201-101000", false)
		sw.at("2026-12-01T10:11:00Z")
		if n := sw.runs(resultFailed); n != 1 {
			t.Errorf("runs failed = %v, want 1", n)
		}
	})
}

func TestRetentionAfterAScheduledBackup(t *testing.T) {
	target := scheduledTarget5m()
	target.Retention = &config.Retention{KeepLast: 2}
	sw := newSchedWorld(t, target, mustTime(t, "2026-12-01T10:02:00Z"))
	sw.store("cp-20261201-095000", true, mustTime(t, "2026-12-01T09:50:10Z"))
	sw.store("cp-20261201-100000", true, mustTime(t, "2026-12-01T10:00:10Z"))
	sw.store("by-hand", false, mustTime(t, "2026-12-01T09:20:00Z"))
	sw.restart()
	sw.at("2026-12-01T10:02:00Z")
	sw.at("2026-12-01T10:05:00Z")
	sw.now = mustTime(t, "2026-12-01T10:05:30Z")
	sw.finish("cp-20261201-100500", true)
	sw.at("2026-12-01T10:06:00Z")
	equal(t, "stored", sw.stored(), []string{"by-hand", "cp-20261201-100000", "cp-20261201-100500"})
}

func TestSelectPrunable(t *testing.T) {
	base := mustTime(t, "2026-12-01T00:00:00Z")
	m := func(name string, hoursAgo int, scheduled bool, target string) *storage.Manifest {
		man := &storage.Manifest{Name: name, CreateTime: base.Add(-time.Duration(hoursAgo) * time.Hour), Source: storage.Source{Kind: sourceAgent, Target: target}}
		if scheduled {
			man.Labels = map[string]string{LabelScheduled: "true", LabelTarget: target}
		}
		return man
	}
	all := []*storage.Manifest{
		m("s1", 1, true, "cp"), m("s2", 2, true, "cp"), m("s3", 3, true, "cp"), m("s4", 50, true, "cp"),
		m("d1", 0, false, "cp"), m("d2", 60, false, "cp"),
		m("other", 100, true, "app"),
		{Name: "upload", CreateTime: base.Add(-200 * time.Hour), Source: storage.Source{Kind: sourceUpload}},
	}
	names := func(ms []*storage.Manifest) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		r    config.Retention
		all  bool
		want []string
	}{
		{"keepLast 2: scheduled only", config.Retention{KeepLast: 2}, false, []string{"s3", "s4"}},
		{"keepLast 2 with unscheduled", config.Retention{KeepLast: 2}, true, []string{"s2", "s3", "s4", "d2"}},
		{"maxAge 24h", config.Retention{MaxAge: metav1.Duration{Duration: 24 * time.Hour}}, false, []string{"s4"}},
		{"both: either removes", config.Retention{KeepLast: 3, MaxAge: metav1.Duration{Duration: 150 * time.Minute}}, false, []string{"s3", "s4"}},
		{"never the newest, however old", config.Retention{KeepLast: 1, MaxAge: metav1.Duration{Duration: time.Minute}}, false, []string{"s2", "s3", "s4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			equal(t, "prunable", names(selectPrunable(all, "cp", tc.r, tc.all, base)), tc.want)
		})
	}
	// The newest of a target stays even when every one is past maxAge.
	old := []*storage.Manifest{m("a", 100, true, "cp"), m("b", 200, true, "cp")}
	equal(t, "prunable of old ones", names(selectPrunable(old, "cp", config.Retention{MaxAge: metav1.Duration{Duration: time.Hour}}, false, base)), []string{"b"})
}

func TestPruneBackups(t *testing.T) {
	target := scheduledTarget5m()
	target.Retention = &config.Retention{KeepLast: 1}
	sw := newSchedWorld(t, target, mustTime(t, "2026-12-01T10:00:00Z"))
	for i, n := range []string{"cp-20261201-090000", "cp-20261201-091000", "cp-20261201-092000", "cp-20261201-093000"} {
		sw.store(n, true, mustTime(t, "2026-12-01T09:00:30Z").Add(time.Duration(i)*10*time.Minute))
	}
	sw.store("by-hand", false, mustTime(t, "2026-12-01T08:00:00Z"))
	ctx := context.Background()
	pruned := func(r *ebv1.PruneBackupsResponse) []string {
		var out []string
		for _, b := range r.GetPruned() {
			out = append(out, b.GetName())
		}
		return out
	}

	resp, err := sw.srv.PruneBackups(ctx, &ebv1.PruneBackupsRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "dry run", pruned(resp), []string{"cp-20261201-092000", "cp-20261201-091000", "cp-20261201-090000"})
	equal(t, "stored after a dry run", sw.stored(), []string{"by-hand", "cp-20261201-090000", "cp-20261201-091000", "cp-20261201-092000", "cp-20261201-093000"})

	// One being downloaded, one being restored: both kept.
	done, err := sw.srv.inUse.download("default", "cp-20261201-091000")
	if err != nil {
		t.Fatal(err)
	}
	restore := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "restore-x", Namespace: testNS,
		Labels:      map[string]string{jobs.LabelComponent: jobs.ComponentRestore, jobs.LabelManagedBy: jobs.ManagedBy},
		Annotations: map[string]string{jobs.AnnotationBackup: "cp-20261201-090000", jobs.AnnotationLocation: "default"}}}
	if _, err := sw.cs.BatchV1().Jobs(testNS).Create(ctx, restore, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	resp, err = sw.srv.PruneBackups(ctx, &ebv1.PruneBackupsRequest{Target: "cp"})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "pruned", pruned(resp), []string{"cp-20261201-092000"})
	var inUse []string
	for _, b := range resp.GetInUse() {
		inUse = append(inUse, b.GetName())
	}
	equal(t, "in use", inUse, []string{"cp-20261201-091000", "cp-20261201-090000"})
	done()
	equal(t, "stored", sw.stored(), []string{"by-hand", "cp-20261201-090000", "cp-20261201-091000", "cp-20261201-093000"})

	// --all takes the unscheduled one too; the newest stays.
	if err := sw.cs.BatchV1().Jobs(testNS).Delete(ctx, "restore-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	if _, err := sw.srv.PruneBackups(ctx, &ebv1.PruneBackupsRequest{Target: "cp", IncludeUnscheduled: true}); err != nil {
		t.Fatal(err)
	}
	equal(t, "stored after --all", sw.stored(), []string{"cp-20261201-093000"})
	if n := testutil.ToFloat64(sw.srv.metrics.pruned.WithLabelValues("cp", "default")); n != 4 {
		t.Errorf("pruned metric %v, want 4", n)
	}
}

func TestPruneBackupsRefusesATargetWithoutRetention(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), mustTime(t, "2026-12-01T10:00:00Z"))
	_, err := sw.srv.PruneBackups(context.Background(), &ebv1.PruneBackupsRequest{Target: "cp"})
	if err == nil || !strings.Contains(err.Error(), "no retention") {
		t.Fatalf("prune of a target without retention: %v", err)
	}
}
