package bench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// BenchmarkBackup measures, side by side in one run, on an etcd loaded
// with each of ETCDBACKUP_BENCH_SIZES_MIB MiB of values (a comma list;
// default ETCDBACKUP_BENCH_DB_MIB, default 1024): etcd's own
// client/v3/snapshot save to a local file, against the real agent binary
// streaming into the real server binary with a filesystem location and with
// an S3 location (versitygw over HTTPS), each without and with zstd. It
// reports wall times, their ratio to the save, the CPU each process spent
// per GiB, and the agent's and the server's peak RSS. With
// ETCDBACKUP_BENCH_PERF set to a directory, the agent and the server run
// under perf record and the hottest functions of each are reported. With
// ETCDBACKUP_BENCH_BASELINE_BIN set to a directory of another build of
// the agent and the server, that build runs every case too, in turns.
func BenchmarkBackup(b *testing.B) {
	sizes := benchSizes(b)
	ctx := context.Background()
	dir := b.TempDir()
	binDir := filepath.Join(dir, "bin")
	if err := world.BuildBinaries(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	// The servers skip their start-up check of the locations: runAgent
	// measures a server from the moment it listens, and that check (with
	// S3, ≈ 0.3 s of CPU) is no backup's work (uncheckedServer).
	binDir = uncheckedServer(b, binDir)
	s3 := s3test.Start(b)
	e := startEtcd(b, filepath.Join(dir, "etcd"), slices.Max(sizes))

	config := filepath.Join(dir, "config.yaml")
	writeConfig := func(partMiB, concurrency int) {
		tuning := ""
		if partMiB > 0 {
			tuning = fmt.Sprintf(", partSizeMiB: %d, concurrency: %d", partMiB, concurrency)
		}
		if err := os.WriteFile(config, fmt.Appendf(nil, `locations:
  - name: default
    filesystem: {path: %s}
  - name: s3
    s3: {bucket: %s, region: %s, endpoint: %s, pathStyle: true, caBundleFile: %s, accessKeyIDFile: %s, secretAccessKeyFile: %s%s}
`, filepath.Join(dir, "fs"), s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile, tuning), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	writeConfig(0, 0)
	perfDir := os.Getenv("ETCDBACKUP_BENCH_PERF")
	// ETCDBACKUP_BENCH_BASELINE_BIN: a directory of another build of the
	// agent and the server (the code before a change, say).
	baseline := os.Getenv("ETCDBACKUP_BENCH_BASELINE_BIN")
	if baseline != "" {
		baseline = uncheckedServer(b, baseline)
	}

	var rows []backupRow
	for i := 0; i < b.N; i++ {
		for _, mib := range sizes {
			e.fill(b, mib)
			// etcd's own tool: the baseline, run again right before each
			// case, so that each ratio compares two runs the machine saw
			// in the same state (here wall times drift by 2× within a
			// minute). The table shows the first save; every row's
			// "× save" is against its own.
			save := func() float64 {
				cpu0 := selfCPU()
				start := time.Now()
				ref := filepath.Join(dir, fmt.Sprintf("ref-%d.db", i))
				if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{e.endpoint}, Logger: zap.NewNop()}, ref); err != nil {
					b.Fatal(err)
				}
				wall := time.Since(start)
				st, _ := os.Stat(ref)
				if !slices.ContainsFunc(rows, func(r backupRow) bool {
					return r.SizeMiB == mib && r.Iteration == i && r.Build == "" && r.AgentCPU == 0
				}) {
					rows = append(rows, backupRow{Name: "snapshot save → local file", SizeMiB: mib, Iteration: i, Wall: wall.Seconds(), RawBytes: st.Size(),
						StoredBytes: st.Size(), RatioToSave: 1, EtcdCPU: (selfCPU() - cpu0).Seconds()})
				}
				os.Remove(ref)
				return wall.Seconds()
			}
			// The first snapshot after the fill runs up to twice as long
			// as the next ones (bolt's freshly written pages): not timed.
			warm := filepath.Join(dir, "warm.db")
			if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{e.endpoint}, Logger: zap.NewNop()}, warm); err != nil {
				b.Fatal(err)
			}
			os.Remove(warm)

			for _, c := range []struct{ location, compression string }{
				{"default", ""}, {"default", "zstd"}, {"s3", ""}, {"s3", "zstd"},
			} {
				label := "agent → server → " + map[string]string{"default": "filesystem", "s3": "S3"}[c.location]
				if c.compression != "" {
					label += " (zstd)"
				}
				// With a baseline build, both run each case, in turns, so
				// they see the same machine.
				builds := []string{""}
				if baseline != "" {
					builds = append(builds, "before")
					if len(rows)%2 == 0 {
						builds[0], builds[1] = builds[1], builds[0]
					}
				}
				for _, build := range builds {
					name := fmt.Sprintf("b%d-%d-%s-%s%s", i, mib, c.location, map[string]string{"": "raw", "zstd": "zstd"}[c.compression], build)
					dir := binDir
					if build != "" {
						dir = baseline
					}
					saveWall := save()
					r := runAgent(ctx, b, dir, config, e.endpoint, name, c.location, c.compression, perfDir, "")
					r.Name, r.SizeMiB, r.Iteration, r.SaveWall, r.RatioToSave, r.Build = label, mib, i, saveWall, r.Wall/saveWall, build
					rows = append(rows, r)
					if build == "" {
						metric := strings.NewReplacer(" → ", "-", " ", "-", "(", "", ")", "").Replace(label)
						b.ReportMetric(r.RatioToSave, fmt.Sprintf("%s-%dMiB/save", metric, mib))
					}
				}
			}
		}
	}
	fmt.Print("\n" + backupTable(rows))
	for _, r := range rows {
		emitJSON(map[string]any{"bench": "backup", "row": r})
	}
}

