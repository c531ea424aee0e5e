package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

const (
	clusterNS     = "app"
	clusterTarget = "app-etcd"
	clusterToken  = "app-etcd-token"
	clusterBackup = "cluster-restore-me"
	// clusterMarker is a key the restored cluster must read back.
	clusterMarker = "/bench/marker"
)

// BenchmarkRestoreCluster times the two restores an operator runs on the
// worst day, on the sandbox with the product installed as a user would:
//
//   - the in-cluster restore of a three-member etcd (pods on PVCs, a
//     ClusterTarget with its backups in S3) holding about
//     ETCDBACKUP_BENCH_CLUSTER_DB_MIB MiB (default 256): from `kubectl
//     etcdbackup restore --target --wait` to every member's Job done,
//     then from scaling the members up to all three serving a quorum read
//     of the backup's data — the recovery time, command to cluster;
//   - the break-glass restore from S3 (`restore --local --storage-config`,
//     the API server not used at all: KUBECONFIG=/dev/null), against
//     doing it by hand the same way (`download --storage-config`, then
//     etcd's own restore of the file), side by side in the same rounds.
//
// Stopping and wiping the members before a restore is the operator's and
// is not timed.
//
//	go test -run '^$' -bench RestoreCluster -benchtime 1x ./tests/bench/
func BenchmarkRestoreCluster(b *testing.B) {
	mib := envMiB(b, "ETCDBACKUP_BENCH_CLUSTER_DB_MIB", 256)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	sb, dir, binDir, images := startProductWorld(ctx, b)
	etcd, err := world.BuildEtcd(ctx, dir)
	if err != nil {
		b.Fatal(err)
	}
	if err := sb.LoadBinaryImage(ctx, world.AppEtcdImage, etcd); err != nil {
		b.Fatal(err)
	}
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	must := func(r world.Result, what string) world.Result {
		b.Helper()
		if r.ExitCode != 0 {
			b.Fatalf("%s: %s", what, r)
		}
		return r
	}

	var members []world.ClusterMember
	for i := 0; i < world.AppEtcdMembers; i++ {
		members = append(members, world.AppMember(clusterNS, i))
	}
	manifest := filepath.Join(dir, "app-etcd.yaml")
	if err := os.WriteFile(manifest, []byte(world.AppEtcdYAML(clusterNS, clusterToken, members)), 0o600); err != nil {
		b.Fatal(err)
	}
	must(k.Run(ctx, "apply", "-f", manifest), "kubectl apply the application etcd")
	product, err := world.InstallProductWith(ctx, sb, k, filepath.Join(dir, "product"), os.Stderr, world.ProductOptions{
		Images:         images,
		ClusterTargets: []world.ClusterTarget{{Name: clusterTarget, Namespace: clusterNS, InitialClusterToken: clusterToken, Location: "s3", Members: members}},
		// ETCDBACKUP_BENCH_AGENT_MEMORY_LIMIT: the agents' memory limit,
		// when not the server's default.
		AgentMemoryLimit: os.Getenv("ETCDBACKUP_BENCH_AGENT_MEMORY_LIMIT"),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(product.Stop)
	// serving waits until every member's Deployment is available and
	// the cluster serves a quorum read, and returns a client to member.
	serving := func(member string) *clientv3.Client {
		b.Helper()
		for _, m := range members {
			if err := sb.WaitForDeploymentAvailable(ctx, clusterNS, m.Name); err != nil {
				b.Fatal(err)
			}
		}
		ec, err := world.AppEtcdClient(sb.RESTConfig(), clusterNS, member)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := world.WaitEtcdHealthy(ctx, ec, len(members)); err != nil {
			ec.Close()
			b.Fatal(err)
		}
		return ec
	}

	// Fill the members with 1 MiB values, half random, then the marker.
	ec := serving(members[0].Name)
	val := make([]byte, 1<<20)
	for j := len(val) / 2; j < len(val); j++ {
		val[j] = byte(j % 7)
	}
	for i := 0; i < mib; i++ {
		_, _ = rand.Read(val[:len(val)/2])
		if _, err := ec.Put(ctx, fmt.Sprintf("/bench/%06d", i), string(val)); err != nil {
			b.Fatal(err)
		}
	}
	marker := rand.Text()
	if _, err := ec.Put(ctx, clusterMarker, marker); err != nil {
		b.Fatal(err)
	}
	ec.Close()
	start := time.Now()
	must(k.Run(ctx, "etcdbackup", "backup", "--target", clusterTarget, "--name", clusterBackup, "--wait"), "backup --target --wait")
	backupWall := time.Since(start)
	storageConfig, err := world.BreakGlassStorageConfig(ctx, k, product, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}

	restoreArgs := []string{"etcdbackup", "restore", clusterBackup, "--location", "s3", "--target", clusterTarget}
	scale := func(replicas int) {
		b.Helper()
		args := []string{"-n", clusterNS, "scale", "deployment"}
		for _, m := range members {
			args = append(args, m.Name)
		}
		must(k.Run(ctx, append(args, fmt.Sprintf("--replicas=%d", replicas))...), "kubectl scale")
	}
	until := func(what string, done func() bool) {
		b.Helper()
		for !done() {
			select {
			case <-ctx.Done():
				b.Fatalf("waiting for %s: %v", what, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	var restoreWall, jobsWall, startWall, glassWall, glassDownloadWall, glassEtcdWall time.Duration
	var steps, glassSteps, agentSteps string
	for i := 0; i < b.N; i++ {
		// The operator's part, not timed: stop the members, wait until
		// the server sees them stopped, wipe their volumes.
		scale(0)
		until("the members' pods gone", func() bool {
			pods, err := sb.Client().CoreV1().Pods(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "app=etcd"})
			return err == nil && len(pods.Items) == 0
		})
		until("the server to see every member stopped", func() bool {
			r := k.Run(ctx, append(restoreArgs, "--dry-run")...)
			return r.ExitCode == 0 && !strings.Contains(r.Stdout+r.Stderr, "still answers") && !strings.Contains(r.Stdout+r.Stderr, "cannot tell")
		})
		must(k.Run(ctx, "-n", clusterNS, "delete", "jobs", "-l", "app.kubernetes.io/component=restore-agent", "--wait"), "delete the last round's restore Jobs")
		for _, m := range members {
			vol, err := sb.VolumePath(ctx, clusterNS, m.ClaimName)
			if err != nil {
				b.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(vol, m.DataDir)); err != nil {
				b.Fatal(err)
			}
		}

		// The recovery: the restore, then the members started.
		start := time.Now()
		r := must(k.Run(ctx, append(restoreArgs, "--wait")...), "restore --target --wait")
		restoreWall += time.Since(start)
		for _, line := range strings.Split(r.Stdout+r.Stderr, "\n") {
			if strings.HasPrefix(line, "target ") && strings.Contains(line, " restored in ") {
				steps = line
			}
		}
		if steps == "" {
			b.Fatalf("restore --target --wait printed no elapsed time:\n%s", r)
		}
		jobsWall += restoreJobsSpan(ctx, b, sb)
		agentSteps = slowestMember(ctx, b, sb, k)
		began := time.Now()
		scale(1)
		ec := serving(members[1].Name)
		got, err := ec.Get(ctx, clusterMarker)
		ec.Close()
		if err != nil {
			b.Fatal(err)
		}
		if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != marker {
			b.Fatalf("the restored cluster reads %s = %v, want the backup's %q", clusterMarker, got.Kvs, marker)
		}
		startWall += time.Since(began)

		// Break glass: from S3 with the storage configuration alone.
		run := filepath.Join(dir, fmt.Sprintf("glass-%d", i))
		noAPI := *k
		noAPI.Env = []string{"KUBECONFIG=" + os.DevNull}
		noAPI.Kubeconfig = ""
		start = time.Now()
		r = must(noAPI.Run(ctx, append([]string{"etcdbackup", "restore", clusterBackup, "--local", "--storage-config", storageConfig,
			"--data-dir", filepath.Join(run, "plugin.etcd")}, byHandMember...)...), "restore --local --storage-config")
		glassWall += time.Since(start)
		for _, line := range strings.Split(r.Stdout+r.Stderr, "\n") {
			if strings.HasPrefix(line, "restored in ") {
				glassSteps = line
			}
		}
		file := filepath.Join(run, "downloaded.db")
		start = time.Now()
		must(noAPI.Run(ctx, "etcdbackup", "download", clusterBackup, "--storage-config", storageConfig, "-o", file), "download --storage-config")
		glassDownloadWall += time.Since(start)
		glassEtcdWall += etcdRestoreByHand(b, file, filepath.Join(run, "byhand.etcd"))
		if err := os.RemoveAll(run); err != nil {
			b.Fatal(err)
		}
	}
	n := time.Duration(b.N)
	total := (restoreWall + startWall) / n
	glassRatio := (glassWall / n).Seconds() / ((glassDownloadWall + glassEtcdWall) / n).Seconds()
	b.ReportMetric(total.Seconds(), "recovery-s")
	b.ReportMetric(glassRatio, "break-glass/by-hand")
	var t strings.Builder
	tw := tabwriter.NewWriter(&t, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "three-member target, ≈ %d MiB\twall\t\n", mib)
	fmt.Fprintf(tw, "backup --target --wait (once)\t%.2fs\t\n", backupWall.Seconds())
	fmt.Fprintf(tw, "restore --target --wait\t%.2fs\t\n", (restoreWall / n).Seconds())
	fmt.Fprintf(tw, "  of which the Jobs, first created to last done\t%.2fs\t\n", (jobsWall / n).Seconds())
	fmt.Fprintf(tw, "members started to all serving\t%.2fs\t\n", (startWall / n).Seconds())
	fmt.Fprintf(tw, "command to cluster serving\t%.2fs\t\n", total.Seconds())
	fmt.Fprintf(tw, "break-glass restore --local --storage-config\t%.2fs\t\n", (glassWall / n).Seconds())
	fmt.Fprintf(tw, "download --storage-config\t%.2fs\t\n", (glassDownloadWall / n).Seconds())
	fmt.Fprintf(tw, "+ etcd's own restore of the file\t%.2fs\t\n", (glassEtcdWall / n).Seconds())
	fmt.Fprintf(tw, "break-glass / by hand\t%.2f\t\n", glassRatio)
	tw.Flush()
	fmt.Print("\n" + t.String() + "the last in-cluster restore: " + steps + "\nits slowest member's agent: " + agentSteps +
		"\nthe last break-glass restore: " + glassSteps + "\n")
	emitJSON(map[string]any{"bench": "restore-cluster", "sizeMiB": mib, "members": len(members), "runs": b.N,
		"backupSeconds": backupWall.Seconds(), "restoreSeconds": (restoreWall / n).Seconds(), "jobsSeconds": (jobsWall / n).Seconds(),
		"startSeconds": (startWall / n).Seconds(), "totalSeconds": total.Seconds(), "steps": steps, "agentSteps": agentSteps,
		"breakGlassSeconds": (glassWall / n).Seconds(), "breakGlassDownloadSeconds": (glassDownloadWall / n).Seconds(),
		"breakGlassEtcdRestoreSeconds": (glassEtcdWall / n).Seconds(), "breakGlassRatio": glassRatio, "breakGlassSteps": glassSteps})
}

// slowestMember is the account of its steps that the restore agent which
// took longest logged ("member data restored": took, and each step's
// part), as "etcd-1 took 12.3s: download 8s, verify 1.2s, rebuild 3.1s".
func slowestMember(ctx context.Context, b *testing.B, sb *sandbox.Sandbox, k *world.Kubectl) string {
	b.Helper()
	jobs, err := sb.Client().BatchV1().Jobs(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=restore-agent"})
	if err != nil {
		b.Fatal(err)
	}
	var slowest string
	var longest time.Duration
	for _, j := range jobs.Items {
		r := k.Run(ctx, "-n", clusterNS, "logs", "job/"+j.Name)
		if r.ExitCode != 0 {
			b.Fatalf("logs of restore Job %s: %s", j.Name, r)
		}
		found := false
		for _, l := range strings.Split(r.Stdout+r.Stderr, "\n") {
			var line struct {
				Msg, Member, Took string
				Steps             map[string]string
			}
			if json.Unmarshal([]byte(l), &line) != nil || line.Msg != "member data restored" {
				continue
			}
			found = true
			took, err := time.ParseDuration(line.Took)
			if err != nil {
				b.Fatalf("restore Job %s logged took %q: %v", j.Name, line.Took, err)
			}
			if took < longest {
				continue
			}
			longest = took
			var parts []string
			for _, step := range []string{"download", "verify", "replay", "rebuild"} {
				if d, ok := line.Steps[step]; ok {
					parts = append(parts, step+" "+d)
				}
			}
			slowest = fmt.Sprintf("%s took %s: %s", line.Member, line.Took, strings.Join(parts, ", "))
		}
		if !found {
			b.Fatalf("restore Job %s logged no \"member data restored\" line:\n%s", j.Name, r)
		}
	}
	return slowest
}

// restoreJobsSpan is how long the restore Jobs ran, from the first one's
// creation to the last one's completion, as their controller recorded it
// (to the second).
func restoreJobsSpan(ctx context.Context, b *testing.B, sb *sandbox.Sandbox) time.Duration {
	b.Helper()
	jobs, err := sb.Client().BatchV1().Jobs(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=restore-agent"})
	if err != nil {
		b.Fatal(err)
	}
	var first, last time.Time
	for _, j := range jobs.Items {
		if j.Status.CompletionTime == nil {
			b.Fatalf("restore Job %s has no completion time after restore --wait succeeded", j.Name)
		}
		if c := j.CreationTimestamp.Time; first.IsZero() || c.Before(first) {
			first = c
		}
		if c := j.Status.CompletionTime.Time; c.After(last) {
			last = c
		}
	}
	if len(jobs.Items) == 0 {
		b.Fatal("restore --target --wait left no restore Jobs")
	}
	return last.Sub(first)
}
