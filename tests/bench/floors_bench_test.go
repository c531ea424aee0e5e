package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/bench/floor/rawcodec"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// floorRounds is how many rounds BenchmarkFloors runs per b.N: the machine
// is noisy, so every row is a median over rounds.
const floorRounds = 3

// floorDownloadName is the backup each download round reads, stored once
// by the product and once by the floor before the rounds.
const floorDownloadName = "floors-download"

// BenchmarkFloors holds each loopback stage of a backup against its floor,
// tests/bench/floor: the least work the stage cannot avoid, in a program
// that does nothing else. On an etcd loaded with ETCDBACKUP_BENCH_DB_MIB MiB
// (default 1024) it measures, per GiB of snapshot, the CPU (user + system)
// of
//
//   - the agent binary's backup against `floor agent` (clientv3's
//     Maintenance snapshot stream, one SHA-256 pass, a gRPC client stream;
//     zstd at the agent's settings when compressed), as is and with zstd;
//   - the server binary during that backup, to a filesystem and to an S3
//     location (versitygw), against `floor serve` receiving the floor
//     agent's stream (one SHA-256 pass, the file written and fsynced once,
//     or the object put by the transfer manager at the product's default
//     part size and concurrency);
//   - the server binary while the client package downloads a stored
//     backup into this process, against `floor serve` reading the stored
//     bytes and framing them on a gRPC server stream.
//
// Product and floor alternate within each of floorRounds rounds per b.N,
// each in a fresh process; rows are medians over the rounds, with the
// processes' peak RSS (the largest of the rounds). The product's servers
// run with --check-locations=false (uncheckedServer says why). With ETCDBACKUP_BENCH_PERF
// set to a directory, every process measured runs under perf record and
// the hottest functions of the last round's are printed; perf's own cost
// is then in the numbers.
func BenchmarkFloors(b *testing.B) {
	mib := envMiB(b, "ETCDBACKUP_BENCH_DB_MIB", 1024)
	ctx := context.Background()
	dir := b.TempDir()
	binDir := filepath.Join(dir, "bin")
	if err := world.BuildBinaries(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	floorBin, err := buildFloor(ctx, binDir)
	if err != nil {
		b.Fatal(err)
	}
	binDir = uncheckedServer(b, binDir)
	s3 := s3test.Start(b)
	e := startEtcd(b, filepath.Join(dir, "etcd"), mib)
	e.fill(b, mib)
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `locations:
  - name: default
    filesystem: {path: %s}
  - name: s3
    s3: {bucket: %s, region: %s, endpoint: %s, pathStyle: true, caBundleFile: %s, accessKeyIDFile: %s, secretAccessKeyFile: %s}
`, filepath.Join(dir, "fs"), s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile), 0o600); err != nil {
		b.Fatal(err)
	}
	floorDir := filepath.Join(dir, "floor-fs")
	if err := os.Mkdir(floorDir, 0o700); err != nil {
		b.Fatal(err)
	}
	floors := map[string][]string{
		"default": {"-dir", floorDir},
		"s3": {"-s3-bucket", s3.Bucket, "-s3-region", s3.Region, "-s3-endpoint", s3.Endpoint, "-s3-ca", s3.CAFile,
			"-s3-access-key-id-file", s3.AccessKeyIDFile, "-s3-secret-access-key-file", s3.SecretAccessKeyFile},
	}

	// What the download rounds read, stored once each way; the first of
	// these backups also takes the cost of bolt's freshly written pages,
	// which the first snapshot after the fill pays.
	for _, location := range slices.Sorted(maps.Keys(floors)) {
		storeProductBackup(ctx, b, binDir, config, e.endpoint, location)
		f := startFloorServe(ctx, b, floorBin, floors[location])
		floorAgent(ctx, b, floorBin, f.addr, e.endpoint, floorDownloadName, "", "")
		f.stop(b)
	}

	perfDir := os.Getenv("ETCDBACKUP_BENCH_PERF")
	samples := map[floorKey]*floorSamples{}
	add := func(k floorKey, bytes int64, product, floor measured) {
		s := samples[k]
		if s == nil {
			s = &floorSamples{}
			samples[k] = s
		}
		gib := float64(bytes) / (1 << 30)
		s.product, s.floor = append(s.product, product.cpu/gib), append(s.floor, floor.cpu/gib)
		s.productRSS, s.floorRSS = max(s.productRSS, product.rss), max(s.floorRSS, floor.rss)
		s.productHot, s.floorHot = product.hot, floor.hot
	}
	// Which of a pair goes first alternates from pair to pair: the second
	// finds etcd's pages, and the page cache, as the first left them.
	turn := 0
	for i := 0; i < floorRounds*b.N; i++ {
		for _, c := range []struct{ location, compression string }{
			{"default", ""}, {"default", "zstd"}, {"s3", ""}, {"s3", "zstd"},
		} {
			path := floorPath(c.location, c.compression)
			name := fmt.Sprintf("f%d-%s-%s", i, c.location, map[string]string{"": "raw", "zstd": "zstd"}[c.compression])
			var product backupRow
			var floor floorRun
			runs := []func(){
				func() {
					product = runAgent(ctx, b, binDir, config, e.endpoint, name, c.location, c.compression, perfDir, "")
				},
				func() {
					floor = runFloorBackup(ctx, b, floorBin, floors[c.location], e.endpoint, c.compression, perfOut(perfDir, name+"-floor"))
				},
			}
			if turn++; turn%2 == 0 {
				runs[0], runs[1] = runs[1], runs[0]
			}
			for _, run := range runs {
				run()
			}
			if product.RawBytes != floor.rawBytes {
				b.Fatalf("%s: the agent sent %d bytes of snapshot, the floor %d", path, product.RawBytes, floor.rawBytes)
			}
			// The agent's work does not depend on the location: measured
			// on the filesystem's runs only.
			if c.location == "default" {
				add(floorKey{"agent backup", path}, floor.rawBytes, measured{product.AgentCPU, product.AgentRSS, product.AgentHot}, floor.agent)
			}
			add(floorKey{"data server upload", path}, floor.rawBytes, measured{product.ServerCPU, product.ServerRSS, product.ServerHot}, floor.server)
		}
		for _, location := range slices.Sorted(maps.Keys(floors)) {
			name := fmt.Sprintf("d%d-%s", i, location)
			var product, floor floorRun
			runs := []func(){
				func() { product = productDownload(ctx, b, binDir, config, location, perfOut(perfDir, name)) },
				func() { floor = floorDownload(ctx, b, floorBin, floors[location], perfOut(perfDir, name+"-floor")) },
			}
			if turn++; turn%2 == 0 {
				runs[0], runs[1] = runs[1], runs[0]
			}
			for _, run := range runs {
				run()
			}
			if product.rawBytes != floor.rawBytes {
				b.Fatalf("%s download: the server sent %d bytes, the floor %d", location, product.rawBytes, floor.rawBytes)
			}
			add(floorKey{"data server download", floorPath(location, "")}, floor.rawBytes, product.server, floor.server)
		}
	}

	var rows []floorRow
	for _, stage := range []string{"agent backup", "data server upload", "data server download"} {
		for _, path := range []string{floorPath("default", ""), floorPath("default", "zstd"), floorPath("s3", ""), floorPath("s3", "zstd")} {
			s := samples[floorKey{stage, path}]
			if s == nil {
				continue
			}
			r := floorRow{SizeMiB: mib, Stage: stage, Path: path, Rounds: len(s.product),
				ProductCPU: medianSeconds(s.product), FloorCPU: medianSeconds(s.floor), ProductRSS: s.productRSS, FloorRSS: s.floorRSS,
				ProductCPURounds: s.product, FloorCPURounds: s.floor, ProductHot: s.productHot, FloorHot: s.floorHot}
			r.Ratio = r.ProductCPU / r.FloorCPU
			rows = append(rows, r)
			b.ReportMetric(r.Ratio, strings.NewReplacer(" ", "-", "(", "", ")", "").Replace(stage+"-"+path)+"/floor")
		}
	}
	fmt.Print("\n" + floorTable(rows))
	for _, r := range rows {
		if len(r.ProductHot)+len(r.FloorHot) > 0 {
			fmt.Printf("\n%s, %s: hottest functions of the product, then of the floor (perf, last round)\n  %s\n  --\n  %s\n",
				r.Stage, r.Path, strings.Join(r.ProductHot, "\n  "), strings.Join(r.FloorHot, "\n  "))
		}
	}
	for _, r := range rows {
		emitJSON(map[string]any{"bench": "floors", "row": r})
	}
}

