package controller

import (
	"context"
	"log/slog"
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
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

const (
	testNS    = "etcdbackup-system"
	serverPod = "etcdbackup-server-0"
)

// schedWorld is a server with one filesystem location, a fake cluster and
// a clock the test moves; rounds of the scheduler are run by hand.
type schedWorld struct {
	t       *testing.T
	now     time.Time
	dir     string
	cs      *fake.Clientset
	loc     storage.Location
	target  config.Target
	srv     *rpc.Service // the handlers, sharing the controller's work.Starter
	c       *Controller
	metrics *metrics.Metrics
	agents  *jobs.Launcher
	w       *watcher
}

func newSchedWorld(t *testing.T, target config.Target, now time.Time) *schedWorld {
	t.Helper()
	sw := &schedWorld{t: t, now: now, dir: t.TempDir(), cs: fake.NewClientset(), target: target}
	if d := target.Drill; d != nil && d.IdentitySecret != "" {
		// The drill's identity Secret, as the user created it.
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: d.IdentitySecret},
			Data: map[string][]byte{"identity.txt": []byte("AGE-SECRET-KEY-1QQQQ\n")}}
		if _, err := sw.cs.CoreV1().Secrets(testNS).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if sw.loc, err = filesystem.New(sw.dir); err != nil {
		t.Fatal(err)
	}
	sw.restart()
	return sw
}

