package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// BenchmarkServerMemory measures the server binary's resident memory as a
// host process (no sandbox): idle after start, then the peak during an
// upload by the plugin of a real etcd snapshot of about each of
// ETCDBACKUP_BENCH_MEM_SIZES_MIB MiB (a comma list; default 256,1024; an
// etcd member is filled to each first, up to its 2 GiB quota; nothing on
// the path compresses, so its repetitive values cost what any do) and
// during its download back, to a filesystem and to an S3 location (a real
// versitygw). Each case runs in a fresh server so that its peak is the
// transfer's. The aim is a peak of at most 64 MiB for any size.
// With ETCDBACKUP_BENCH_BASELINE_BIN set to a directory of another build
// (its etcdbackup-server, built as the image's is: -trimpath -ldflags
// "-s -w"), that build runs every case too, in turns; the
// plugin is this build's for both. ETCDBACKUP_BENCH_MEM_ENV adds
// KEY=VALUE,... to the servers' environment (GOMEMLIMIT=48MiB, say).
// ETCDBACKUP_BENCH_MEM_LIMIT_MIB runs each server in a memory cgroup of
// its own (a child of this process's, v1 or v2; root only) with that
// limit, as a container's: the table then shows the cgroup's peak (which
// counts the page cache of what the server writes too) and OOM kills.
// ETCDBACKUP_BENCH_MEM_DELAY_MS puts a proxy between the plugin and the
// server that holds every byte that long each way (a far port-forward):
// the server's flow-control windows then bound the upload's throughput.
func BenchmarkServerMemory(b *testing.B) {
	sizes := []int{256, 1024}
	if v := os.Getenv("ETCDBACKUP_BENCH_MEM_SIZES_MIB"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("ETCDBACKUP_BENCH_MEM_SIZES_MIB=%q: %q is not a size in MiB", v, f)
			}
			sizes = append(sizes, n)
		}
	}
	ctx := context.Background()
	dir := b.TempDir()
	binDir := filepath.Join(dir, "bin")
	if err := buildStripped(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	s3 := s3test.Start(b)
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `locations:
  - name: default
    filesystem: {path: %s}
  - name: s3
    s3: {bucket: %s, region: %s, endpoint: %s, pathStyle: true, caBundleFile: %s, accessKeyIDFile: %s, secretAccessKeyFile: %s}
`, filepath.Join(dir, "fs"), s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile), 0o600); err != nil {
		b.Fatal(err)
	}
	builds := []string{""}
	if baseline := os.Getenv("ETCDBACKUP_BENCH_BASELINE_BIN"); baseline != "" {
		builds = append(builds, baseline)
	}
	var extraEnv []string
	if v := os.Getenv("ETCDBACKUP_BENCH_MEM_ENV"); v != "" {
		extraEnv = strings.Split(v, ",")
	}

	limitMiB := 0
	if v := os.Getenv("ETCDBACKUP_BENCH_MEM_LIMIT_MIB"); v != "" {
		var err error
		if limitMiB, err = strconv.Atoi(v); err != nil || limitMiB <= 0 {
			b.Fatalf("ETCDBACKUP_BENCH_MEM_LIMIT_MIB=%q is not a size in MiB", v)
		}
	}

	var delay time.Duration
	if v := os.Getenv("ETCDBACKUP_BENCH_MEM_DELAY_MS"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 {
			b.Fatalf("ETCDBACKUP_BENCH_MEM_DELAY_MS=%q is not a number of milliseconds", v)
		}
		delay = time.Duration(ms) * time.Millisecond
	}

	var rows []memoryRow
	for i := 0; i < b.N; i++ {
		for _, mib := range sizes {
			in := filepath.Join(dir, "in.db")
			etcdtest.SnapshotFile(b, in, mib<<20)
			for _, location := range []string{"default", "s3"} {
				order := builds
				if len(rows)%2 == 1 && len(builds) == 2 {
					order = []string{builds[1], builds[0]}
				}
				for _, build := range order {
					serverDir := binDir
					if build != "" {
						serverDir = build
					}
					name := fmt.Sprintf("m%d-%d-%s-%d", i, mib, location, len(rows))
					r := runServerMemory(ctx, b, serverDir, binDir, config, extraEnv, limitMiB, delay, in, filepath.Join(dir, "out.db"), name, location)
					r.SizeMiB, r.Location, r.Build = mib, map[string]string{"default": "filesystem", "s3": "S3"}[location], "after"
					if build != "" {
						r.Build = "before"
					}
					rows = append(rows, r)
					if r.Build == "after" {
						b.ReportMetric(float64(max(r.UpPeak, r.DownPeak))/1024, fmt.Sprintf("%s-%dMiB-peak-MiB", r.Location, mib))
					}
				}
			}
			os.Remove(in)
		}
	}
	fmt.Print("\n" + memoryTable(rows))
	for _, r := range rows {
		emitJSON(map[string]any{"bench": "server-memory", "row": r})
	}
}