// floorRow is one stage on one path against its floor, as emitted for
// tools/benchreport: medians over the rounds of CPU seconds per GiB of
// snapshot, the largest peak RSS of the rounds.
type floorRow struct {
	SizeMiB    int     `json:"sizeMiB"`
	Stage      string  `json:"stage"`
	Path       string  `json:"path"`
	ProductCPU float64 `json:"productCPUPerGiB"`
	FloorCPU   float64 `json:"floorCPUPerGiB"`
	Ratio      float64 `json:"ratio"`
	ProductRSS int64   `json:"productPeakRSSKiB"`
	FloorRSS   int64   `json:"floorPeakRSSKiB"`
	Rounds     int     `json:"rounds"`
	// Every round's CPU per GiB, in order, for the spread the medians hide.
	ProductCPURounds []float64 `json:"productCPUPerGiBRounds"`
	FloorCPURounds   []float64 `json:"floorCPUPerGiBRounds"`
	// With ETCDBACKUP_BENCH_PERF, the hottest functions of the product's
	// process and of the floor's in the last round.
	ProductHot []string `json:"productHot,omitempty"`
	FloorHot   []string `json:"floorHot,omitempty"`
}

type floorKey struct{ stage, path string }

type floorSamples struct {
	product, floor       []float64 // CPU s/GiB, a round each
	productRSS, floorRSS int64
	productHot, floorHot []string
}

