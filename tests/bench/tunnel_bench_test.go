// Package bench holds the end-to-end benchmarks that need the sandbox: the
// real kubectl and plugin against a real kube-apiserver, kubelet and
// containerd running the product's images.
package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// snapshotSize is the backup's size, set by uploadBackup: a real etcd
// snapshot of about 1 GiB (upload sends nothing else), its database and
// etcd's 32-byte SHA-256 trailer. The raw stream is backupSize bytes, the
// database's; the 32 more are left out of MB/s.
var snapshotSize, backupSize int64

const (
	namespace  = world.DefaultNamespace
	backupName = "big"

	// sourcePod is the baseline's pod: podtool from its image, writing
	// backupSize bytes to every connection on sourcePort.
	sourcePod  = "byte-source"
	sourcePort = 8080

	// bufBytes is the read and write buffer of the baseline's ends and of
	// the pipe reader: the size of the chunks the server sends.
	bufBytes = 256 << 10
	// pipeBytes is the capacity asked for the plugin's stdout pipe, so the
	// plugin's 256 KiB writes do not each wait for this process to read.
	pipeBytes = 1 << 20
	// fSetPipeSize is F_SETPIPE_SZ (Linux), absent from package syscall.
	fSetPipeSize = 1031
	// clockTicks is USER_HZ, the unit of /proc CPU times on Linux.
	clockTicks = 100
	// rssSampleEvery is how often the plugin's VmHWM is read.
	rssSampleEvery = 10 * time.Millisecond
)

