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

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// Scheduled backups on the installed product, two targets side by side:
//
//   - sched: a quiet etcd, every minute, retention keepLast 2. At least
//     three runs succeed, two scheduled backups stay, the metrics port
//     shows the success counter and the last-success time, and
//     `prune --dry-run` has nothing to remove.
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

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	product, err := world.InstallProduct(ctx, sb, k, im, t.TempDir(), &testLog{t: t, prefix: "install: "},
		world.PlainTarget{Name: "sched", Addr: quiet[0].clientURL.Host, Schedule: "* * * * *", KeepLast: 2, Drill: "* * * * *"},
		world.PlainTarget{Name: "slow", Addr: proxy, Schedule: "* * * * *"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)

	// Watch the slow target's Jobs from the start: how many ran at once.
	overlap := watchConcurrentJobs(ctx, t, c, "slow")
	metrics := portForwardMetrics(ctx, t, k)

	succeeded := `etcdbackup_backup_runs_total{location="default",result="succeeded",target="sched"}`
	installed := time.Now()
	deadline := installed.Add(5 * time.Minute)
	for {
		if v, ok := metricValue(t, metrics, succeeded); ok && v >= 3 {
			t.Logf("%v scheduled runs of sched succeeded %s after the install", v, time.Since(installed).Round(time.Second))
			break
		}
		if time.Now().After(deadline) {
			r := c.run(t, nil, "etcdbackup", "list", "-o", "wide")
			t.Fatalf("fewer than 3 scheduled runs of sched succeeded in 5 minutes; metrics:\n%s\nlist:\n%s", grepMetrics(t, metrics, "etcdbackup_backup_runs_total"), r)
		}
		time.Sleep(5 * time.Second)
	}

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
		if strings.TrimSpace(r.Stdout) != "" || !strings.Contains(r.Stderr, "No backups to prune.") {
			t.Errorf("prune --dry-run: %s", r)
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

// watchConcurrentJobs polls the backup Jobs of target until the test
// ends; the function it returns gives the most that ran at once and how
// many were seen.
func watchConcurrentJobs(ctx context.Context, t *testing.T, c *cluster, target string) func() (most, seen int) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var wg sync.WaitGroup
	most, seen := 0, map[string]bool{}
	wg.Go(func() {
		for ctx.Err() == nil {
			list, err := c.sb.Client().BatchV1().Jobs(world.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=backup-agent"})
			if err == nil {
				running := 0
				mu.Lock()
				for _, j := range list.Items {
					if j.Annotations["etcdbackup.io/target"] != target {
						continue
					}
					seen[j.Name] = true
					if !jobFinished(&j) {
						running++
					}
				}
				most = max(most, running)
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return most, len(seen)
	}
}

func jobFinished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
			return true
		}
	}
	return false
}

// portForwardMetrics forwards a local port to the server's metrics port
// with the real kubectl and returns the URL of its /metrics.
func portForwardMetrics(ctx context.Context, t *testing.T, k *world.Kubectl) string {
	t.Helper()
	return "http://" + portForward(ctx, t, k, world.DefaultNamespace, "deployment/etcdbackup-server", 9090) + "/metrics"
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
