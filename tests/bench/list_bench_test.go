package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// The list benchmark's sizes: list is timed at each number of backups
// (ETCDBACKUP_BENCH_LIST_SIZES, a comma list), half of them in the
// filesystem location, half in S3; at listHeadline it is timed against
// `kubectl get pods` in listPairs interleaved pairs, at the others in
// listScalePairs.
const (
	listHeadline   = 1000
	listPairs      = 9
	listScalePairs = 3
	listPause      = 250 * time.Millisecond
	// listTraceRuns: runs of the plugin built with -tags
	// etcdbackup_trace, on its own, to say where its time goes.
	listTraceRuns = 7
	// serverUID owns what the server pod writes (manifests/server.yaml's
	// runAsUser and fsGroup).
	serverUID = 65532
)

// BenchmarkList compares the latency a user feels of `kubectl etcdbackup
// list` with `kubectl get pods` in the same namespace, the product
// installed as a user would (a filesystem location and an S3 location on
// a real S3 server): each a whole kubectl process, from exec to exit,
// interleaved in one run (the order alternating), after a warm-up of each
// (kubectl's discovery cache and the plugin's hint of the server pod
// filled, as they are on a user's machine), each list after a pause
// (listPause). The backups are stored straight into the two locations
// (half each), as many as each size asks, growing from one size to the
// next: the table says how list grows with the backups. At 1,000 the
// plugin built with the trace tag is run on its own too, and its phases
// (process start to initialised, server found, port-forward open, listed,
// printed, exit) are reported with kubectl's own start (`kubectl version
// --client`), which a plugin's run pays before the plugin is exec'd. The
// aim is list/get-pods ≤ 1.3 at 1,000 backups. With
// ETCDBACKUP_BENCH_BASELINE_PLUGIN naming another build of the plugin,
// that one's list is timed in every round too.
//
//	go test -run '^$' -bench List -benchtime 1x ./tests/bench/
func BenchmarkList(b *testing.B) {
	sizes := listSizes(b)
	sb := sandbox.StartForTest(b)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()

	dir := b.TempDir()
	binDir := filepath.Join(dir, "bin")
	// As the release builds the plugin (stripped): its size is part of
	// its start.
	if err := buildStripped(ctx, binDir); err != nil {
		b.Fatal(err)
	}
	traceDir := filepath.Join(dir, "trace")
	if err := buildTracePlugin(ctx, traceDir); err != nil {
		b.Fatal(err)
	}
	images := importProductImages(ctx, b, sb, dir)
	kubectl := world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	product, err := world.InstallProduct(ctx, sb, &kubectl, images, filepath.Join(dir, "product"), os.Stderr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(product.Stop)
	fsDir, err := sb.VolumePath(ctx, world.DefaultNamespace, "etcdbackup-data")
	if err != nil {
		b.Fatal(err)
	}
	stores, err := openListStores(ctx, fsDir, product)
	if err != nil {
		b.Fatal(err)
	}

	ns := world.DefaultNamespace
	run := func(k *world.Kubectl, want int, args ...string) time.Duration {
		if args[0] == "etcdbackup" {
			// The server's ListBackups asks the API server for each
			// location's backup Jobs, through a rate-limited client-go
			// client: lists back to back, as these rounds run them and no
			// user does, would time that limiter, not a list.
			time.Sleep(listPause)
		}
		start := time.Now()
		r := k.Run(ctx, args...)
		d := time.Since(start)
		if r.ExitCode != 0 {
			b.Fatalf("kubectl %s: %s", strings.Join(args, " "), r)
		}
		if args[0] == "etcdbackup" {
			if n := strings.Count(r.Stdout, "\n"+listPrefix); n != want {
				b.Fatalf("kubectl etcdbackup list printed %d of the benchmark's backups, want %d:\n%.2000s", n, want, r.Stdout)
			}
		}
		return d
	}
	list := []string{"etcdbackup", "list", "-n", ns}
	pods := []string{"get", "pods", "-n", ns}
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

	var result listResult
	stored := 0
	for b.Loop() {
		for _, n := range sizes {
			start := time.Now()
			if err := stores.fill(ctx, stored, n); err != nil {
				b.Fatal(err)
			}
			b.Logf("stored backups %d to %d in %s", stored, n, time.Since(start).Round(time.Second))
			stored = max(stored, n)
			pairs := listScalePairs
			if n == listHeadline {
				pairs = listPairs
			}
			// Warm-up: the server's first listing of S3 reads every
			// manifest; later ones only those whose ETag changed.
			run(&kubectl, n, list...)
			run(&kubectl, n, pods...)
			var listTimes, podTimes, baseTimes []time.Duration
			for i := range pairs {
				if i%2 == 0 {
					listTimes = append(listTimes, run(&kubectl, n, list...))
					podTimes = append(podTimes, run(&kubectl, n, pods...))
				} else {
					podTimes = append(podTimes, run(&kubectl, n, pods...))
					listTimes = append(listTimes, run(&kubectl, n, list...))
				}
				if baseline != nil {
					baseTimes = append(baseTimes, run(baseline, n, list...))
				}
			}
			r := listSize{Backups: n, Pairs: pairs, ListMs: ms(listTimes), GetPodsMs: ms(podTimes),
				ListMedianMs: median(listTimes).Seconds() * 1000, GetPodsMedianMs: median(podTimes).Seconds() * 1000}
			r.Ratio = r.ListMedianMs / r.GetPodsMedianMs
			if baseline != nil {
				r.BaselineMs, r.BaselineMedianMs = ms(baseTimes), median(baseTimes).Seconds()*1000
			}
			if n == listHeadline {
				result.listSize = r
				result.Phases = tracePhases(ctx, b, &kubectl, traceDir, n)
			}
			result.Scale = append(result.Scale, r)
			b.ReportMetric(r.Ratio, fmt.Sprintf("list/get-pods-%d", n))
		}
	}
	fmt.Print("\n" + listTable(result))
	result.Bench = "list"
	emitJSON(result)
}

// listPrefix begins the names of the benchmark's backups.
const listPrefix = "bench-"

// listSize is list timed at one number of backups.
type listSize struct {
	Backups         int       `json:"backups"`
	Pairs           int       `json:"pairs"`
	ListMs          []float64 `json:"listMs"`
	GetPodsMs       []float64 `json:"getPodsMs"`
	ListMedianMs    float64   `json:"listMedianMs"`
	GetPodsMedianMs float64   `json:"getPodsMedianMs"`
	Ratio           float64   `json:"ratio"`
	// Baseline*: another build of the plugin timed in the same rounds.
	BaselineMs       []float64 `json:"baselineMs,omitempty"`
	BaselineMedianMs float64   `json:"baselineMedianMs,omitempty"`
}

// listResult is BenchmarkList's: the headline size's times (inlined),
// every size's, and where the plugin's time goes.
type listResult struct {
	// Bench names the line's benchmark for tools/benchreport.
	Bench string `json:"bench"`
	listSize
	Scale  []listSize  `json:"scale"`
	Phases []listPhase `json:"phases"`
}

// listPhase is one phase of the traced plugin's run: the median time
// from exec to its end.
type listPhase struct {
	Phase string  `json:"phase"`
	Ms    float64 `json:"ms"`
}

func listSizes(b *testing.B) []int {
	v := os.Getenv("ETCDBACKUP_BENCH_LIST_SIZES")
	if v == "" {
		return []int{100, listHeadline, 10000}
	}
	var sizes []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("ETCDBACKUP_BENCH_LIST_SIZES=%q: %q is not a number of backups", v, f)
		}
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	return sizes
}