// memoryRow is one transfer's measurements; sizes in KiB.
type memoryRow struct {
	Build    string `json:"build"`
	Location string `json:"location"`
	SizeMiB  int    `json:"sizeMiB"`
	// IdleRSS, IdleAnon, IdleFile: after start, before any call.
	IdleRSS  int64 `json:"idleRSS"`
	IdleAnon int64 `json:"idleAnon"`
	IdleFile int64 `json:"idleFile"`
	// StartPeak is VmHWM before the upload: start-up's peak.
	StartPeak int64 `json:"startPeak"`
	// UpPeak is VmHWM during the upload; UpAnon and UpFile the
	// largest RssAnon and RssFile sampled during it. Down* likewise for
	// the download (in another fresh server, once started).
	UpPeak   int64   `json:"upPeak"`
	UpAnon   int64   `json:"upAnon"`
	UpFile   int64   `json:"upFile"`
	UpMBs    float64 `json:"upMBs"`
	DownPeak int64   `json:"downPeak"`
	DownAnon int64   `json:"downAnon"`
	DownFile int64   `json:"downFile"`
	DownMBs  float64 `json:"downMBs"`
	// ServerCPU is the server's CPU seconds for both transfers.
	ServerCPU float64 `json:"serverCPU"`
	// With a cgroup limit (LimitMiB): the cgroup's peak usage during the
	// upload and during the download, and OOM kills in either.
	LimitMiB   int   `json:"limitMiB,omitempty"`
	UpCgroup   int64 `json:"upCgroup,omitempty"`
	DownCgroup int64 `json:"downCgroup,omitempty"`
	OOMKills   int64 `json:"oomKills,omitempty"`
}