// restart replaces the server by a new one on the same storage and
// cluster, as a restarted pod would be: the handlers and the controller
// wired as server.New wires them.
func (sw *schedWorld) restart() {
	sw.t.Helper()
	l, err := jobs.New(sw.cs, testNS, config.Agents{Image: "agent:dev"})
	if err != nil {
		sw.t.Fatal(err)
	}
	l.SetServerPod(serverPod)
	if err := l.LoadSigningKey(sw.t.Context()); err != nil {
		sw.t.Fatal(err)
	}
	if err := l.Start(sw.t.Context(), []config.Target{sw.target}); err != nil {
		sw.t.Fatal(err)
	}
	sw.agents = l
	if sw.metrics, err = metrics.New(prometheus.NewRegistry()); err != nil {
		sw.t.Fatal(err)
	}
	locs, err := domain.NewLocations([]locations.Named{{Name: "default", Location: sw.loc}}, sw.metrics)
	if err != nil {
		sw.t.Fatal(err)
	}
	targets := []config.Target{sw.target}
	now := func() time.Time { return sw.now }
	inUse := retention.NewInUse(l, targets, nil)
	pruner := &retention.Pruner{InUse: inUse, Metrics: sw.metrics, Log: slog.New(slog.DiscardHandler), Now: now}
	starter := work.New(locs, targets, l, nil, now)
	sw.srv = rpc.New(rpc.Config{Locations: locs, Targets: targets, Agents: l, Work: starter, Now: now, Metrics: sw.metrics,
		Limits: config.Limits{}.WithDefaults(), InUse: inUse, Pruner: pruner})
	sw.c = New(Config{Locations: locs, Targets: targets, Agents: l, Metrics: sw.metrics, Pruner: pruner, Work: starter, Now: now})
	// What Run sets up before its loop; the test runs the rounds.
	if sw.w = sw.c.newWatcher(); sw.w == nil {
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
	sw.c.round(context.Background(), sw.w)
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
	backuptest.Store(sw.t, sw.loc, sw.target.Name, name, scheduled, created)
}

// finish ends the Job of backup as the Job controller would; a
// successful agent has stored its backup first.
func (sw *schedWorld) finish(backup string, ok bool) {
	sw.t.Helper()
	sw.finishJob(backup, ok, ok)
}

// finishJob ends the Job of backup, storing its backup first if store.
func (sw *schedWorld) finishJob(backup string, ok, store bool) {
	sw.t.Helper()
	for _, j := range sw.jobs() {
		if j.Annotations[jobs.AnnotationBackup] != backup {
			continue
		}
		cond := batchv1.JobFailed
		if ok {
			cond = batchv1.JobComplete
		}
		if store {
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
	if err := sw.agents.Sync(sw.t.Context()); err != nil {
		sw.t.Fatal(err)
	}
}

func (sw *schedWorld) stored() []string {
	sw.t.Helper()
	return backuptest.Names(sw.t, sw.loc)
}

func (sw *schedWorld) runs(result string) float64 {
	return testutil.ToFloat64(sw.metrics.Runs.WithLabelValues(sw.target.Name, "default", result))
}

func (sw *schedWorld) skipped(reason string) float64 {
	return testutil.ToFloat64(sw.metrics.Skipped.WithLabelValues(sw.target.Name, reason))
}

func scheduledTarget5m() config.Target {
	return config.Target{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true, Schedule: "*/5 * * * *"}
}

func TestScheduleStartsRunsNamedAndLabelledAtTheirTime(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	backuptest.Equal(t, "jobs on a fresh start (no catching up)", sw.backupsOfJobs(), nil)
	sw.at("2026-12-01T10:04:59Z")
	backuptest.Equal(t, "jobs before the time", sw.backupsOfJobs(), nil)
	sw.at("2026-12-01T10:05:01Z")
	backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
	j := sw.jobs()[0]
	if j.Labels[jobs.LabelScheduled] != "true" {
		t.Errorf("job labels %v: want %s=true", j.Labels, jobs.LabelScheduled)
	}
	if !slices.Contains(j.Spec.Template.Spec.Containers[0].Args, "--name=cp-20261201-100500") {
		t.Errorf("agent args %q lack the scheduled name", j.Spec.Template.Spec.Containers[0].Args)
	}
	// The agent sends no etcdbackup.io labels: the server writes what
	// the signed Job says into the manifest.
	for _, a := range j.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--labels=etcdbackup.io/") {
			t.Errorf("agent arg %q: the server's labels are not the agent's to send", a)
		}
	}
	if p := testutil.ToFloat64(sw.metrics.Period.WithLabelValues("cp")); p != 300 {
		t.Errorf("schedule period metric %v, want 300", p)
	}
}

func TestScheduleSkipsARunWhileTheTargetsBackupRuns(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	sw.at("2026-12-01T10:05:00Z")
	sw.at("2026-12-01T10:10:00Z")
	backuptest.Equal(t, "jobs while the first runs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
	if n := sw.skipped(metrics.SkipRunning); n != 1 {
		t.Errorf("skipped (running) = %v, want 1", n)
	}
	// An on-demand backup of the target counts as running too.
	sw.finish("cp-20261201-100500", true)
	if _, err := sw.srv.CreateBackup(context.Background(), &ebv1.CreateBackupRequest{Target: "cp", Name: "by-hand"}); err != nil {
		t.Fatal(err)
	}
	sw.at("2026-12-01T10:15:00Z")
	backuptest.Equal(t, "jobs while an on-demand one runs", sw.backupsOfJobs(), []string{"by-hand", "cp-20261201-100500"})
	if n := sw.skipped(metrics.SkipRunning); n != 2 {
		t.Errorf("skipped (running) = %v, want 2", n)
	}
	sw.finish("by-hand", false)
	sw.at("2026-12-01T10:20:00Z")
	backuptest.Equal(t, "jobs once none runs", sw.backupsOfJobs(), []string{"by-hand", "cp-20261201-100500", "cp-20261201-102000"})
	if s, f := sw.runs(metrics.ResultSucceeded), sw.runs(metrics.ResultFailed); s != 1 || f != 1 {
		t.Errorf("runs succeeded %v failed %v, want 1 and 1", s, f)
	}
}

func TestScheduleAfterARestart(t *testing.T) {
	t.Run("a run still going is not started again", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
		sw.at("2026-12-01T10:02:00Z")
		sw.at("2026-12-01T10:05:00Z")
		sw.restart()
		sw.at("2026-12-01T10:06:00Z")
		sw.at("2026-12-01T10:09:00Z")
		backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		sw.at("2026-12-01T10:10:00Z")
		backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		if n := sw.skipped(metrics.SkipRunning); n != 1 {
			t.Errorf("skipped (running) = %v, want 1", n)
		}
	})
	t.Run("a missed run within startingDeadline runs once, late", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:07:00Z"))
		sw.store("cp-20261201-100000", true, backuptest.MustTime(t, "2026-12-01T10:00:30Z"))
		sw.restart()
		sw.at("2026-12-01T10:07:00Z") // 10:05 was missed; 2 m late < the 5 m period
		backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		sw.at("2026-12-01T10:08:00Z")
		backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
		if got := testutil.ToFloat64(sw.metrics.LastSuccess.WithLabelValues("cp", "default")); got != float64(backuptest.MustTime(t, "2026-12-01T10:00:30Z").Unix()) {
			t.Errorf("last success after restart = %v, want the stored backup's time", got)
		}
	})
	t.Run("several missed runs start only the latest", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:00:00Z"))
		sw.store("cp-20261201-090000", true, backuptest.MustTime(t, "2026-12-01T09:00:30Z"))
		sw.restart()
		sw.at("2026-12-01T10:03:00Z")
		backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100000"})
	})
	t.Run("a run later than startingDeadline is skipped", func(t *testing.T) {
		target := scheduledTarget5m()
		target.StartingDeadline = &metav1.Duration{Duration: time.Minute}
		sw := newSchedWorld(t, target, backuptest.MustTime(t, "2026-12-01T10:07:00Z"))
		sw.store("cp-20261201-100000", true, backuptest.MustTime(t, "2026-12-01T10:00:30Z"))
		sw.restart()
		sw.at("2026-12-01T10:07:00Z")
		backuptest.Equal(t, "jobs", sw.backupsOfJobs(), nil)
		if n := sw.skipped(metrics.SkipMissed); n != 1 {
			t.Errorf("skipped (missed) = %v, want 1", n)
		}
		sw.at("2026-12-01T10:10:00Z")
		backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-101000"})
	})
	t.Run("finished runs are counted once", func(t *testing.T) {
		sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
		sw.at("2026-12-01T10:02:00Z")
		sw.at("2026-12-01T10:05:00Z")
		sw.now = backuptest.MustTime(t, "2026-12-01T10:06:40Z")
		sw.finish("cp-20261201-100500", true)
		sw.at("2026-12-01T10:07:00Z")
		sw.at("2026-12-01T10:08:00Z")
		if n := sw.runs(metrics.ResultSucceeded); n != 1 {
			t.Fatalf("runs succeeded = %v, want 1", n)
		}
		if n := testutil.CollectAndCount(sw.metrics.Duration); n != 1 {
			t.Errorf("duration series = %d, want 1", n)
		}
		if got := testutil.ToFloat64(sw.metrics.Size.WithLabelValues("cp")); got != float64(len("data of cp-20261201-100500")) {
			t.Errorf("size = %v", got)
		}
		sw.restart()
		sw.at("2026-12-01T10:09:00Z")
		if n := sw.runs(metrics.ResultSucceeded); n != 0 {
			t.Errorf("after a restart, runs succeeded = %v, want 0 (counted before)", n)
		}
		// One that finished while the server was down is counted by the
		// next one.
		sw.at("2026-12-01T10:10:00Z")
		sw.restart()
		sw.finish("cp-20261201-101000", false)
		sw.at("2026-12-01T10:11:00Z")
		if n := sw.runs(metrics.ResultFailed); n != 1 {
			t.Errorf("runs failed = %v, want 1", n)
		}
	})
}

