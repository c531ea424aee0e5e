package plugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// BenchmarkEncryption measures the cost of age encryption on the backup
// path (a snapshot file → etcd trailer check → age → gRPC upload → a real
// server on a filesystem location, as `upload --encrypt-to` and the agent
// do) and on the download path (gRPC → age → trailer and plain SHA-256 →
// file), side by side with the same paths unencrypted, through the real
// command tree in one process. It reports seconds, MB/s and bytes
// allocated per MiB for each path; the allocation per MiB must stay flat
// from 64 MiB to 1 GiB (memory bounded by chunks, not by the backup).
//
//	go test -run '^$' -bench Encryption -benchtime 1x ./plugin/
func BenchmarkEncryption(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int64
	}{
		{"64MiB", 64 << 20},
		{"1GiB", 1 << 30},
	} {
		b.Run(size.name, func(b *testing.B) { benchEncryption(b, size.bytes) })
	}
}

func benchEncryption(b *testing.B, size int64) {
	srv := servertest.Start(b, "")
	addr := "--server-address=" + srv.Addr
	snap, size := benchSnapshot(b, size)
	key := agetest.NewKey(b)
	out := filepath.Join(b.TempDir(), "out.db")
	b.Setenv(IdentityEnv, "")

	type path struct {
		name string
		args func(i int) []string
	}
	paths := []path{
		{"upload", func(i int) []string { return []string{addr, "upload", snap, "--name", fmt.Sprintf("plain-%d", i)} }},
		{"upload-age", func(i int) []string {
			return []string{addr, "upload", snap, "--name", fmt.Sprintf("enc-%d", i), "--encrypt-to", key.Recipient}
		}},
		{"download-raw", func(i int) []string {
			return []string{addr, "download", fmt.Sprintf("plain-%d", i), "-o", out, "--raw"}
		}},
		{"download-plain", func(i int) []string { return []string{addr, "download", fmt.Sprintf("plain-%d", i), "-o", out} }},
		{"download-age", func(i int) []string {
			return []string{addr, "download", fmt.Sprintf("enc-%d", i), "-o", out, "--identity", key.File}
		}},
	}
	secs := map[string]float64{}
	alloc := map[string]float64{}
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, p := range paths {
			os.Remove(out)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			if err := runQuiet(p.args(i)...); err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			secs[p.name] += time.Since(start).Seconds()
			runtime.ReadMemStats(&after)
			alloc[p.name] += float64(after.TotalAlloc - before.TotalAlloc)
		}
	}
	b.StopTimer()
	mib := float64(size) / (1 << 20)
	for _, p := range paths {
		s := secs[p.name] / float64(b.N)
		b.ReportMetric(float64(size)/s/1e6, p.name+"-MB/s")
		b.ReportMetric(alloc[p.name]/float64(b.N)/mib/(1<<20), p.name+"-allocMiB/MiB")
	}
	b.ReportMetric(secs["upload-age"]/secs["upload"], "upload-age/plain")
	b.ReportMetric(secs["download-age"]/secs["download-plain"], "download-age/plain")
}

// runQuiet runs the command tree as main does, output discarded.
func runQuiet(args ...string) error {
	streams, _, _, _ := genericiooptions.NewTestIOStreams()
	cmd := NewCmdRoot(streams)
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	return cmd.ExecuteContext(context.Background())
}

// benchSnapshot writes a real etcd snapshot of about size bytes (upload
// checks the database) and returns its path and its size. Made once per
// size and process; the 1 GiB one fills an etcd member first, which takes
// a while.
func benchSnapshot(b *testing.B, size int64) (string, int64) {
	b.Helper()
	path := filepath.Join(b.TempDir(), "snapshot.db")
	data := etcdtest.SnapshotFile(b, path, int(size))
	return path, int64(len(data))
}