// listStores are the product's two locations, opened from this process:
// the filesystem location's volume on the node, and the S3 location.
type listStores struct {
	fsDir string
	fs    storage.Location
	s3    storage.Location
}

func openListStores(ctx context.Context, fsDir string, p *world.Product) (*listStores, error) {
	// Shared: the server writes there too, and New would clear its
	// uploads in progress.
	f, err := filesystem.NewShared(fsDir)
	if err != nil {
		return nil, err
	}
	loc, err := s3.New(ctx, p.S3.Config("sandbox"))
	if err != nil {
		return nil, err
	}
	return &listStores{fsDir: fsDir, fs: f, s3: loc}, nil
}

// fill stores backups from up to to (exclusive), alternating between the
// two locations, as an agent would have left them (a manifest each and a
// few bytes of data: list reads manifests only), then gives the
// filesystem location's new files to the server's user.
func (s *listStores) fill(ctx context.Context, from, to int) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := from; i < to; i++ {
		loc := s.fs
		if i%2 == 1 {
			loc = s.s3
		}
		g.Go(func() error {
			name := fmt.Sprintf("%s%05d", listPrefix, i)
			data := []byte("data of " + name)
			m := &storage.Manifest{Name: name, Size: int64(len(data)), SHA256: sha256Hex(data),
				CreateTime: created.Add(time.Duration(i) * time.Minute),
				Source:     storage.Source{Kind: ebv1.SourceAgent, Target: "control-plane"},
				Labels:     map[string]string{"bench": "list"}}
			up, err := loc.Create(gctx, name)
			if err != nil {
				return fmt.Errorf("store %s: %w", name, err)
			}
			if _, err := up.Write(data); err != nil {
				return fmt.Errorf("store %s: %w", name, err)
			}
			if err := up.Commit(gctx, m); err != nil {
				return fmt.Errorf("store %s: %w", name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return filepath.WalkDir(s.fsDir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, serverUID, serverUID)
	})
}

// buildTracePlugin builds the plugin with its phase trace (-tags
// etcdbackup_trace), otherwise as the release does.
func buildTracePlugin(ctx context.Context, dir string) error {
	root, err := world.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", "etcdbackup_trace", "-ldflags", "-s -w",
		"-o", dir+string(filepath.Separator), "./cmd/"+world.PluginBinary)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build -tags etcdbackup_trace: %v\n%s", err, out)
	}
	return nil
}

