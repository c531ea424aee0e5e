package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/controller"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/leader"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// Scheduled backups on the installed product with two replicas (the HA
// layout), two targets side by side:
//
//   - sched: a quiet etcd, every minute, retention keepLast 2. The leading
//     replica is killed just before a run, twice: over five minutes every
//     minute still has exactly one run, and it succeeds. Two scheduled
//     backups stay, the leader's metrics port shows the last-success
//     time, and `prune --dry-run` has nothing to remove.
//   - slow: an etcd behind a proxy sending 8 KiB/s, every minute: its one
//     backup takes minutes, so the runs due meanwhile are skipped and
//     counted, and never two of its Jobs run at once.
func TestSchedule(t *testing.T) {
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}

	quiet := newMembers(t, 1)
	startMembers(t, quiet)
	qc := etcdClient(t, quiet)
	for i := range 20 {
		put(t, qc, fmt.Sprintf("/quiet/%03d", i), strings.Repeat("q", 100))
	}
	slow := newMembers(t, 1)
	startMembers(t, slow)
	sc := etcdClient(t, slow)
	// ≈ 1.5 MB of values: at 8 KiB/s its snapshot takes over three minutes.
	for i := range 1500 {
		put(t, sc, fmt.Sprintf("/slow/%04d", i), strings.Repeat("s", 1000))
	}
	proxy := startSlowProxy(t, slow[0].clientURL.Host, 8<<10)

	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	// Two replicas (the HA layout): one leads the controller; every
	// replica serves.
	product, err := world.InstallProductWith(ctx, sb, k, t.TempDir(), &testLog{t: t, prefix: "install: "}, world.ProductOptions{
		Images: im, HA: true,
		PlainTargets: []world.PlainTarget{
			{Name: "sched", Addr: quiet[0].clientURL.Host, Schedule: "* * * * *", KeepLast: 2, Drill: "* * * * *"},
			{Name: "slow", Addr: proxy, Schedule: "* * * * *"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	installed := time.Now()

	// Every backup Job from the start: how many of the slow target ran at
	// once, and which runs of sched there were.
	jobs := watchBackupJobs(ctx, t, c)
	// Five runs of sched, the first at the next whole minute; the leader
	// is killed (no grace: its Lease must lapse) 15 s before the second
	// and before the third.
	first := installed.Truncate(time.Minute).Add(time.Minute)
	var runs []time.Time
	for i := range 5 {
		runs = append(runs, first.Add(time.Duration(i)*time.Minute))
	}
	for _, run := range runs[1:3] {
		sleepUntil(ctx, t, run.Add(-15*time.Second))
		t.Logf("killed the leading replica %s 15 s before the run of %s", killLeader(ctx, t, c), run.Format("15:04"))
	}

	t.Run("one-run-a-minute-across-leader-kills", func(t *testing.T) {
		last := schedule.Name("sched", runs[len(runs)-1])
		waitFor(ctx, t, time.Until(runs[len(runs)-1])+90*time.Second, "the run of "+last+" to finish", func() bool {
			j, ok := jobs.of("sched")[last]
			return ok && len(j) > 0 && jobFinished(&j[0])
		})
		byName := jobs.of("sched")
		for _, run := range runs {
			name := schedule.Name("sched", run)
			switch j := byName[name]; {
			case len(j) != 1:
				t.Errorf("scheduled run %s: %d Jobs, want exactly one", name, len(j))
			case !jobSucceeded(&j[0]):
				t.Errorf("scheduled run %s: Job %s did not succeed: %+v", name, j[0].Name, j[0].Status.Conditions)
			default:
				t.Logf("scheduled run %s: Job created %v after its time", name, j[0].CreationTimestamp.Sub(run))
			}
		}
		for name, j := range byName {
			if len(j) != 1 {
				t.Errorf("backup %s was started by %d Jobs", name, len(j))
			}
		}
		ev, err := c.sb.Client().CoreV1().Events(world.DefaultNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + controller.EventNameTaken})
		if err != nil || len(ev.Items) != 0 {
			t.Errorf("scheduled runs that found their name taken (a second replica ran them?): %v, %v", ev, err)
		}
	})

	// The leader's counters: the replica leading now.
	metrics := portForwardMetrics(ctx, t, k, "pod/"+leaderPod(ctx, t, c))
	overlap := func() (int, int) { return jobs.concurrent("slow") }

	t.Run("scheduled-drill", func(t *testing.T) {
		// The per-minute drill proves the newest backup restores.
		pollUntil(ctx, t, "a scheduled backup of sched verified by a drill", func() bool {
			r := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "-l", "etcdbackup.io/target=sched",
				"-o", `jsonpath={range .items[?(@.status.verification.result=="Succeeded")]}{.metadata.name}{"\n"}{end}`), "list")
			return strings.TrimSpace(r.Stdout) != ""
		})
		if v, ok := metricValue(t, metrics, `etcdbackup_drill_runs_total{result="succeeded",target="sched"}`); !ok || v < 1 {
			t.Errorf("succeeded drills of sched: %v (present %v)", v, ok)
		}
	})

	t.Run("keepLast-2", func(t *testing.T) {
		var names []string
		// Retention runs right after the run is counted: allow it a round.
		// keepLast 2 keeps the two newest, and the newest verified one
		// when it is older (a drill of the newest may not have ended).
		pollUntil(ctx, t, "two scheduled backups of sched, and at most the newest verified one besides", func() bool {
			r := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "-l", "etcdbackup.io/scheduled=true,etcdbackup.io/target=sched",
				"-o", `jsonpath={range .items[?(@.status.phase=="Completed")]}{.metadata.name} {.status.verification.result}{"\n"}{end}`), "list")
			names = nil
			var beyond []string
			for i, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
				f := strings.Fields(l)
				if len(f) == 0 {
					continue
				}
				names = append(names, f[0])
				if i >= 2 {
					beyond = append(beyond, l)
				}
			}
			return len(names) >= 2 && (len(beyond) == 0 || (len(beyond) == 1 && strings.HasSuffix(beyond[0], " Succeeded")))
		})
		for _, n := range names {
			if !regexp.MustCompile(`^sched-\d{8}-\d{4}00$`).MatchString(n) {
				t.Errorf("scheduled backup %q is not named TARGET-YYYYMMDD-HHMMSS at a whole minute", n)
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		v, ok := metricValue(t, metrics, `etcdbackup_last_successful_backup_timestamp_seconds{location="default",target="sched"}`)
		if !ok || time.Since(time.Unix(int64(v), 0)) > 2*time.Minute {
			t.Errorf("last successful backup of sched: %v (present %v), want within the last two minutes", v, ok)
		}
		if v, ok := metricValue(t, metrics, `etcdbackup_backup_schedule_period_seconds{target="sched"}`); !ok || v != 60 {
			t.Errorf("schedule period of sched: %v (present %v), want 60", v, ok)
		}
	})

	t.Run("prune-dry-run", func(t *testing.T) {
		before := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "-o", "name"), "list")
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "prune", "--dry-run"), "prune --dry-run")
		// The plan names every scheduled backup of sched, each kept by
		// a rule, none removed.
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if !strings.Contains(r.Stderr, "Dry run: no backups would be removed.") || len(lines) < 2 || !strings.HasPrefix(lines[0], "NAME") {
			t.Errorf("prune --dry-run: %s", r)
		}
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) < 5 || f[3] != "keep" || !strings.HasPrefix(f[0], "sched-") {
				t.Errorf("prune --dry-run plans %q, want sched's backups kept by a rule", l)
			}
		}
		after := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "-o", "name"), "list")
		// Only runs that finished in between may add backups.
		for _, n := range strings.Fields(before.Stdout) {
			if !strings.Contains(after.Stdout, n) && !strings.HasPrefix(n, "backup/sched-") {
				t.Errorf("prune --dry-run removed %s", n)
			}
		}
	})

	t.Run("no-overlap", func(t *testing.T) {
		most, seen := overlap()
		if seen == 0 {
			t.Fatal("no Job of the slow target ran")
		}
		if most != 1 {
			t.Errorf("%d Jobs of the slow target ran at once", most)
		}
		v, ok := metricValue(t, metrics, `etcdbackup_scheduled_runs_skipped_total{reason="running",target="slow"}`)
		t.Logf("slow target: %d Job(s), at most %d at once, %v run(s) skipped while one ran", seen, most, v)
		if !ok || v < 1 {
			t.Errorf("skipped runs of slow: %v (present %v), want at least 1:\n%s", v, ok, grepMetrics(t, metrics, "etcdbackup_scheduled_runs_skipped_total"))
		}
	})
}

