package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// BenchmarkBackup measures, side by side in one run, on an etcd loaded
// with ETCDBACKUP_BENCH_DB_MIB MiB of values (default 1024): etcd's own
// client/v3/snapshot save to a local file, against the real agent binary
// streaming into the real server binary with a filesystem location and with
// an S3 location (versitygw over HTTPS), each without and with zstd. It
// reports wall times, their ratio to the save, and the agent's and the
// server's peak RSS.
func BenchmarkBackup(b *testing.B) {
	mib := dbMiB(b)
	ctx := context.Background()
	dir := b.TempDir()
	binDir := filepath.Join(dir, "bin")
	if err := world.BuildBinaries(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	s3 := s3test.Start(b)
	endpoint := startLoadedEtcd(b, filepath.Join(dir, "etcd"), mib)

	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `locations:
  - name: default
    filesystem: {path: %s}
  - name: s3
    s3: {bucket: %s, region: %s, endpoint: %s, pathStyle: true, caBundleFile: %s, accessKeyIDFile: %s, secretAccessKeyFile: %s}
`, filepath.Join(dir, "fs"), s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile), 0o600); err != nil {
		b.Fatal(err)
	}

	type row struct {
		name          string
		wall          time.Duration
		agentRSS      int64 // KiB
		serverRSS     int64 // KiB
		storedBytes   int64
		rawBytes      int64
		ratioToSave   float64
		compressRatio float64
	}
	var rows []row
	for i := 0; i < b.N; i++ {
		// etcd's own tool first: the baseline.
		start := time.Now()
		ref := filepath.Join(dir, fmt.Sprintf("ref-%d.db", i))
		if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()}, ref); err != nil {
			b.Fatal(err)
		}
		saveWall := time.Since(start)
		st, _ := os.Stat(ref)
		rows = append(rows, row{name: "snapshot save → local file", wall: saveWall, rawBytes: st.Size(), storedBytes: st.Size(), ratioToSave: 1})
		os.Remove(ref)

		for _, c := range []struct{ location, compression string }{
			{"default", ""}, {"default", "zstd"}, {"s3", ""}, {"s3", "zstd"},
		} {
			// A fresh server per case, so its peak RSS is this case's.
			srv, err := world.StartServerArgs(ctx, binDir, nil, "--config", config)
			if err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprintf("b%d-%s-%s", i, c.location, map[string]string{"": "raw", "zstd": "zstd"}[c.compression])
			args := []string{"backup", "--server", srv.Addr, "--name", name, "--location", c.location,
				"--endpoint", endpoint, "--insecure-plaintext"}
			if c.compression != "" {
				args = append(args, "--compression", c.compression)
			}
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, world.AgentBinary), args...)
			var outBuf strings.Builder
			cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
			start := time.Now()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			agentRSS := sampleHWM(cmd)
			wall := time.Since(start)
			out := outBuf.String()
			if !cmd.ProcessState.Success() {
				b.Fatalf("agent: %v\n%s", cmd.ProcessState, out)
			}
			serverRSS := srv.PeakRSSKiB()
			if err := srv.Stop(); err != nil {
				b.Fatal(err)
			}
			stored, raw := logInt(string(out), `"size":`), logInt(string(out), `"rawSize":`)
			label := "agent → server → " + map[string]string{"default": "filesystem", "s3": "S3"}[c.location]
			if c.compression != "" {
				label += " (zstd)"
			}
			rows = append(rows, row{
				name: label, wall: wall, agentRSS: agentRSS, serverRSS: serverRSS,
				storedBytes: stored, rawBytes: raw, ratioToSave: wall.Seconds() / saveWall.Seconds(),
				compressRatio: float64(raw) / float64(max(stored, 1)),
			})
			metric := strings.NewReplacer(" → ", "-", " ", "-", "(", "", ")", "").Replace(label)
			b.ReportMetric(wall.Seconds()/saveWall.Seconds(), metric+"/save")
		}
	}
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "etcd database ≈ %d MiB\twall\t× save\tMB/s (raw)\tstored MiB\tcompression\tagent peak RSS\tserver peak RSS\t\n", mib)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.2fs\t%.2f\t%.0f\t%.0f\t%.2f×\t%s\t%s\t\n", r.name, r.wall.Seconds(), r.ratioToSave,
			float64(r.rawBytes)/r.wall.Seconds()/1e6, float64(r.storedBytes)/(1<<20), max(r.compressRatio, 1), mibOrDash(r.agentRSS), mibOrDash(r.serverRSS))
	}
	tw.Flush()
	fmt.Print("\n" + sb.String())
}

// sampleHWM waits for cmd and returns its peak RSS (VmHWM, sampled until it
// exits). ru_maxrss will not do: after vfork+exec Linux counts the parent's
// RSS at the fork in it.
func sampleHWM(cmd *exec.Cmd) int64 {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var peak int64
	for {
		if v, err := world.ReadStatusValue(cmd.Process.Pid, "VmHWM"); err == nil {
			peak = max(peak, v)
		}
		select {
		case <-done:
			return peak
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func mibOrDash(kib int64) string {
	if kib == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(kib)/1024)
}

// logInt finds `"key":123` in the agent's JSON log.
func logInt(log, key string) int64 {
	i := strings.LastIndex(log, key)
	if i < 0 {
		return 0
	}
	s := log[i+len(key):]
	end := strings.IndexAny(s, ",}")
	if end < 0 {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(s[:end]), 10, 64)
	return n
}

// startLoadedEtcd runs a real etcd (in this process) and fills it with
// about mib MiB of incompressible-ish values.
func startLoadedEtcd(b *testing.B, dir string, mib int) string {
	free := func() url.URL {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		return url.URL{Scheme: "http", Host: l.Addr().String()}
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "bench", dir
	client, peer := free(), free()
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel, cfg.LogOutputs = "error", []string{filepath.Join(filepath.Dir(dir), "etcd.log")}
	cfg.UnsafeNoFsync = true
	cfg.QuotaBackendBytes = int64(mib+512) << 20
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	<-e.Server.ReadyNotify()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	// Half random, half repeated: zstd has something to do, but not
	// everything.
	val := make([]byte, 1<<20)
	for j := len(val) / 2; j < len(val); j++ {
		val[j] = byte(j % 7)
	}
	for i := 0; i < mib; i++ {
		_, _ = rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), byte(i >> 16)}).Read(val[:len(val)/2])
		if _, err := c.Put(context.Background(), fmt.Sprintf("/bench/%06d", i), string(val)); err != nil {
			b.Fatal(err)
		}
	}
	return client.String()
}