// BenchmarkTunnelDownload compares, in one run and side by side, the whole
// product path — `kubectl etcdbackup download big -o -`: kubectl execs the
// plugin, which port-forwards through the API server to the data server
// and streams a 1 GiB backup over gRPC, verifying its SHA-256 — against
// the bare tunnel: a raw 1 GiB byte stream from a pod (podtool's bytes
// mode) through the same API server, kubelet and containerd, forwarded by
// client-go's PortForwarder to a local port and read by a plain TCP reader
// that does what the plugin's download cannot avoid — one SHA-256 pass and
// writing the bytes to a file (in /dev/shm) — so that raw is the plugin
// stage's floor, and "bench process" its CPU. Both transports kubectl uses are
// compared: WebSocket (the default, SPDY tunnelled over WebSocket to the
// API server) and SPDY (KUBECTL_PORT_FORWARD_WEBSOCKETS=false). A third
// path, `download big -o FILE --parallel 4` (FILE in /dev/shm), fetches the
// backup in four ranges over four port-forwards; it is compared with the
// same single raw stream (parallel/raw).
//
//	go test -run '^$' -bench TunnelDownload -benchtime 1x ./tests/bench/
//
// MB/s and tunnel/raw are end to end: from starting kubectl (raw: from
// creating the port forwarder, which dials the API server) to the plugin's
// exit (raw: the last byte read). stream-* metrics count only first byte
// to last byte, leaving out process start, lookups and dialling.
//
// On a small machine every hop shares the same cores and the transfer is
// CPU-bound, so MB/s follows the CPU each path spends per byte; that is
// reported per process (cpu-tunnel/raw and the table), together with the
// CPU the rest of the machine used meanwhile, which is noise. A second
// round ("link-800mbit/...") runs the same paths with the node's link to
// the host limited to 800 Mbit/s, where the network limits both paths as
// it does when the API server and the kubelet are machines apart: there
// the ratio shows what the product itself costs a user's tunnel
// (ETCDBACKUP_BENCH_LINK_RATES picks the rates, "none" skips the round).
func BenchmarkTunnelDownload(b *testing.B) {
	sb := sandbox.StartForTest(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	binDir := b.TempDir()
	began := time.Now()
	if err := world.BuildBinaries(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	images, err := world.BuildImages(ctx, filepath.Join(binDir, "images"))
	if err != nil {
		b.Fatal(err)
	}
	podtool, err := sandbox.BuildBinary(ctx, "./tests/sandbox/podtool", binDir)
	if err != nil {
		b.Fatal(err)
	}
	if err := sb.LoadBinaryImage(ctx, podtoolImage, podtool); err != nil {
		b.Fatal(err)
	}
	if err := sb.ImportImages(ctx, images.Archives...); err != nil {
		b.Fatal(err)
	}
	b.Logf("built and imported the plugin, the images and podtool in %s", time.Since(began).Round(time.Millisecond))
	kubectl := world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	if err := world.InstallServer(ctx, sb, &kubectl, namespace, images, b.TempDir()); err != nil {
		b.Fatal(err)
	}
	serverPod := serverPodName(ctx, b, sb)
	probe := cpuProbe{apiserverPID: sb.APIServerPID(), serverPID: containerPID(b, sb, world.ServerBinary)}

	// The parallel download writes its file to memory where there is
	// some, so that the disk is no part of the comparison.
	outDir := b.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if outDir, err = os.MkdirTemp("/dev/shm", "tunnel-bench"); err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(outDir)
	}
	began = time.Now()
	uploadBackup(ctx, b, &kubectl, outDir)
	b.Logf("uploaded %d-byte backup %q with the plugin in %s", snapshotSize, backupName, time.Since(began).Round(time.Millisecond))

	if err := startByteSource(ctx, sb); err != nil {
		b.Fatal(err)
	}
	forwards := func() int {
		n, err1 := sb.Connections(ctx, namespace, serverPod, world.ServerPort)
		m, err2 := sb.Connections(ctx, namespace, sourcePod, sourcePort)
		if err := errors.Join(err1, err2); err != nil {
			b.Fatal(err)
		}
		return n + m
	}

	var rows []summary
	for _, link := range linkRates() {
		for _, tr := range []struct {
			name       string
			websockets bool
		}{
			{"websocket", true},
			{"spdy", false},
		} {
			name := tr.name
			if link != "" {
				name = "link-" + link + "/" + tr.name
			}
			b.Run(name, func(b *testing.B) {
				if link != "" {
					lift, err := sb.LimitNodeEgress(ctx, link)
					if err != nil {
						b.Fatal(err)
					}
					defer func() {
						if err := lift(); err != nil {
							b.Error(err)
						}
					}()
				}
				k := kubectl
				k.Env = append([]string{"KUBECTL_PORT_FORWARD_WEBSOCKETS=" + strconv.FormatBool(tr.websockets)}, pluginEnv()...)
				dialer := rawDialer(b, sb, tr.websockets)
				s := summary{transport: tr.name, link: link}
				i := 0
				for b.Loop() {
					// Alternate which path goes first, so neither always runs
					// on a warmer or a busier machine.
					if i%2 == 0 {
						s.plugin.add(runPlugin(ctx, b, forwards, probe, &k))
						s.raw.add(runRaw(ctx, b, forwards, probe, dialer, outDir))
						s.parallel.add(runPluginParallel(ctx, b, forwards, probe, &k, outDir))
					} else {
						s.parallel.add(runPluginParallel(ctx, b, forwards, probe, &k, outDir))
						s.raw.add(runRaw(ctx, b, forwards, probe, dialer, outDir))
						s.plugin.add(runPlugin(ctx, b, forwards, probe, &k))
					}
					i++
				}
				waitForwardsGone(b, forwards)
				b.ReportMetric(s.plugin.mbps(), "tunnel-MB/s")
				b.ReportMetric(s.raw.mbps(), "raw-MB/s")
				b.ReportMetric(s.plugin.mbps()/s.raw.mbps(), "tunnel/raw")
				b.ReportMetric(s.plugin.streamMBps(), "stream-tunnel-MB/s")
				b.ReportMetric(s.raw.streamMBps(), "stream-raw-MB/s")
				b.ReportMetric(s.plugin.streamMBps()/s.raw.streamMBps(), "stream-tunnel/raw")
				b.ReportMetric(s.cpuRatio(), "cpu-tunnel/raw")
				b.ReportMetric(s.plugin.peakRSSMiB(), "plugin-peak-RSS-MiB")
				b.ReportMetric(s.parallel.mbps(), "parallel-MB/s")
				b.ReportMetric(s.parallel.mbps()/s.raw.mbps(), "parallel/raw")
				b.Log("\n" + s.table())
				emitJSON(s.jsonRow())
				rows = append(rows, s)
			})
		}
	}
	// A parent benchmark's log is shown only with -v: print the summary.
	if len(rows) > 0 {
		fmt.Print(comparisonTable(rows))
	}
}

// defaultLinkRate is the network the shaped rounds stand for: about
// what a 1 Gb/s link between the API server and a node carries.
const defaultLinkRate = "800mbit"

// linkRates are the rounds to run: "" is the machine as it is, where on
// a small machine the CPUs limit both paths; each rate after it limits
// the node's link to the host (Sandbox.LimitNodeEgress), so that the
// network limits them, as in a cluster where the API server and the
// kubelet run on other machines. ETCDBACKUP_BENCH_LINK_RATES lists the
// rates (tc's notation, comma-separated; "none" for no shaped round).
func linkRates() []string {
	rates := []string{""}
	v := os.Getenv("ETCDBACKUP_BENCH_LINK_RATES")
	if v == "" {
		v = defaultLinkRate
	}
	for r := range strings.SplitSeq(v, ",") {
		if r = strings.TrimSpace(r); r != "" && r != "none" {
			rates = append(rates, r)
		}
	}
	return rates
}

// pluginEnv is ETCDBACKUP_BENCH_PLUGIN_ENV, KEY=VALUE pairs (comma
// separated) added to the environment of kubectl and the plugin it execs,
// to measure a runtime setting (GOGC=50, GOMEMLIMIT=40MiB) before it is
// made the plugin's own.
func pluginEnv() []string {
	var env []string
	for kv := range strings.SplitSeq(os.Getenv("ETCDBACKUP_BENCH_PLUGIN_ENV"), ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			env = append(env, kv)
		}
	}
	return env
}