// runServerMemory uploads in as name with the plugin from pluginDir into
// a server started from serverDir, then downloads it back from another
// fresh one (so that the download's peak is not the upload's leftover
// heap), measuring the server; the backup is deleted afterwards.
func runServerMemory(ctx context.Context, b *testing.B, serverDir, pluginDir, config string, env []string, limitMiB int, delay time.Duration, in, out, name, location string) memoryRow {
	b.Helper()
	st, err := os.Stat(in)
	if err != nil {
		b.Fatal(err)
	}
	mb := float64(st.Size()) / 1e6
	r := memoryRow{LimitMiB: limitMiB}
	serve := func(f func(addr string, pid int), cgroupPeak *int64) {
		dir := serverDir
		var cg *memCgroup
		if limitMiB > 0 {
			cg = newMemCgroup(b, name, limitMiB, serverDir)
			dir = cg.binDir
		}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			os.Setenv(k, v)
		}
		srv, err := world.StartServerArgs(ctx, dir, nil, "--config", config)
		for _, kv := range env {
			k, _, _ := strings.Cut(kv, "=")
			os.Unsetenv(k)
		}
		if err != nil {
			b.Fatal(err)
		}
		pid := childPID(b, world.ServerBinary)
		cpu0 := processCPUSeconds(pid)
		addr := srv.Addr
		if delay > 0 {
			addr = startDelayProxy(b, addr, delay)
		}
		f(addr, pid)
		r.ServerCPU += processCPUSeconds(pid) - cpu0
		if cg != nil {
			*cgroupPeak = cg.peak()
			r.OOMKills += cg.oomKills()
		}
		if err := srv.Stop(); err != nil {
			b.Fatal(err)
		}
		if cg != nil {
			cg.remove()
		}
	}
	plugin := func(addr string, args ...string) time.Duration {
		cmd := exec.CommandContext(ctx, filepath.Join(pluginDir, world.PluginBinary), append([]string{"--server-address=" + addr}, args...)...)
		start := time.Now()
		if outb, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("kubectl-etcdbackup %s: %v\n%s", strings.Join(args, " "), err, outb)
		}
		return time.Since(start)
	}
	serve(func(addr string, pid int) {
		// Let start-up garbage settle as it would in a pod waiting for
		// calls.
		time.Sleep(time.Second)
		r.IdleAnon, _ = world.ReadStatusValue(pid, "RssAnon")
		r.IdleFile, _ = world.ReadStatusValue(pid, "RssFile")
		r.IdleRSS, _ = world.ReadStatusValue(pid, "VmRSS")
		r.StartPeak, _ = world.ReadStatusValue(pid, "VmHWM")
		// From here VmHWM is the upload's: writing 5 to clear_refs resets
		// it to the current RSS.
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			b.Fatalf("reset the server's VmHWM: %v", err)
		}
		stop := sampleRSS(pid)
		up := plugin(addr, "upload", in, "--name", name, "--location", location)
		r.UpAnon, r.UpFile = stop()
		r.UpPeak, _ = world.ReadStatusValue(pid, "VmHWM")
		r.UpMBs = mb / up.Seconds()
	}, &r.UpCgroup)
	os.Remove(out)
	serve(func(addr string, pid int) {
		time.Sleep(time.Second)
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			b.Fatalf("reset the server's VmHWM: %v", err)
		}
		stop := sampleRSS(pid)
		down := plugin(addr, "download", name, "--location", location, "-o", out, "--raw")
		r.DownAnon, r.DownFile = stop()
		r.DownPeak, _ = world.ReadStatusValue(pid, "VmHWM")
		r.DownMBs = mb / down.Seconds()
		if got, err := os.Stat(out); err != nil || got.Size() != st.Size() {
			b.Fatalf("download of %s: %v (%v, want %d bytes)", name, err, got, st.Size())
		}
		os.Remove(out)
		plugin(addr, "delete", name, "--location", location, "--yes")
	}, &r.DownCgroup)
	return r
}

// sampleRSS samples pid's RssAnon and RssFile every 5 ms until the
// returned function is called, which returns the largest of each.
func sampleRSS(pid int) func() (anon, file int64) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var anon, file int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if v, err := world.ReadStatusValue(pid, "RssAnon"); err == nil {
				anon = max(anon, v)
			}
			if v, err := world.ReadStatusValue(pid, "RssFile"); err == nil {
				file = max(file, v)
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() (int64, int64) {
		close(done)
		wg.Wait()
		return anon, file
	}
}

// buildStripped builds the plugin and the server into dir as the image's
// Dockerfile does (-trimpath, -ldflags "-s -w"): the binary's size is part
// of what is resident.
func buildStripped(ctx context.Context, dir string) error {
	root, err := world.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+string(filepath.Separator),
		"./cmd/"+world.PluginBinary, "./cmd/"+world.ServerBinary)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}

func memoryTable(rows []memoryRow) string {
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	limited := len(rows) > 0 && rows[0].LimitMiB > 0
	head := "build\tlocation\tsize\tstart peak\tidle RSS (anon+file)\tupload peak\tanon\tfile\tMB/s\tdownload peak\tanon\tfile\tMB/s\tserver CPU s\t"
	if limited {
		head += "cgroup limit\tcgroup peak up\tdown\tOOM kills\t"
	}
	fmt.Fprintln(tw, head)
	m := func(kib int64) string { return fmt.Sprintf("%.1f", float64(kib)/1024) }
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d MiB\t%s\t%s (%s+%s)\t%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%.0f\t%.2f\t",
			r.Build, r.Location, r.SizeMiB, m(r.StartPeak), m(r.IdleRSS), m(r.IdleAnon), m(r.IdleFile),
			m(r.UpPeak), m(r.UpAnon), m(r.UpFile), r.UpMBs, m(r.DownPeak), m(r.DownAnon), m(r.DownFile), r.DownMBs, r.ServerCPU)
		if limited {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t", r.LimitMiB, m(r.UpCgroup), m(r.DownCgroup), r.OOMKills)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	return "server memory (MiB)\n" + sb.String()
}