// startSlowProxy forwards connections to target, sending what target
// answers at bytesPerSecond; it returns its address.
func startSlowProxy(t *testing.T, target string, bytesPerSecond int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(out, in); out.Close() })
			wg.Go(func() {
				defer in.Close()
				buf := make([]byte, 1024)
				for {
					n, err := out.Read(buf)
					if n > 0 {
						if _, werr := in.Write(buf[:n]); werr != nil {
							return
						}
						time.Sleep(time.Duration(n) * time.Second / time.Duration(bytesPerSecond))
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// jobWatch records, polling every second until the test ends, every
// backup Job it saw (its last state) and how many of each target's ran
// at once.
type jobWatch struct {
	mu   sync.Mutex
	most map[string]int
	jobs map[string]batchv1.Job // by Job name
}

func watchBackupJobs(ctx context.Context, t *testing.T, c *cluster) *jobWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &jobWatch{most: map[string]int{}, jobs: map[string]batchv1.Job{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			list, err := c.sb.Client().BatchV1().Jobs(world.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=backup-agent"})
			if err == nil {
				running := map[string]int{}
				w.mu.Lock()
				for _, j := range list.Items {
					w.jobs[j.Name] = j
					if !jobFinished(&j) {
						running[j.Annotations["etcdbackup.io/target"]]++
					}
				}
				for target, n := range running {
					w.most[target] = max(w.most[target], n)
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

// concurrent is the most Jobs of target that ran at once, and how many
// there were.
func (w *jobWatch) concurrent(target string) (most, seen int) {
	return w.most[target], len(w.of(target))
}

// of is target's Jobs by the backup each makes.
func (w *jobWatch) of(target string) map[string][]batchv1.Job {
	w.mu.Lock()
	defer w.mu.Unlock()
	by := map[string][]batchv1.Job{}
	for _, j := range w.jobs {
		if j.Annotations["etcdbackup.io/target"] == target {
			by[j.Annotations["etcdbackup.io/backup"]] = append(by[j.Annotations["etcdbackup.io/backup"]], j)
		}
	}
	return by
}

// leaderPod is the pod of the replica holding the controller's Lease
// (its identity is POD_RANDOM).
func leaderPod(ctx context.Context, t *testing.T, c *cluster) string {
	t.Helper()
	var pod string
	waitFor(ctx, t, time.Minute, "a replica leading", func() bool {
		l, err := c.sb.Client().CoordinationV1().Leases(world.DefaultNamespace).Get(ctx, leader.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil ||
			time.Since(l.Spec.RenewTime.Time) > time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second {
			return false
		}
		pod, _, _ = strings.Cut(*l.Spec.HolderIdentity, "_")
		return pod != ""
	})
	return pod
}

// killLeader deletes the leading replica's pod with no grace period, as
// a node's sudden death would end it, and returns its name.
func killLeader(ctx context.Context, t *testing.T, c *cluster) string {
	t.Helper()
	pod := leaderPod(ctx, t, c)
	if err := c.sb.Client().CoreV1().Pods(world.DefaultNamespace).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatalf("kill the leading replica %s: %v", pod, err)
	}
	return pod
}

// sleepUntil waits until the clock reads at.
func sleepUntil(ctx context.Context, t *testing.T, at time.Time) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(time.Until(at)):
	}
}

func jobSucceeded(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && c.Type == batchv1.JobComplete {
			return true
		}
	}
	return false
}

func jobFinished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
			return true
		}
	}
	return false
}

// portForwardMetrics forwards a local port to the metrics port of the
// server (deployment/etcdbackup-server, or a replica: pod/NAME) with the
// real kubectl and returns the URL of its /metrics.
func portForwardMetrics(ctx context.Context, t *testing.T, k *world.Kubectl, target string) string {
	t.Helper()
	return "http://" + portForward(ctx, t, k, world.DefaultNamespace, target, 9090) + "/metrics"
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}

// metricValue is the value of one series, written as the exposition
// format does (labels sorted by name).
func metricValue(t *testing.T, url, series string) (float64, bool) {
	t.Helper()
	for _, line := range strings.Split(scrape(t, url), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

func grepMetrics(t *testing.T, url, prefix string) string {
	var out []string
	for _, line := range strings.Split(scrape(t, url), "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