// uploadBackup stores the backup the plugin downloads with `kubectl
// etcdbackup upload`, from a file written in dir and removed after: the
// server listens on its pod's loopback only, for port-forwards. The file
// is a real etcd snapshot of about 1 GiB (an etcd member is filled first,
// which takes a while); it sets snapshotSize and backupSize.
func uploadBackup(ctx context.Context, b *testing.B, k *world.Kubectl, dir string) {
	b.Helper()
	file := filepath.Join(dir, backupName+".upload")
	defer os.Remove(file)
	snapshotSize = int64(len(etcdtest.SnapshotFile(b, file, 1<<30)))
	backupSize = snapshotSize - sha256.Size
	if r := k.Run(ctx, "etcdbackup", "upload", file, "--name", backupName); r.ExitCode != 0 {
		b.Fatalf("kubectl etcdbackup upload: %s", r)
	}
}

// sample is one timed transfer.
type sample struct {
	wall   time.Duration // start to end, setup included
	stream time.Duration // first byte to last byte
	cpu    cpuUse
	// Plugin only: ru_maxrss of the kubectl process, which execs the
	// plugin (it includes kubectl's pre-exec peak, ~45 MiB, so above
	// that it is the plugin's), and what was sampled after the exec.
	maxRSSKiB int64
	mem       rssResult
}

// measurement accumulates the samples of one path.
type measurement struct {
	n            int
	wall, stream time.Duration
	cpu          cpuUse
	maxRSSKiB    int64
	mem          rssResult
}

func (m *measurement) add(s sample) {
	m.n++
	m.wall += s.wall
	m.stream += s.stream
	m.cpu = m.cpu.add(s.cpu)
	m.maxRSSKiB = max(m.maxRSSKiB, s.maxRSSKiB)
	m.mem = m.mem.merge(s.mem)
}

// segmentsMiB says the binary's mappings' Rss, code first.
func (m *measurement) segmentsMiB() string {
	var parts []string
	for _, p := range []string{"r-xp", "r--p", "rw-p"} {
		if v, ok := m.mem.segments[p]; ok {
			parts = append(parts, fmt.Sprintf("%s %.1f", p, float64(v)/1024))
		}
	}
	return strings.Join(parts, ", ")
}

// peakRSSMiB is the plugin's VmHWM, sampled after kubectl exec'd it:
// ru_maxrss will not do, as after vfork+exec Linux counts in it the RSS
// the parent (this benchmark's process, with its in-process etcd) had at
// the fork, which is how earlier runs reported the plugin at 106 MiB while
// this process was small and 3.7 GiB once it was large.
func (m *measurement) peakRSSMiB() float64 {
	return float64(m.mem.peakKiB) / 1024
}

func (m *measurement) mbps() float64 {
	return float64(backupSize) * float64(m.n) / m.wall.Seconds() / 1e6
}

func (m *measurement) streamMBps() float64 {
	return float64(backupSize) * float64(m.n) / m.stream.Seconds() / 1e6
}