// memCgroup is a memory cgroup for one server process: binDir holds an
// etcdbackup-server script that moves itself into the cgroup and then
// executes the real binary.
type memCgroup struct {
	path, binDir string
	v2           bool
}

// newMemCgroup makes a child of this process's memory cgroup limited to
// mib MiB, without swap.
func newMemCgroup(b *testing.B, name string, mib int, serverDir string) *memCgroup {
	b.Helper()
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		b.Fatal(err)
	}
	cg := &memCgroup{}
	for _, line := range strings.Split(strings.TrimSpace(string(own)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if slices.Contains(strings.Split(f[1], ","), "memory") {
			cg.path = filepath.Join("/sys/fs/cgroup/memory", f[2], "etcdbackup-bench-"+name)
			break
		}
		if f[0] == "0" && f[1] == "" {
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				cg.path, cg.v2 = filepath.Join("/sys/fs/cgroup", f[2], "etcdbackup-bench-"+name), true
			}
		}
	}
	if cg.path == "" {
		b.Fatal("no memory cgroup found in /proc/self/cgroup")
	}
	_ = os.Remove(cg.path)
	if err := os.Mkdir(cg.path, 0o755); err != nil {
		b.Fatalf("memory cgroup (root only): %v", err)
	}
	limit := strconv.Itoa(mib << 20)
	files := map[string]string{"memory.limit_in_bytes": limit}
	if cg.v2 {
		files = map[string]string{"memory.max": limit, "memory.swap.max": "0"}
	}
	for f, v := range files {
		if err := os.WriteFile(filepath.Join(cg.path, f), []byte(v), 0); err != nil && f != "memory.swap.max" {
			b.Fatalf("memory cgroup %s: %v", f, err)
		}
	}
	cg.binDir = b.TempDir()
	// The binary's pages leave the page cache first (if nothing maps
	// them), so that reading them back is charged to this cgroup, as in a
	// container started from an image.
	bin := filepath.Join(serverDir, world.ServerBinary)
	script := fmt.Sprintf("#!/bin/sh\necho $$ > %s/cgroup.procs || exit 1\ndd if=%s iflag=nocache count=0 2>/dev/null\nexec %s \"$@\"\n",
		cg.path, bin, bin)
	if err := os.WriteFile(filepath.Join(cg.binDir, world.ServerBinary), []byte(script), 0o755); err != nil {
		b.Fatal(err)
	}
	return cg
}

// peak is the cgroup's largest memory usage (anonymous and page cache) so
// far, in KiB.
func (cg *memCgroup) peak() int64 {
	f := "memory.max_usage_in_bytes"
	if cg.v2 {
		f = "memory.peak"
	}
	data, _ := os.ReadFile(filepath.Join(cg.path, f))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n >> 10
}

// oomKills is how many processes the cgroup's limit killed.
func (cg *memCgroup) oomKills() int64 {
	f, key := "memory.oom_control", "oom_kill "
	if cg.v2 {
		f, key = "memory.events", "oom_kill "
	}
	data, _ := os.ReadFile(filepath.Join(cg.path, f))
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// remove deletes the cgroup once its process has exited.
func (cg *memCgroup) remove() {
	for range 50 {
		if err := os.Remove(cg.path); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startDelayProxy forwards connections to backend, holding every read for
// delay before writing it on, in both directions.
func startDelayProxy(b *testing.B, backend string, delay time.Duration) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			go delayCopy(s, c, delay)
			go delayCopy(c, s, delay)
		}
	}()
	return lis.Addr().String()
}

func delayCopy(dst, src net.Conn, delay time.Duration) {
	type packet struct {
		at   time.Time
		data []byte
	}
	ch := make(chan packet, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- packet{time.Now().Add(delay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for p := range ch {
		time.Sleep(time.Until(p.at))
		if _, err := dst.Write(p.data); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}