// measured is one process's part of a transfer: CPU seconds, peak RSS
// (KiB) and, under perf, its hottest functions.
type measured struct {
	cpu float64
	rss int64
	hot []string
}

// perfOut is where a run's perf recordings go, "" without perf.
func perfOut(perfDir, name string) string {
	if perfDir == "" {
		return ""
	}
	return filepath.Join(perfDir, name)
}

func floorPath(location, compression string) string {
	p := map[string]string{"default": "filesystem", "s3": "S3"}[location]
	if compression != "" {
		p += " (" + compression + ")"
	}
	return p
}

func floorTable(rows []floorRow) string {
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "size\tstage\tpath\tproduct CPU s/GiB\tfloor CPU s/GiB\tproduct/floor\tproduct peak RSS\tfloor peak RSS\trounds\t\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d MiB\t%s\t%s\t%.3f\t%.3f\t%.2f×\t%s\t%s\t%d\t\n", r.SizeMiB, r.Stage, r.Path, r.ProductCPU, r.FloorCPU, r.Ratio,
			mibOrDash(r.ProductRSS), mibOrDash(r.FloorRSS), r.Rounds)
	}
	tw.Flush()
	return "every stage against its floor (medians)\n" + sb.String()
}

func medianSeconds(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// uncheckedServer returns a directory holding binDir's agent and an
// etcdbackup-server that runs binDir's with --check-locations=false. The
// check a server makes of its locations once it listens (with an S3
// location, about 0.3 s of CPU in its first half second: probe objects
// over HTTPS) is no transfer's work, but runAgent, which measures the
// server from the moment it listens, would count it as the upload's.
func uncheckedServer(b *testing.B, binDir string) string {
	b.Helper()
	dir := b.TempDir()
	if err := os.Symlink(filepath.Join(binDir, world.AgentBinary), filepath.Join(dir, world.AgentBinary)); err != nil {
		b.Fatal(err)
	}
	// exec keeps the pid and takes the binary's name: childPID finds it.
	script := fmt.Sprintf("#!/bin/sh\nexec '%s' --check-locations=false \"$@\"\n", filepath.Join(binDir, world.ServerBinary))
	if err := os.WriteFile(filepath.Join(dir, world.ServerBinary), []byte(script), 0o755); err != nil {
		b.Fatal(err)
	}
	return dir
}

// buildFloor builds tests/bench/floor into dir, as world.BuildBinaries
// builds the product, and returns its path.
func buildFloor(ctx context.Context, dir string) (string, error) {
	root, err := world.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "floor")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./tests/bench/floor")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build the floor: %w\n%s", err, out)
	}
	return bin, nil
}