// avg is d per run, for the table.
func (m *measurement) avg(d time.Duration) string {
	return (d / time.Duration(max(m.n, 1))).Round(10 * time.Millisecond).String()
}

// runPlugin runs `kubectl etcdbackup download big -o -` with stdout on a
// pipe this process counts, and samples the plugin's peak RSS.
func runPlugin(ctx context.Context, b *testing.B, forwards func() int, probe cpuProbe, k *world.Kubectl) sample {
	b.Helper()
	waitForwardsGone(b, forwards)
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer pr.Close()
	// Best effort: a bigger pipe means fewer wake-ups on both sides.
	_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, pw.Fd(), fSetPipeSize, pipeBytes)
	cmd := k.Command(ctx, "etcdbackup", "download", backupName, "-o", "-")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = pw, &stderr

	cpu0 := probe.snapshot()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		pw.Close()
		b.Fatal(err)
	}
	pw.Close()
	rss := startRSSSampler(cmd.Process.Pid)
	got, first, last, rerr := readCounting(pr, snapshotSize+1, io.Discard)
	werr := cmd.Wait()
	wall := time.Since(start)
	cpu := probe.snapshot().since(cpu0)
	mem := rss.stop()
	if werr != nil || rerr != nil {
		b.Fatalf("kubectl etcdbackup download: %v (read: %v)\nstderr:\n%s", werr, rerr, stderr.String())
	}
	if got != snapshotSize {
		b.Fatalf("kubectl etcdbackup download wrote %d bytes, want %d\nstderr:\n%s", got, snapshotSize, stderr.String())
	}
	// kubectl runs a plugin with execve on Linux: the child kubectl
	// becomes the plugin, same pid.
	if mem.image != world.PluginBinary {
		b.Fatalf("process %d ran %q, not the plugin: kubectl did not exec it", cmd.Process.Pid, mem.image)
	}
	cpu.plugin = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return sample{
		wall:      wall,
		stream:    last.Sub(first),
		cpu:       cpu,
		maxRSSKiB: world.PeakRSSKiB(cmd),
		mem:       mem,
	}
}

// parallelRanges is what the parallel measurement asks for: the default
// for a backup of this size.
const parallelRanges = 4

// runPluginParallel runs `kubectl etcdbackup download big -o FILE
// --parallel 4`: four port-forwards, each fetching a quarter into the
// file, the whole SHA-256 and the snapshot checks on the complete file.
func runPluginParallel(ctx context.Context, b *testing.B, forwards func() int, probe cpuProbe, k *world.Kubectl, dir string) sample {
	b.Helper()
	waitForwardsGone(b, forwards)
	out := filepath.Join(dir, backupName)
	defer os.Remove(out)
	cmd := k.Command(ctx, "etcdbackup", "download", backupName, "-o", out, "--parallel", strconv.Itoa(parallelRanges))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cpu0 := probe.snapshot()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	rss := startRSSSampler(cmd.Process.Pid)
	werr := cmd.Wait()
	wall := time.Since(start)
	cpu := probe.snapshot().since(cpu0)
	mem := rss.stop()
	if werr != nil {
		b.Fatalf("kubectl etcdbackup download --parallel: %v\nstderr:\n%s", werr, stderr.String())
	}
	if st, err := os.Stat(out); err != nil || st.Size() != snapshotSize {
		b.Fatalf("kubectl etcdbackup download --parallel wrote %v (%v), want %d bytes\nstderr:\n%s", st, err, snapshotSize, stderr.String())
	}
	cpu.plugin = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return sample{wall: wall, stream: wall, cpu: cpu, maxRSSKiB: world.PeakRSSKiB(cmd), mem: mem}
}

// rssSampler polls /proc/PID/status for VmHWM while the plugin runs. The
// high-water mark only grows, so the last sample is the peak up to at most
// rssSampleEvery before the exit.
type rssSampler struct {
	done   chan struct{}
	result chan rssResult
}

type rssResult struct {
	peakKiB int64
	image   string
	// anonKiB and fileKiB are the largest RssAnon and RssFile sampled:
	// the heap and stacks, and the pages of the binary it touched.
	anonKiB, fileKiB int64
	// segments is the largest Rss of each of the binary's mappings, by
	// permissions (r-xp: code; r--p: read-only data, type and line
	// tables; rw-p: data), from /proc/PID/smaps.
	segments map[string]int64
}