func TestRetentionAfterAScheduledBackup(t *testing.T) {
	target := scheduledTarget5m()
	target.Retention = &config.Retention{KeepLast: 2}
	sw := newSchedWorld(t, target, backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.store("cp-20261201-095000", true, backuptest.MustTime(t, "2026-12-01T09:50:10Z"))
	sw.store("cp-20261201-100000", true, backuptest.MustTime(t, "2026-12-01T10:00:10Z"))
	sw.store("by-hand", false, backuptest.MustTime(t, "2026-12-01T09:20:00Z"))
	sw.restart()
	sw.at("2026-12-01T10:02:00Z")
	sw.at("2026-12-01T10:05:00Z")
	sw.now = backuptest.MustTime(t, "2026-12-01T10:05:30Z")
	sw.finish("cp-20261201-100500", true)
	sw.at("2026-12-01T10:06:00Z")
	backuptest.Equal(t, "stored", sw.stored(), []string{"by-hand", "cp-20261201-100000", "cp-20261201-100500"})
}

// A backup whose scheduled time lies ahead of now — an upload named so
// before uploads could not pass for scheduled ones, or a wrong clock —
// is not the last run: the schedule does not pass over the runs until
// then.
func TestScheduleIgnoresScheduledTimesInTheFuture(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:07:00Z"))
	sw.store("cp-20261201-100000", true, backuptest.MustTime(t, "2026-12-01T10:00:30Z"))
	sw.store("cp-20271231-235500", true, backuptest.MustTime(t, "2026-12-01T10:01:00Z"))
	sw.restart()
	sw.at("2026-12-01T10:07:00Z")
	backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500"})
}

// A scheduled run whose name another backup holds (an upload stored
// before such names were refused) still backs up, under an alternative
// name, and says so where it can be seen — the name-taken counter, an
// Event on the server's pod; the next run goes on under its own name
// (issue 37 #5).
func TestScheduledRunWhoseNameIsTakenStillBacksUp(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	// Someone uploaded under the next run's name.
	backuptest.Put(t, sw.loc, &storage.Manifest{Name: "cp-20261201-100500", SHA256: strings.Repeat("0", 64),
		CreateTime: sw.now, Source: storage.Source{Kind: ebv1.SourceUpload}}, []byte("someone else's"))
	sw.at("2026-12-01T10:05:00Z")
	backuptest.Equal(t, "jobs", sw.backupsOfJobs(), []string{"cp-20261201-100500-2"})
	if n := sw.skipped(metrics.SkipNameTaken); n != 1 {
		t.Errorf("skipped (name-taken) = %v, want 1", n)
	}
	if n := sw.runs(metrics.ResultFailed); n != 0 {
		t.Errorf("runs failed = %v, want 0", n)
	}
	events, err := sw.cs.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range events.Items {
		if e.Reason == EventNameTaken && e.Type == corev1.EventTypeWarning && e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == serverPod &&
			strings.Contains(e.Message, `"cp-20261201-100500"`) && strings.Contains(e.Message, `stored as "cp-20261201-100500-2"`) {
			found = true
		}
	}
	if !found {
		t.Errorf("no %s Event about pod %s naming the backup and where the run went: %+v", EventNameTaken, serverPod, events.Items)
	}
	// The upload is left as it was; the run is stored beside it, as a
	// scheduled backup due at 10:05.
	backuptest.Equal(t, "stored", sw.stored(), []string{"cp-20261201-100500"})
	sw.at("2026-12-01T10:06:00Z")
	sw.finish("cp-20261201-100500-2", true)
	backuptest.Equal(t, "stored", sw.stored(), []string{"cp-20261201-100500", "cp-20261201-100500-2"})
	if m, err := sw.loc.Stat(context.Background(), "cp-20261201-100500-2"); err != nil || !m.Source.ScheduledTime.Equal(backuptest.MustTime(t, "2026-12-01T10:05:00Z")) {
		t.Errorf("the run stored under another name: %+v, %v; want scheduled at 10:05", m, err)
	}

	sw.at("2026-12-01T10:10:00Z")
	backuptest.Equal(t, "jobs of the next run", sw.backupsOfJobs(), []string{"cp-20261201-100500-2", "cp-20261201-101000"})
	if n := sw.skipped(metrics.SkipNameTaken); n != 1 {
		t.Errorf("skipped (name-taken) after the next run = %v, want 1", n)
	}
}

// A name held by this schedule's own backup (an earlier server stored
// it) is no failure.
func TestScheduledRunStoredByAnEarlierServerIsNoFailure(t *testing.T) {
	sw := newSchedWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:02:00Z"))
	sw.at("2026-12-01T10:02:00Z")
	sw.store("cp-20261201-100500", true, backuptest.MustTime(t, "2026-12-01T10:04:00Z"))
	sw.at("2026-12-01T10:05:00Z")
	if n, f := sw.skipped(metrics.SkipNameTaken), sw.runs(metrics.ResultFailed); n != 0 || f != 0 {
		t.Errorf("skipped (name-taken) %v, failed %v: want 0 and 0", n, f)
	}
}
