package rpc_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

const testNS = "etcdbackup-system"

// pruneWorld is the handlers over one filesystem location, a fake
// cluster and a clock the test moves, with the metrics and the in-use
// registry they were given.
type pruneWorld struct {
	t       *testing.T
	now     time.Time
	dir     string
	cs      *fake.Clientset
	loc     storage.Location
	target  config.Target
	srv     *rpc.Service
	metrics *metrics.Metrics
	inUse   *retention.InUse
	agents  *jobs.Launcher
}

func newPruneWorld(t *testing.T, target config.Target, now time.Time) *pruneWorld {
	t.Helper()
	sw := &pruneWorld{t: t, now: now, dir: t.TempDir(), cs: fake.NewClientset(), target: target}
	var err error
	if sw.loc, err = filesystem.New(sw.dir); err != nil {
		t.Fatal(err)
	}
	l, err := jobs.New(sw.cs, testNS, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(t.Context(), []config.Target{sw.target}); err != nil {
		t.Fatal(err)
	}
	sw.agents = l
	if sw.metrics, err = metrics.New(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	targets := []config.Target{sw.target}
	clock := func() time.Time { return sw.now }
	sw.inUse = retention.NewInUse(l, targets, nil)
	sw.srv = rpc.New(rpc.Config{
		Locations: oneLocation(t, sw.loc, sw.metrics), Targets: targets, Agents: l, Now: clock, Metrics: sw.metrics,
		Limits: config.Limits{}.WithDefaults(), InUse: sw.inUse,
		Pruner: &retention.Pruner{InUse: sw.inUse, Metrics: sw.metrics, Log: slog.New(slog.DiscardHandler), Now: clock},
	})
	return sw
}

// synced waits until the server's agent caches hold what the test
// changed through the fake clientset.
func (sw *pruneWorld) synced() {
	sw.t.Helper()
	if err := sw.agents.Sync(sw.t.Context()); err != nil {
		sw.t.Fatal(err)
	}
}

// store puts a backup in storage as an agent of the target would.
func (sw *pruneWorld) store(name string, scheduled bool, created time.Time) {
	sw.t.Helper()
	backuptest.Store(sw.t, sw.loc, sw.target.Name, name, scheduled, created)
}

func (sw *pruneWorld) stored() []string {
	sw.t.Helper()
	return backuptest.Names(sw.t, sw.loc)
}

func scheduledTarget5m() config.Target {
	return config.Target{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true, Schedule: "*/5 * * * *"}
}

func TestPruneBackups(t *testing.T) {
	target := scheduledTarget5m()
	target.Retention = &config.Retention{KeepLast: 1}
	sw := newPruneWorld(t, target, backuptest.MustTime(t, "2026-12-01T10:00:00Z"))
	for i, n := range []string{"cp-20261201-090000", "cp-20261201-091000", "cp-20261201-092000", "cp-20261201-093000"} {
		sw.store(n, true, backuptest.MustTime(t, "2026-12-01T09:00:30Z").Add(time.Duration(i)*10*time.Minute))
	}
	sw.store("by-hand", false, backuptest.MustTime(t, "2026-12-01T08:00:00Z"))
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
	backuptest.Equal(t, "dry run", pruned(resp), []string{"cp-20261201-092000", "cp-20261201-091000", "cp-20261201-090000"})
	backuptest.Equal(t, "stored after a dry run", sw.stored(), []string{"by-hand", "cp-20261201-090000", "cp-20261201-091000", "cp-20261201-092000", "cp-20261201-093000"})

	// One being downloaded, one being restored: both kept.
	done, err := sw.inUse.Download(t.Context(), "default", "cp-20261201-091000")
	if err != nil {
		t.Fatal(err)
	}
	restore := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "restore-x", Namespace: testNS,
		Labels:      map[string]string{jobs.LabelComponent: jobs.ComponentRestore, jobs.LabelManagedBy: jobs.ManagedBy},
		Annotations: map[string]string{jobs.AnnotationBackup: "cp-20261201-090000", jobs.AnnotationLocation: "default"}}}
	// Signed as the server signs its own: only those hold a backup.
	restore.Annotations[jobs.AnnotationSignature] = sw.agents.Signer().Sign(jobs.ClaimsOf(restore))
	if _, err := sw.cs.BatchV1().Jobs(testNS).Create(ctx, restore, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	resp, err = sw.srv.PruneBackups(ctx, &ebv1.PruneBackupsRequest{Target: "cp"})
	if err != nil {
		t.Fatal(err)
	}
	backuptest.Equal(t, "pruned", pruned(resp), []string{"cp-20261201-092000"})
	var inUse []string
	for _, b := range resp.GetInUse() {
		inUse = append(inUse, b.GetName())
	}
	backuptest.Equal(t, "in use", inUse, []string{"cp-20261201-091000", "cp-20261201-090000"})
	done()
	backuptest.Equal(t, "stored", sw.stored(), []string{"by-hand", "cp-20261201-090000", "cp-20261201-091000", "cp-20261201-093000"})

	// --all takes the unscheduled one too; the newest stays.
	if err := sw.cs.BatchV1().Jobs(testNS).Delete(ctx, "restore-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sw.synced()
	if _, err := sw.srv.PruneBackups(ctx, &ebv1.PruneBackupsRequest{Target: "cp", IncludeUnscheduled: true}); err != nil {
		t.Fatal(err)
	}
	backuptest.Equal(t, "stored after --all", sw.stored(), []string{"cp-20261201-093000"})
	if n := testutil.ToFloat64(sw.metrics.Pruned.WithLabelValues("cp", "default")); n != 4 {
		t.Errorf("pruned metric %v, want 4", n)
	}
}

func TestPruneBackupsRefusesATargetWithoutRetention(t *testing.T) {
	sw := newPruneWorld(t, scheduledTarget5m(), backuptest.MustTime(t, "2026-12-01T10:00:00Z"))
	_, err := sw.srv.PruneBackups(context.Background(), &ebv1.PruneBackupsRequest{Target: "cp"})
	if err == nil || !strings.Contains(err.Error(), "no retention") {
		t.Fatalf("prune of a target without retention: %v", err)
	}
}