func startRSSSampler(pid int) *rssSampler {
	s := &rssSampler{done: make(chan struct{}), result: make(chan rssResult, 1)}
	go func() {
		var r rssResult
		t := time.NewTicker(rssSampleEvery)
		defer t.Stop()
		for ticks := 0; ; ticks++ {
			// Only samples of the plugin's image count: before the exec
			// the process is kubectl.
			if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && filepath.Base(exe) == world.PluginBinary {
				now := rssResult{image: world.PluginBinary}
				now.peakKiB, _ = world.ReadStatusValue(pid, "VmHWM")
				now.anonKiB, _ = world.ReadStatusValue(pid, "RssAnon")
				now.fileKiB, _ = world.ReadStatusValue(pid, "RssFile")
				if ticks%smapsEvery == 0 {
					now.segments = binarySegments(pid)
				}
				r = r.merge(now)
			}
			select {
			case <-s.done:
				s.result <- r
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// smapsEvery is how many RSS samples go by between two reads of smaps,
// which is long.
const smapsEvery = 20

// merge is the larger of r's and o's values, each on its own (the image
// is o's, when r has none).
func (r rssResult) merge(o rssResult) rssResult {
	r.peakKiB, r.anonKiB, r.fileKiB = max(r.peakKiB, o.peakKiB), max(r.anonKiB, o.anonKiB), max(r.fileKiB, o.fileKiB)
	if r.image == "" {
		r.image = o.image
	}
	if len(o.segments) > 0 {
		r.segments = maps.Clone(r.segments)
		if r.segments == nil {
			r.segments = map[string]int64{}
		}
		for k, v := range o.segments {
			r.segments[k] = max(r.segments[k], v)
		}
	}
	return r
}

// binarySegments is the Rss (KiB) of each mapping of the plugin's binary
// in /proc/PID/smaps, keyed by its permissions; nil if it cannot be read.
func binarySegments(pid int) map[string]int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		return nil
	}
	seen := map[string]int64{}
	var perms string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			// A mapping's header: "ADDR-ADDR PERMS OFFSET DEV INODE
			// [PATH]".
			perms = ""
			if len(f) >= 6 && filepath.Base(f[5]) == world.PluginBinary {
				perms = f[1]
			}
		case len(f) == 3 && f[0] == "Rss:" && perms != "":
			if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				seen[perms] = max(seen[perms], v)
			}
		}
	}
	return seen
}

func (s *rssSampler) stop() rssResult {
	close(s.done)
	return <-s.result
}

// rawDialer is the port-forward dialer kubectl would use: WebSocket with
// SPDY as fallback, or SPDY alone (see tunnel.Dialer.streamDialer).
func rawDialer(b *testing.B, sb *sandbox.Sandbox, websockets bool) streamhttp.Dialer {
	b.Helper()
	cfg := sb.RESTConfig()
	u := sb.Client().CoreV1().RESTClient().Post().
		Resource("pods").Namespace(namespace).Name(sourcePod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	if !websockets {
		return dialer
	}
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return portforward.NewFallbackDialerForStreaming(ws, dialer, func(err error) bool {
		return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
	})
}

// runRaw forwards a local port to the byte source's pod with client-go's
// PortForwarder, as `kubectl port-forward` does, and reads backupSize
// bytes from it with a plain TCP reader.
func runRaw(ctx context.Context, b *testing.B, forwards func() int, probe cpuProbe, dialer streamhttp.Dialer, dir string) sample {
	b.Helper()
	waitForwardsGone(b, forwards)
	// The floor of the plugin's download: the bytes hashed once and
	// written to a file, as the plugin does to its output.
	out, err := os.CreateTemp(dir, "raw-*.db")
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		out.Close()
		os.Remove(out.Name())
	}()
	sum := sha256.New()
	cpu0 := probe.snapshot()
	start := time.Now()
	fctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	pf, err := portforward.NewOnAddressesForStreamingWithContext(fctx, dialer, []string{"127.0.0.1"},
		[]string{"0:" + strconv.Itoa(sourcePort)}, ready, io.Discard, io.Discard)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	forwardErr := make(chan error, 1)
	go func() { forwardErr <- pf.ForwardPorts() }()
	defer func() {
		cancel()
		select {
		case <-forwardErr:
		case <-time.After(10 * time.Second):
			b.Error("port forwarder did not stop within 10s")
		}
	}()
	select {
	case <-ready:
	case err := <-forwardErr:
		forwardErr <- err // for the deferred wait
		b.Fatalf("port-forward to %s failed: %v", sourcePod, err)
	case <-time.After(30 * time.Second):
		b.Fatal("port-forward not ready after 30s")
	}
	ports, err := pf.GetPorts()
	if err != nil {
		b.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[0].Local)), 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	// Timing stops at the last byte: after it, containerd waits up to 1 s
	// for the other direction before it closes, which is no part of the
	// transfer.
	got, first, last, rerr := readCounting(conn, backupSize, io.MultiWriter(sum, out))
	wall := time.Since(start)
	cpu := probe.snapshot().since(cpu0)
	if got != backupSize {
		b.Fatalf("raw port-forward: read %d of %d bytes: %v", got, backupSize, rerr)
	}
	return sample{wall: wall, stream: last.Sub(first), cpu: cpu}
}