// BenchmarkS3PartSize measures the trade-off of the S3 location's part
// size and concurrency: the server's peak RSS (about (concurrency+2) ×
// part size, plus what the garbage collector lets grow) against the
// throughput of a backup of ETCDBACKUP_BENCH_S3_MIB MiB (default 256)
// from the agent, stored as is.
func BenchmarkS3PartSize(b *testing.B) {
	mib := 256
	if v := os.Getenv("ETCDBACKUP_BENCH_S3_MIB"); v != "" {
		if _, err := fmt.Sscan(v, &mib); err != nil {
			b.Fatalf("ETCDBACKUP_BENCH_S3_MIB=%q: %v", v, err)
		}
	}
	ctx := context.Background()
	dir := b.TempDir()
	binDir := filepath.Join(dir, "bin")
	if err := world.BuildBinaries(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	binDir = uncheckedServer(b, binDir)
	s3 := s3test.Start(b)
	e := startEtcd(b, filepath.Join(dir, "etcd"), mib)
	e.fill(b, mib)
	config := filepath.Join(dir, "config.yaml")
	var rows []backupRow
	for i := 0; i < b.N; i++ {
		for _, c := range []struct {
			part, concurrency int
			memLimit          string // the server's GOMEMLIMIT
		}{{5, 1, ""}, {5, 2, ""}, {5, 4, ""}, {8, 2, ""}, {8, 4, ""}, {16, 4, ""}, {5, 2, "24MiB"}, {5, 4, "32MiB"}, {8, 4, "48MiB"}} {
			if err := os.WriteFile(config, fmt.Appendf(nil, `locations:
  - name: s3
    s3: {bucket: %s, region: %s, endpoint: %s, pathStyle: true, caBundleFile: %s, accessKeyIDFile: %s, secretAccessKeyFile: %s, partSizeMiB: %d, concurrency: %d}
`, s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile, c.part, c.concurrency), 0o600); err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprintf("p%d-%d-%d", i, c.part, c.concurrency)
			if c.memLimit != "" {
				name += "-memlimit"
			}
			r := runAgent(ctx, b, binDir, config, e.endpoint, name, "s3", "", "", c.memLimit)
			r.Name, r.SizeMiB = fmt.Sprintf("S3 part %d MiB × %d", c.part, c.concurrency), mib
			r.PartMiB, r.Concurrency, r.MemLimit = c.part, c.concurrency, c.memLimit
			rows = append(rows, r)
			b.ReportMetric(float64(r.ServerRSS)/1024, fmt.Sprintf("server-MiB-%dx%d%s", c.part, c.concurrency, map[bool]string{true: "-memlimit"}[c.memLimit != ""]))
		}
	}
	fmt.Print("\n" + backupTable(rows))
	for _, r := range rows {
		emitJSON(map[string]any{"bench": "s3parts", "row": r})
	}
}

// backupRow is one measured backup, as emitted for hack/benchreport.
type backupRow struct {
	Name        string  `json:"name"`
	SizeMiB     int     `json:"sizeMiB"`
	Wall        float64 `json:"wallSeconds"`
	RatioToSave float64 `json:"ratioToSave,omitempty"`
	RawBytes    int64   `json:"rawBytes"`
	StoredBytes int64   `json:"storedBytes"`
	AgentRSS    int64   `json:"agentPeakRSSKiB,omitempty"`
	ServerRSS   int64   `json:"serverPeakRSSKiB,omitempty"`
	// ServerAnon is the server's peak anonymous RSS (heap, stacks,
	// buffers), sampled: RSS less the pages of the binary itself.
	ServerAnon int64   `json:"serverPeakAnonKiB,omitempty"`
	AgentCPU   float64 `json:"agentCPUSeconds,omitempty"`
	ServerCPU  float64 `json:"serverCPUSeconds,omitempty"`
	// EtcdCPU is this process's CPU meanwhile: the in-process etcd's.
	EtcdCPU     float64 `json:"etcdCPUSeconds,omitempty"`
	PartMiB     int     `json:"partSizeMiB,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	MemLimit    string  `json:"memLimit,omitempty"`
	// Iteration is the benchmark round (b.N) the row is from.
	Iteration int `json:"iteration"`
	// SaveWall is the snapshot save run right before this row, which
	// RatioToSave is against.
	SaveWall float64 `json:"saveWallSeconds,omitempty"`
	// Build is "before" for the baseline build's rows.
	Build     string   `json:"build,omitempty"`
	AgentHot  []string `json:"agentHot,omitempty"`
	ServerHot []string `json:"serverHot,omitempty"`
}

// runAgent runs one backup by the agent binary into a fresh server (so
// its peak RSS is this backup's) and measures both processes.
func runAgent(ctx context.Context, b *testing.B, binDir, config, endpoint, name, location, compression, perfDir, memLimit string) backupRow {
	if memLimit != "" {
		// The server process takes its environment at start: only it.
		os.Setenv("GOMEMLIMIT", memLimit)
	}
	srv, err := world.StartServerArgs(ctx, binDir, nil, "--config", config)
	os.Unsetenv("GOMEMLIMIT")
	if err != nil {
		b.Fatal(err)
	}
	serverPID := childPID(b, world.ServerBinary)
	var stopPerf func() []string
	if perfDir != "" {
		stopPerf = perfAttach(b, filepath.Join(perfDir, name+"-server.data"), serverPID)
	}
	args := []string{"backup", "--server", srv.Addr, "--name", name, "--location", location,
		"--endpoint", endpoint, "--insecure-plaintext"}
	if compression != "" {
		args = append(args, "--compression", compression)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, world.AgentBinary), args...)
	if perfDir != "" {
		cmd = exec.CommandContext(ctx, "perf", append([]string{"record", "-q", "-g", "-F", "999", "-o", filepath.Join(perfDir, name+"-agent.data"), "--",
			filepath.Join(binDir, world.AgentBinary)}, args...)...)
	}
	var outBuf strings.Builder
	cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
	cpu0, server0 := selfCPU(), processCPUSeconds(serverPID)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	stopAnon := samplePeak(serverPID, "RssAnon")
	agentRSS := sampleHWM(cmd)
	wall := time.Since(start)
	serverAnon := stopAnon()
	out := outBuf.String()
	if !cmd.ProcessState.Success() {
		b.Fatalf("agent: %v\n%s", cmd.ProcessState, out)
	}
	r := backupRow{
		Wall: wall.Seconds(), AgentRSS: agentRSS, ServerRSS: srv.PeakRSSKiB(), ServerAnon: serverAnon,
		AgentCPU:  (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(),
		ServerCPU: processCPUSeconds(serverPID) - server0, EtcdCPU: (selfCPU() - cpu0).Seconds(),
		StoredBytes: logInt(out, `"size":`), RawBytes: logInt(out, `"rawSize":`),
	}
	if stopPerf != nil {
		r.ServerHot = stopPerf()
		r.AgentHot = perfHot(b, filepath.Join(perfDir, name+"-agent.data"))
	}
	// Gone again, like the save's file: backups kept would fill the page
	// cache round after round, and the writes of later rows would pay for
	// reclaiming it.
	conn, c, err := client.Dial(srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: name, Location: location}); err != nil {
		b.Fatalf("delete backup %s: %v", name, err)
	}
	conn.Close()
	if err := srv.Stop(); err != nil {
		b.Fatal(err)
	}
	return r
}

func backupTable(rows []backupRow) string {
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "etcd database\twall\tits save\t× save\tMB/s (raw)\tstored MiB\tcompression\tagent CPU s/GiB\tserver CPU s/GiB\tetcd CPU s/GiB\tagent peak RSS\tserver peak RSS\tserver peak anon\t\n")
	for _, r := range rows {
		gib := float64(r.RawBytes) / (1 << 30)
		if r.MemLimit != "" {
			r.Name += ", GOMEMLIMIT=" + r.MemLimit
		}
		if r.Build != "" {
			r.Name += " [" + r.Build + "]"
		}
		save := "-"
		if r.SaveWall > 0 {
			save = fmt.Sprintf("%.2fs", r.SaveWall)
		}
		fmt.Fprintf(tw, "%d MiB: %s\t%.2fs\t%s\t%.2f\t%.0f\t%.0f\t%.2f×\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\n", r.SizeMiB, r.Name, r.Wall, save, r.RatioToSave,
			float64(r.RawBytes)/r.Wall/1e6, float64(r.StoredBytes)/(1<<20), float64(r.RawBytes)/float64(max(r.StoredBytes, 1)),
			r.AgentCPU/gib, r.ServerCPU/gib, r.EtcdCPU/gib, mibOrDash(r.AgentRSS), mibOrDash(r.ServerRSS), mibOrDash(r.ServerAnon))
	}
	tw.Flush()
	return sb.String()
}

// benchSizes are the database sizes BenchmarkBackup measures.
func benchSizes(b *testing.B) []int {
	v := os.Getenv("ETCDBACKUP_BENCH_SIZES_MIB")
	if v == "" {
		return []int{envMiB(b, "ETCDBACKUP_BENCH_DB_MIB", 1024)}
	}
	var sizes []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("ETCDBACKUP_BENCH_SIZES_MIB=%q: %q is not a size in MiB", v, f)
		}
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	return sizes
}

// selfCPU is this process's user and system CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPUSeconds is pid's user and system CPU so far, from /proc.
func processCPUSeconds(pid int) float64 {
	return processCPU(pid).Seconds()
}

// childPID finds this process's child running the binary named name.
func childPID(b *testing.B, name string) int {
	b.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm is cut to 15 bytes.
		i := bytes.LastIndexByte(stat, ')')
		comm := string(stat[bytes.IndexByte(stat, '(')+1 : i])
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(os.Getpid()) && strings.HasPrefix(name, comm) {
			return pid
		}
	}
	b.Fatalf("no child process %s", name)
	return 0
}

// perfAttach records pid's CPU samples into out until the returned
// function is called; that returns the hottest functions.
func perfAttach(b *testing.B, out string, pid int) func() []string {
	b.Helper()
	cmd := exec.Command("perf", "record", "-q", "-g", "-F", "999", "-o", out, "-p", strconv.Itoa(pid))
	if err := cmd.Start(); err != nil {
		b.Fatalf("perf record: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // perf attaches asynchronously
	return func() []string {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
		return perfHot(b, out)
	}
}

// perfHot is the 12 functions with the most CPU samples of a perf
// recording, as "percent symbol".
func perfHot(b *testing.B, data string) []string {
	out, err := exec.Command("perf", "report", "-q", "-i", data, "--stdio", "--no-children", "-g", "none", "--sort", "symbol").Output()
	if err != nil {
		b.Logf("perf report %s: %v", data, err)
		return nil
	}
	var hot []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasSuffix(f[0], "%") {
			continue
		}
		hot = append(hot, f[0]+" "+strings.Join(f[2:], " "))
		if len(hot) == 12 {
			break
		}
	}
	return hot
}

// samplePeak samples pid's /proc status value key until the returned
// function is called, which returns the largest value seen.
func samplePeak(pid int, key string) func() int64 {
	done, result := make(chan struct{}), make(chan int64)
	go func() {
		var peak int64
		for {
			if v, err := world.ReadStatusValue(pid, key); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-done:
				result <- peak
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		return <-result
	}
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
	e := startEtcd(b, dir, mib)
	e.fill(b, mib)
	return e.endpoint
}

// benchEtcd is an etcd in this process and how many MiB of values it holds.
type benchEtcd struct {
	endpoint string
	filled   int
}

// startEtcd runs a real etcd (in this process) with room for mib MiB.
func startEtcd(b *testing.B, dir string, mib int) *benchEtcd {
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
	return &benchEtcd{endpoint: client.String()}
}

// fill adds values until the database holds about mib MiB of them.
func (e *benchEtcd) fill(b *testing.B, mib int) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.endpoint}, Logger: zap.NewNop()})
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
	for i := e.filled; i < mib; i++ {
		_, _ = rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), byte(i >> 16)}).Read(val[:len(val)/2])
		if _, err := c.Put(context.Background(), fmt.Sprintf("/bench/%06d", i), string(val)); err != nil {
			b.Fatal(err)
		}
	}
	e.filled = max(e.filled, mib)
}
