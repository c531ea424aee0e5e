package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	ebsnapshot "github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// BenchmarkRestoreLocal measures, side by side in one run on the sandbox,
// `kubectl etcdbackup restore --local` of a real etcd snapshot of about
// ETCDBACKUP_BENCH_DB_MIB MiB (default 1024) through the API server,
// against what an operator would do by hand: `kubectl etcdbackup download`
// of the same backup, then etcd's own restore (etcdutl's snapshot package)
// of the downloaded file. It reports both wall times, their ratio, and the
// plugin's peak RSS.
func BenchmarkRestoreLocal(b *testing.B) {
	mib := envMiB(b, "ETCDBACKUP_BENCH_DB_MIB", 1024)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	sb, dir, binDir, images := startProductWorld(ctx, b)
	k := world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	if err := world.InstallServer(ctx, sb, &k, namespace, images, dir); err != nil {
		b.Fatal(err)
	}
	// A real snapshot of a loaded etcd, uploaded through the API server
	// (the server's user API is on its pod's loopback only).
	endpoint := startLoadedEtcd(b, filepath.Join(dir, "etcd"), mib)
	snap := filepath.Join(dir, "snap.db")
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()}, snap); err != nil {
		b.Fatal(err)
	}
	if r := k.Run(ctx, "etcdbackup", "-n", namespace, "upload", snap, "--name", "restore-me"); r.ExitCode != 0 {
		b.Fatalf("upload: %s", r)
	}
	if err := os.Remove(snap); err != nil {
		b.Fatal(err)
	}

	var restoreWall, downloadWall, etcdRestoreWall time.Duration
	var peakRSS int64
	// steps is the last restore's own account of its parts.
	var steps string
	for i := 0; i < b.N; i++ {
		run := filepath.Join(dir, fmt.Sprintf("run-%d", i))
		// The plugin: download through the tunnel, verify, restore.
		cmd := k.Command(ctx, append([]string{"etcdbackup", "restore", "restore-me", "--local", "--data-dir", filepath.Join(run, "plugin.etcd")}, byHandMember...)...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		rss := sampleHWM(cmd)
		restoreWall += time.Since(start)
		if !cmd.ProcessState.Success() {
			b.Fatalf("restore --local: %s\n%s", cmd.ProcessState, out.String())
		}
		peakRSS = max(peakRSS, rss)
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(line, "restored in ") {
				steps = line
			}
		}
		if steps == "" {
			b.Fatalf("restore --local printed no elapsed time (\"restored in ...\"):\n%s", out.String())
		}

		// By hand: download, then etcd's own restore of the file.
		file := filepath.Join(run, "downloaded.db")
		start = time.Now()
		dl := k.Command(ctx, "etcdbackup", "download", "restore-me", "-o", file)
		if o, err := dl.CombinedOutput(); err != nil {
			b.Fatalf("download: %v\n%s", err, o)
		}
		downloadWall += time.Since(start)
		etcdRestoreWall += etcdRestoreByHand(b, file, filepath.Join(run, "byhand.etcd"))
		if err := os.RemoveAll(run); err != nil {
			b.Fatal(err)
		}
	}
	n := time.Duration(b.N)
	byHand := (downloadWall + etcdRestoreWall) / n
	ratio := (restoreWall / n).Seconds() / byHand.Seconds()
	b.ReportMetric(ratio, "restore/by-hand")
	b.ReportMetric(float64(peakRSS)/1024, "plugin-peak-RSS-MiB")
	var t strings.Builder
	tw := tabwriter.NewWriter(&t, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "restore of a ≈ %d MiB etcd snapshot\twall\t\n", mib)
	fmt.Fprintf(tw, "kubectl etcdbackup restore --local\t%.2fs\t\n", (restoreWall / n).Seconds())
	fmt.Fprintf(tw, "kubectl etcdbackup download\t%.2fs\t\n", (downloadWall / n).Seconds())
	fmt.Fprintf(tw, "+ etcd's own restore of the file\t%.2fs\t\n", (etcdRestoreWall / n).Seconds())
	fmt.Fprintf(tw, "restore / (download + etcd restore)\t%.2f\t\n", ratio)
	fmt.Fprintf(tw, "plugin peak RSS\t%.1f MiB\t\n", float64(peakRSS)/1024)
	tw.Flush()
	fmt.Print("\n" + t.String() + "the plugin's last run: " + steps + "\n")
	emitJSON(map[string]any{"bench": "restore", "sizeMiB": mib, "runs": b.N,
		"restoreSeconds": (restoreWall / n).Seconds(), "downloadSeconds": (downloadWall / n).Seconds(),
		"etcdRestoreSeconds": (etcdRestoreWall / n).Seconds(), "ratio": ratio,
		"pluginPeakRSSMiB": float64(peakRSS) / 1024, "steps": steps})
}

// envMiB is the size in MiB environment variable name asks for, def
// when it is not set.
func envMiB(b *testing.B, name string, def int) int {
	mib := def
	if v := os.Getenv(name); v != "" {
		if _, err := fmt.Sscan(v, &mib); err != nil {
			b.Fatalf("%s=%q: %v", name, v, err)
		}
	}
	return mib
}

// startProductWorld starts the sandbox and builds what a benchmark of the
// installed product needs: the binaries (in binDir, the plugin's PATH
// directory) and the images, imported into the node, both under dir.
func startProductWorld(ctx context.Context, b *testing.B) (sb *sandbox.Sandbox, dir, binDir string, images *world.Images) {
	b.Helper()
	sb = sandbox.StartForTest(b)
	dir = b.TempDir()
	binDir = filepath.Join(dir, "bin")
	if err := world.BuildBinaries(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	return sb, dir, binDir, importProductImages(ctx, b, sb, dir)
}

// importProductImages builds the product's images into dir and imports
// them into the sandbox's node.
func importProductImages(ctx context.Context, b *testing.B, sb *sandbox.Sandbox, dir string) *world.Images {
	b.Helper()
	images, err := world.BuildImages(ctx, filepath.Join(dir, "images"))
	if err != nil {
		b.Fatal(err)
	}
	if err := sb.ImportImages(ctx, images.Archives...); err != nil {
		b.Fatal(err)
	}
	return images
}

// byHandMember is the one-member cluster a local restore writes, as the
// plugin's flags; etcdRestoreByHand restores the same.
var byHandMember = []string{"--member-name", "m1", "--initial-cluster", "m1=http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380"}

// etcdRestoreByHand times etcd's own restore (etcdutl's snapshot package)
// of file into dataDir as byHandMember: what an operator does by hand
// after downloading a backup.
func etcdRestoreByHand(b *testing.B, file, dataDir string) time.Duration {
	b.Helper()
	start := time.Now()
	if _, err := ebsnapshot.Restore(file, ebsnapshot.Member{
		Name: "m1", InitialCluster: "m1=http://127.0.0.1:2380", InitialAdvertisePeerURLs: []string{"http://127.0.0.1:2380"},
		DataDir: dataDir,
	}); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}