// readCounting reads r into sink with a 256 KiB buffer until EOF or
// limit bytes, and returns the count and when the first and last bytes
// arrived.
func readCounting(r io.Reader, limit int64, sink io.Writer) (n int64, first, last time.Time, err error) {
	buf := make([]byte, bufBytes)
	for n < limit {
		k, rerr := r.Read(buf[:min(int64(len(buf)), limit-n)])
		if k > 0 {
			last = time.Now()
			if n == 0 {
				first = last
			}
			n += int64(k)
			if _, werr := sink.Write(buf[:k]); werr != nil {
				return n, first, last, werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, first, last, nil
		}
		if rerr != nil {
			return n, first, last, rerr
		}
	}
	return n, first, last, nil
}

// waitForwardsGone lets the forwarded connections of the previous
// measurement wind down, so teardown never overlaps a timed transfer.
func waitForwardsGone(b *testing.B, forwards func() int) {
	b.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for n := forwards(); n > 0; n = forwards() {
		if time.Now().After(deadline) {
			b.Fatalf("%d forwarded connections still open in the pods after 15s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cpuUse is the CPU time (user+system) a transfer cost, by process.
type cpuUse struct {
	plugin    time.Duration // kubectl, then the plugin it execs (plugin path)
	apiserver time.Duration // kube-apiserver
	server    time.Duration // etcdbackup-server
	// bench is this process: the sandbox's in-process etcd, plus the raw
	// path's port forwarder and reader, or the plugin path's stdout reader.
	// The node's kubelet and containerd count in the rest of the machine.
	bench time.Duration
	// machine is the busy time of all CPUs (/proc/stat), kernel work and
	// every other process on the machine included; steal is what the
	// hypervisor took.
	machine, steal time.Duration
}

// path is what the path's own processes used.
func (c cpuUse) path() time.Duration { return c.plugin + c.apiserver + c.server + c.bench }

// rest is what the machine did meanwhile besides those processes: other
// tenants, unattributed kernel work. Large values mean a noisy run.
func (c cpuUse) rest() time.Duration { return max(0, c.machine-c.path()) }

func (c cpuUse) add(o cpuUse) cpuUse {
	return cpuUse{c.plugin + o.plugin, c.apiserver + o.apiserver, c.server + o.server, c.bench + o.bench, c.machine + o.machine, c.steal + o.steal}
}

// cpuProbe reads the CPU counters of the processes of both paths.
type cpuProbe struct{ apiserverPID, serverPID int }

type cpuSnapshot struct{ apiserver, server, bench, machine, steal time.Duration }

func (p cpuProbe) snapshot() cpuSnapshot {
	s := cpuSnapshot{apiserver: processCPU(p.apiserverPID), server: processCPU(p.serverPID)}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.bench = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.machine, s.steal = machineCPU()
	return s
}

func (s cpuSnapshot) since(o cpuSnapshot) cpuUse {
	return cpuUse{apiserver: s.apiserver - o.apiserver, server: s.server - o.server, bench: s.bench - o.bench,
		machine: s.machine - o.machine, steal: s.steal - o.steal}
}

// processCPU is the user+system time a process has used so far, from
// /proc/PID/stat; 0 if it cannot be read.
func processCPU(pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name is in parentheses and may contain spaces; after
	// it come state (field 3) ... utime (14) and stime (15).
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0
	}
	return ticks(f[11]) + ticks(f[12])
}

// machineCPU is the busy (user, nice, system, irq, softirq) and stolen
// time of all CPUs so far, from /proc/stat.
func machineCPU() (busy, steal time.Duration) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	return ticks(f[1]) + ticks(f[2]) + ticks(f[3]) + ticks(f[6]) + ticks(f[7]), ticks(f[8])
}

func ticks(s string) time.Duration {
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Duration(n) * time.Second / clockTicks
}

// containerPID finds the process of a container on the node running
// binary name (its image's entrypoint).
func containerPID(b *testing.B, sb *sandbox.Sandbox, name string) int {
	b.Helper()
	for _, pid := range sb.ContainerPIDs() {
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && filepath.Base(exe) == name {
			return pid
		}
	}
	b.Fatalf("no container process %s found", name)
	return 0
}

// serverPodName is the installed server's pod.
func serverPodName(ctx context.Context, b *testing.B, sb *sandbox.Sandbox) string {
	b.Helper()
	name, _ := serverPodAddr(ctx, b, sb)
	return name
}

// serverPodAddr is the installed server's pod and its gRPC address on the
// pod network.
func serverPodAddr(ctx context.Context, b *testing.B, sb *sandbox.Sandbox) (string, string) {
	b.Helper()
	pods, err := sb.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=etcdbackup-server"})
	if err != nil || len(pods.Items) != 1 {
		b.Fatalf("server pods: %v %v", pods, err)
	}
	p := pods.Items[0]
	return p.Name, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(world.ServerPort))
}

// podtoolImage is the sandbox's test tool as an image; its bytes mode is
// the baseline's byte source.
const podtoolImage = "sandbox.local/podtool:bench"

// startByteSource runs the baseline's pod: podtool writing backupSize
// bytes to every connection on sourcePort, from its image, on the node.
func startByteSource(ctx context.Context, sb *sandbox.Sandbox) error {
	_, err := sb.Client().CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sourcePod, Labels: map[string]string{"app.kubernetes.io/name": "byte-source"}},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "bytes",
				Image:           podtoolImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"bytes", "--listen=:" + strconv.Itoa(sourcePort), "--size=" + strconv.FormatInt(backupSize, 10)},
				Ports:           []corev1.ContainerPort{{Name: "bytes", ContainerPort: sourcePort}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("byte source pod: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err = sb.WaitForPod(wctx, namespace, sourcePod, sandbox.PodReady)
	return err
}

// summary is one transport's result.
type summary struct {
	transport             string
	link                  string // the node link's rate; "" when not limited
	plugin, raw, parallel measurement
}

// tunnelPath is one path of a tunnelRow: MB/s end to end and CPU
// seconds per GiB by process.
type tunnelPath struct {
	MBps       float64 `json:"mbps"`
	StreamMBps float64 `json:"streamMBps"`
	CPU        float64 `json:"cpuPerGiB"`
	Plugin     float64 `json:"pluginCPUPerGiB"`
	APIServer  float64 `json:"apiserverCPUPerGiB"`
	Server     float64 `json:"serverCPUPerGiB"`
	Bench      float64 `json:"benchCPUPerGiB"`
	Rest       float64 `json:"restCPUPerGiB"`
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	// PeakAnonMiB and PeakFileMiB split it: the largest RssAnon (heap,
	// stacks) and RssFile (the binary's pages) sampled.
	PeakAnonMiB float64 `json:"peakAnonMiB,omitempty"`
	PeakFileMiB float64 `json:"peakFileMiB,omitempty"`
}

// tunnelRow is what tools/benchreport reads of one transport and link.
type tunnelRow struct {
	Bench     string     `json:"bench"` // "tunnel"
	Transport string     `json:"transport"`
	Link      string     `json:"link"`
	Runs      int        `json:"runs"`
	Plugin    tunnelPath `json:"plugin"`
	Parallel  tunnelPath `json:"parallel"`
	Raw       tunnelPath `json:"raw"`
}

func (m *measurement) jsonPath() tunnelPath {
	perGiB := func(d time.Duration) float64 {
		return d.Seconds() / float64(max(m.n, 1)) / (float64(backupSize) / (1 << 30))
	}
	return tunnelPath{
		MBps: m.mbps(), StreamMBps: m.streamMBps(),
		CPU: perGiB(m.cpu.path()), Plugin: perGiB(m.cpu.plugin), APIServer: perGiB(m.cpu.apiserver),
		Server: perGiB(m.cpu.server), Bench: perGiB(m.cpu.bench), Rest: perGiB(m.cpu.rest()),
		PeakRSSMiB: m.peakRSSMiB(), PeakAnonMiB: float64(m.mem.anonKiB) / 1024, PeakFileMiB: float64(m.mem.fileKiB) / 1024,
	}
}

func (s *summary) jsonRow() tunnelRow {
	return tunnelRow{Bench: "tunnel", Transport: s.transport, Link: s.link, Runs: s.plugin.n,
		Plugin: s.plugin.jsonPath(), Parallel: s.parallel.jsonPath(), Raw: s.raw.jsonPath()}
}

// label names the transport and the link: "spdy", "spdy, 800mbit link".
func (s *summary) label() string {
	if s.link == "" {
		return s.transport
	}
	return s.transport + ", " + s.link + " link"
}

func (s *summary) cpuRatio() float64 {
	return s.plugin.cpu.path().Seconds() / s.raw.cpu.path().Seconds()
}

func (s *summary) table() string {
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s, 1 GiB, per run (%d each)\tMB/s\tstream MB/s\twall\tCPU\tkubectl+plugin\tAPI server\tdata server\tbench process\trest of machine\tsteal\t\n", s.label(), s.plugin.n)
	for _, r := range []struct {
		name string
		m    *measurement
	}{{"kubectl etcdbackup download -o -", &s.plugin}, {"download -o FILE --parallel 4", &s.parallel}, {"raw port-forward stream", &s.raw}} {
		m, c := r.m, r.m.cpu
		fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.name, m.mbps(), m.streamMBps(), m.avg(m.wall),
			m.avg(c.path()), m.avg(c.plugin), m.avg(c.apiserver), m.avg(c.server), m.avg(c.bench), m.avg(c.rest()), m.avg(c.steal))
	}
	ratio := func(a, b time.Duration) string {
		if b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", a.Seconds()/b.Seconds())
	}
	p, r := s.plugin.cpu, s.raw.cpu
	fmt.Fprintf(w, "tunnel/raw\t%.2f\t%.2f\t\t%s\t\t%s\t\t\t\t\t\n", s.plugin.mbps()/s.raw.mbps(), s.plugin.streamMBps()/s.raw.streamMBps(),
		ratio(p.path(), r.path()), ratio(p.apiserver, r.apiserver))
	fmt.Fprintf(w, "parallel/raw\t%.2f\t\t\t%s\t\t%s\t\t\t\t\t\n", s.parallel.mbps()/s.raw.mbps(),
		ratio(s.parallel.cpu.path(), r.path()), ratio(s.parallel.cpu.apiserver, r.apiserver))
	w.Flush()
	fmt.Fprintf(&buf, "CPU: user+system of the path's processes, on %d CPUs. Plugin peak RSS (VmHWM sampled after exec): download -o - %.1f MiB (anonymous %.1f, the binary's pages %.1f: %s), --parallel %d %.1f MiB (%.1f, %.1f) (ru_maxrss, which counts the parent's: %.1f MiB).\n",
		runtime.NumCPU(), s.plugin.peakRSSMiB(), float64(s.plugin.mem.anonKiB)/1024, float64(s.plugin.mem.fileKiB)/1024, s.plugin.segmentsMiB(),
		parallelRanges, s.parallel.peakRSSMiB(), float64(s.parallel.mem.anonKiB)/1024, float64(s.parallel.mem.fileKiB)/1024, float64(s.plugin.maxRSSKiB)/1024)
	return buf.String()
}

func comparisonTable(rows []summary) string {
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "BenchmarkTunnelDownload, 1 GiB\tplugin MB/s\tparallel MB/s\traw MB/s\ttunnel/raw\tparallel/raw\tstream tunnel/raw\tCPU tunnel/raw\tplugin peak RSS\tparallel peak RSS\t")
	for _, s := range rows {
		fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f MiB\t%.1f MiB\t\n", s.label(), s.plugin.mbps(), s.parallel.mbps(), s.raw.mbps(),
			s.plugin.mbps()/s.raw.mbps(), s.parallel.mbps()/s.raw.mbps(), s.plugin.streamMBps()/s.raw.streamMBps(), s.cpuRatio(), s.plugin.peakRSSMiB(), s.parallel.peakRSSMiB())
	}
	w.Flush()
	return buf.String()
}