// tracePhases runs the traced plugin on its own (not through kubectl)
// listTraceRuns times and returns the median time from its exec to the
// end of each phase, after kubectl's own start and exit
// (`kubectl version --client`), which every plugin run pays first.
func tracePhases(ctx context.Context, b *testing.B, k *world.Kubectl, traceDir string, want int) []listPhase {
	b.Helper()
	byPhase := map[string][]time.Duration{}
	var order []string
	add := func(phase string, d time.Duration) {
		if _, ok := byPhase[phase]; !ok {
			order = append(order, phase)
		}
		byPhase[phase] = append(byPhase[phase], d)
	}
	for range listTraceRuns {
		start := time.Now()
		if r := k.Run(ctx, "version", "--client"); r.ExitCode != 0 {
			b.Fatalf("kubectl version --client: %s", r)
		}
		add("kubectl version --client (kubectl's own start and exit)", time.Since(start))
	}
	for range listTraceRuns {
		time.Sleep(listPause)
		cmd := k.Command(ctx, "list", "-n", world.DefaultNamespace)
		cmd.Path, cmd.Err = filepath.Join(traceDir, world.PluginBinary), nil
		cmd.Args[0] = cmd.Path
		cmd.Env = append(cmd.Env, "KUBECTL_ETCDBACKUP_TRACE=1")
		start := time.Now()
		r := world.RunCommand(cmd)
		end := time.Since(start)
		if r.ExitCode != 0 {
			b.Fatalf("traced plugin list: %s", r)
		}
		if n := strings.Count(r.Stdout, "\n"+listPrefix); n != want {
			b.Fatalf("traced plugin list printed %d of the benchmark's backups, want %d", n, want)
		}
		sc := bufio.NewScanner(strings.NewReader(r.Stderr))
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 3)
			if len(f) != 3 || f[0] != "etcdbackup-trace" {
				continue
			}
			us, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				continue
			}
			if strings.HasPrefix(f[2], "tunnel: ") || strings.HasPrefix(f[2], "http: ") {
				// Each of the connection's reads and writes: not phases.
				continue
			}
			add("plugin: "+f[2], time.UnixMicro(us).Sub(start))
		}
		add("plugin: exit", end)
	}
	var out []listPhase
	for _, p := range order {
		out = append(out, listPhase{Phase: p, Ms: median(byPhase[p]).Seconds() * 1000})
	}
	return out
}

func listTable(r listResult) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "kubectl etcdbackup list (%d backups, two locations): median %.0f ms; kubectl get pods: median %.0f ms; ratio %.2f (aim ≤ 1.3)\n",
		r.Backups, r.ListMedianMs, r.GetPodsMedianMs, r.Ratio)
	if r.BaselineMedianMs > 0 {
		fmt.Fprintf(&sb, "baseline plugin: median %.0f ms; ratio %.2f\n", r.BaselineMedianMs, r.BaselineMedianMs/r.GetPodsMedianMs)
	}
	tw := tabwriter.NewWriter(&sb, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "backups\tlist ms\tget pods ms\tratio\t\n")
	for _, s := range r.Scale {
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.2f\t\n", s.Backups, s.ListMedianMs, s.GetPodsMedianMs, s.Ratio)
	}
	tw.Flush()
	for _, p := range r.Phases {
		fmt.Fprintf(&sb, "  %6.1f ms  %s\n", p.Ms, p.Phase)
	}
	return sb.String()
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

// emitJSON prints v as one line that hack/benchreport reads from the
// benchmarks' output to write docs/benchmarks.md.
func emitJSON(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of numbers and strings always encode
	}
	fmt.Printf("benchjson %s\n", line)
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