// floorRun is one transfer's measurements.
type floorRun struct {
	rawBytes      int64
	agent, server measured
}

// floorServe is a running `floor serve`.
type floorServe struct {
	addr string
	pid  int
	cmd  *exec.Cmd
}

// startFloorServe runs `floor serve ARGS` and waits for the address it
// listens on.
func startFloorServe(ctx context.Context, b *testing.B, bin string, args []string) *floorServe {
	b.Helper()
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve"}, args...)...)
	cmd.Stderr = os.Stderr
	// Die with the benchmark: no orphan server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start floor serve: %v", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		b.Fatalf("floor serve did not say where it listens: %v", err)
	}
	return &floorServe{addr: strings.TrimSpace(line), pid: cmd.Process.Pid, cmd: cmd}
}

// peakRSS is the server's VmHWM so far: a fresh process's is its
// transfer's.
func (f *floorServe) peakRSS() int64 {
	v, _ := world.ReadStatusValue(f.pid, "VmHWM")
	return v
}

// stop ends the server as the product's is ended, with SIGTERM.
func (f *floorServe) stop(b *testing.B) {
	b.Helper()
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	if err := f.cmd.Wait(); err != nil {
		b.Fatalf("floor serve: %v", err)
	}
}

// floorAgent runs `floor agent` into the floor server at addr, under perf
// record into perfData unless that is "", and returns what it measured
// and the snapshot's size.
func floorAgent(ctx context.Context, b *testing.B, bin, addr, endpoint, name, compression, perfData string) (m measured, rawBytes int64) {
	b.Helper()
	args := []string{bin, "agent", "-server", addr, "-endpoint", endpoint, "-name", name}
	if compression != "" {
		args = append(args, "-compression", compression)
	}
	if perfData != "" {
		args = append([]string{"perf", "record", "-q", "-g", "-F", "999", "-o", perfData, "--"}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var outBuf strings.Builder
	cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
	if err := cmd.Start(); err != nil {
		b.Fatalf("start floor agent: %v", err)
	}
	m.rss = sampleHWM(cmd)
	if !cmd.ProcessState.Success() {
		b.Fatalf("floor agent: %v\n%s", cmd.ProcessState, outBuf.String())
	}
	m.cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	if perfData != "" {
		m.hot = perfHot(b, perfData)
	}
	return m, logInt(outBuf.String(), `"rawSize":`)
}

// runFloorBackup runs one backup by the floor agent into a fresh floor
// server and measures both, as runAgent does the product's (under perf,
// recording into perfBase-agent.data and -server.data unless perfBase is
// ""). A file it stored is removed again, as runAgent deletes the
// product's backup; an object is replaced by the next round's.
func runFloorBackup(ctx context.Context, b *testing.B, bin string, serveArgs []string, endpoint, compression, perfBase string) floorRun {
	b.Helper()
	f := startFloorServe(ctx, b, bin, serveArgs)
	var stopPerf func() []string
	var agentPerf string
	if perfBase != "" {
		stopPerf, agentPerf = perfAttach(b, perfBase+"-server.data", f.pid), perfBase+"-agent.data"
	}
	server0 := processCPUSeconds(f.pid)
	var r floorRun
	r.agent, r.rawBytes = floorAgent(ctx, b, bin, f.addr, endpoint, "backup", compression, agentPerf)
	r.server = measured{cpu: processCPUSeconds(f.pid) - server0, rss: f.peakRSS()}
	if stopPerf != nil {
		r.server.hot = stopPerf()
	}
	f.stop(b)
	if i := slices.Index(serveArgs, "-dir"); i >= 0 {
		if err := os.Remove(filepath.Join(serveArgs[i+1], "backup.db")); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

// floorDownload downloads floorDownloadName from a fresh floor server into
// this process, discarding the bytes, and measures the server (under perf,
// recording into perfBase-server.data unless perfBase is "").
func floorDownload(ctx context.Context, b *testing.B, bin string, serveArgs []string, perfBase string) floorRun {
	b.Helper()
	f := startFloorServe(ctx, b, bin, serveArgs)
	defer f.stop(b)
	var stopPerf func() []string
	if perfBase != "" {
		stopPerf = perfAttach(b, perfBase+"-server.data", f.pid)
	}
	// The same connection options as the product's client.
	conn, err := grpc.NewClient("passthrough:///"+f.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client.DialOptions...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cpu0 := processCPUSeconds(f.pid)
	n, err := rawDownload(ctx, conn, floorDownloadName)
	if err != nil {
		b.Fatalf("floor download: %v", err)
	}
	r := floorRun{rawBytes: n, server: measured{cpu: processCPUSeconds(f.pid) - cpu0, rss: f.peakRSS()}}
	if stopPerf != nil {
		r.server.hot = stopPerf()
	}
	return r
}

// rawDownload reads the floor's download stream of name to its end and
// returns how many bytes came.
func rawDownload(ctx context.Context, conn *grpc.ClientConn, name string) (int64, error) {
	stream, err := conn.NewStream(ctx, &rawcodec.Streams[1], rawcodec.DownloadMethod, grpc.ForceCodecV2(rawcodec.Codec{}))
	if err != nil {
		return 0, fmt.Errorf("open download: %w", err)
	}
	if err := stream.SendMsg([]byte(name)); err != nil {
		return 0, fmt.Errorf("ask for %s: %w", name, err)
	}
	if err := stream.CloseSend(); err != nil {
		return 0, fmt.Errorf("ask for %s: %w", name, err)
	}
	var n int64
	var buf []byte
	for {
		err := stream.RecvMsg(&buf)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("download %s after %d bytes: %w", name, n, err)
		}
		n += int64(len(buf))
	}
}

// storeProductBackup stores floorDownloadName in location with the agent
// binary and a server that is stopped again.
func storeProductBackup(ctx context.Context, b *testing.B, binDir, config, endpoint, location string) {
	b.Helper()
	srv, err := world.StartServerArgs(ctx, binDir, nil, "--config", config)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, world.AgentBinary), "backup", "--server", srv.Addr, "--name", floorDownloadName,
		"--location", location, "--endpoint", endpoint, "--insecure-plaintext").CombinedOutput()
	if err != nil {
		b.Fatalf("agent: %v\n%s", err, out)
	}
}

// productDownload downloads floorDownloadName from location with the
// client package, from a fresh server, discarding the bytes, and measures
// the server (under perf, recording into perfBase-server.data unless
// perfBase is "").
func productDownload(ctx context.Context, b *testing.B, binDir, config, location, perfBase string) floorRun {
	b.Helper()
	srv, err := world.StartServerArgs(ctx, binDir, nil, "--config", config)
	if err != nil {
		b.Fatal(err)
	}
	pid := childPID(b, world.ServerBinary)
	var stopPerf func() []string
	if perfBase != "" {
		stopPerf = perfAttach(b, perfBase+"-server.data", pid)
	}
	conn, c, err := client.Dial(srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cpu0 := processCPUSeconds(pid)
	var n countingDiscard
	if _, err := c.Download(ctx, &n, client.DownloadRequest{Name: floorDownloadName, Location: location}); err != nil {
		b.Fatalf("download %s from %s: %v", floorDownloadName, location, err)
	}
	r := floorRun{rawBytes: int64(n), server: measured{cpu: processCPUSeconds(pid) - cpu0, rss: srv.PeakRSSKiB()}}
	if stopPerf != nil {
		r.server.hot = stopPerf()
	}
	conn.Close()
	if err := srv.Stop(); err != nil {
		b.Fatal(err)
	}
	return r
}

// countingDiscard counts what is written to it and keeps none of it.
type countingDiscard int64

func (c *countingDiscard) Write(p []byte) (int, error) {
	*c += countingDiscard(len(p))
	return len(p), nil
}
