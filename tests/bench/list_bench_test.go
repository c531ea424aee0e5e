package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// listBackups and listPairs: `list` of 20 backups, timed against
// `kubectl get pods` in 9 interleaved pairs.
const (
	listBackups = 20
	listPairs   = 9
	listPause   = 250 * time.Millisecond
)

// BenchmarkList compares the latency a user feels of `kubectl etcdbackup
// list` (20 backups) with `kubectl get pods` in the same namespace: each
// a whole kubectl process, from exec to exit, 9 pairs interleaved in one
// run (the order alternating), after one warm-up of each (kubectl's
// discovery cache and the plugin's hint of the server pod filled, as they
// are on a user's machine), each list after a pause (listPause). It
// reports the medians and their ratio; the aim is list/get-pods ≤ 1.5. With
// ETCDBACKUP_BENCH_BASELINE_PLUGIN naming another build of the plugin,
// that one's list is timed in every round too.
//
//	go test -run '^$' -bench List -benchtime 1x ./tests/bench/
func BenchmarkList(b *testing.B) {
	sb := sandbox.StartForTest(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	binDir := b.TempDir()
	if err := world.BuildBinaries(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	images, err := world.BuildImages(ctx, filepath.Join(binDir, "images"))
	if err != nil {
		b.Fatal(err)
	}
	if err := sb.ImportImages(ctx, images.Archives...); err != nil {
		b.Fatal(err)
	}
	kubectl := world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	if err := world.InstallServer(ctx, sb, &kubectl, namespace, images, b.TempDir()); err != nil {
		b.Fatal(err)
	}
	uploadSmallBackups(ctx, b, &kubectl, listBackups)

	run := func(k *world.Kubectl, args ...string) time.Duration {
		if args[0] == "etcdbackup" {
			// The server's ListBackups asks the API server for its backup
			// Jobs, through a client-go client limited to 5 requests a
			// second (burst 10): lists back to back, as these rounds run
			// them and no user does, would time that limiter (a wait to
			// the next 200 ms tick), not a list. One token comes back
			// every 200 ms.
			time.Sleep(listPause)
		}
		start := time.Now()
		r := k.Run(ctx, args...)
		d := time.Since(start)
		if r.ExitCode != 0 {
			b.Fatalf("kubectl %s: %s", strings.Join(args, " "), r)
		}
		if args[0] == "etcdbackup" && strings.Count(r.Stdout, "\n") != listBackups+1 {
			b.Fatalf("kubectl etcdbackup list printed %d lines, want a header and %d backups:\n%s", strings.Count(r.Stdout, "\n"), listBackups, r.Stdout)
		}
		return d
	}
	list := []string{"etcdbackup", "list", "-n", namespace}
	pods := []string{"get", "pods", "-n", namespace}
	// A baseline plugin binary (another build, say the code before a
	// change) is timed in the same rounds, so both see the same machine.
	var baseline *world.Kubectl
	if path := os.Getenv("ETCDBACKUP_BENCH_BASELINE_PLUGIN"); path != "" {
		dir := b.TempDir()
		if err := os.Symlink(path, filepath.Join(dir, world.PluginBinary)); err != nil {
			b.Fatal(err)
		}
		k := kubectl
		k.PluginDir = dir
		baseline = &k
	}
	run(&kubectl, list...)
	run(&kubectl, pods...)
	var listTimes, podTimes, baseTimes []time.Duration
	for b.Loop() {
		listTimes, podTimes, baseTimes = listTimes[:0], podTimes[:0], baseTimes[:0]
		for i := range listPairs {
			if i%2 == 0 {
				listTimes = append(listTimes, run(&kubectl, list...))
				podTimes = append(podTimes, run(&kubectl, pods...))
			} else {
				podTimes = append(podTimes, run(&kubectl, pods...))
				listTimes = append(listTimes, run(&kubectl, list...))
			}
			if baseline != nil {
				baseTimes = append(baseTimes, run(baseline, list...))
			}
		}
	}
	l, p := median(listTimes), median(podTimes)
	ratio := l.Seconds() / p.Seconds()
	b.ReportMetric(float64(l.Microseconds())/1000, "list-ms")
	b.ReportMetric(float64(p.Microseconds())/1000, "get-pods-ms")
	b.ReportMetric(ratio, "list/get-pods")
	fmt.Printf("\nkubectl etcdbackup list (%d backups): median %s; kubectl get pods: median %s; ratio %.2f (aim ≤ 1.5)\n",
		listBackups, l.Round(time.Millisecond), p.Round(time.Millisecond), ratio)
	result := map[string]any{
		"bench": "list", "backups": listBackups, "pairs": listPairs,
		"listMs": ms(listTimes), "getPodsMs": ms(podTimes),
		"listMedianMs": l.Seconds() * 1000, "getPodsMedianMs": p.Seconds() * 1000, "ratio": ratio,
	}
	if baseline != nil {
		bl := median(baseTimes)
		fmt.Printf("baseline plugin: median %s; ratio %.2f\n", bl.Round(time.Millisecond), bl.Seconds()/p.Seconds())
		result["baselineMs"], result["baselineMedianMs"] = ms(baseTimes), bl.Seconds()*1000
	}
	emitJSON(result)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds() * 1000
	}
	return out
}

// uploadSmallBackups stores n small backups (real etcd snapshots, the
// smallest: an empty member's, about 25 KiB, the same for all) with
// `kubectl etcdbackup upload`: the server's user API is only reachable
// through the tunnel.
func uploadSmallBackups(ctx context.Context, b *testing.B, k *world.Kubectl, n int) {
	b.Helper()
	dir := b.TempDir()
	for i := range n {
		path := filepath.Join(dir, fmt.Sprintf("list-%02d.db", i))
		etcdtest.SnapshotFile(b, path, 0)
		name := strings.TrimSuffix(filepath.Base(path), ".db")
		if r := k.Run(ctx, "etcdbackup", "upload", path, "--name", name, "-n", namespace); r.ExitCode != 0 {
			b.Fatalf("upload %s: %s", name, r)
		}
	}
}

// emitJSON prints v as one line that hack/benchreport reads from the
// benchmarks' output to write docs/benchmarks.md.
func emitJSON(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of numbers and strings always encode
	}
	fmt.Printf("benchjson %s\n", line)
}
