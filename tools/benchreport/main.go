// Command benchreport writes docs/benchmarks.md and its chart from the
// output of `go test -bench` over tests/bench: it reads the "benchjson"
// lines the benchmarks print and lays them out as tables, the hottest
// functions of each process, and a PNG of the throughput ratio and the
// server's peak RSS against the transfer size. It is its own module so
// that the plotting library stays out of the product's.
//
//	benchreport -out docs/benchmarks.md [-notes docs/benchmarks-notes.md] [-include docs/benchmarks-download.md] bench.txt...
//
// testdata/ holds the benchmark lines of the runs docs/benchmarks.md was
// last written from: `go run . -out ../../docs/benchmarks.md -notes
// ../../docs/benchmarks-notes.md -include ../../docs/benchmarks-download.md
// testdata/*.txt` writes it again (with the download report, once there).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// row is one measured backup, as tests/bench emits it.
type row struct {
	Name        string   `json:"name"`
	SizeMiB     int      `json:"sizeMiB"`
	Wall        float64  `json:"wallSeconds"`
	RatioToSave float64  `json:"ratioToSave"`
	SaveWall    float64  `json:"saveWallSeconds"`
	RawBytes    int64    `json:"rawBytes"`
	StoredBytes int64    `json:"storedBytes"`
	AgentRSS    int64    `json:"agentPeakRSSKiB"`
	ServerRSS   int64    `json:"serverPeakRSSKiB"`
	ServerAnon  int64    `json:"serverPeakAnonKiB"`
	AgentCPU    float64  `json:"agentCPUSeconds"`
	ServerCPU   float64  `json:"serverCPUSeconds"`
	EtcdCPU     float64  `json:"etcdCPUSeconds"`
	PartMiB     int      `json:"partSizeMiB"`
	Concurrency int      `json:"concurrency"`
	MemLimit    string   `json:"memLimit"`
	AgentHot    []string `json:"agentHot"`
	ServerHot   []string `json:"serverHot"`
	Build       string   `json:"build"`
}

type listResult struct {
	Backups         int       `json:"backups"`
	Pairs           int       `json:"pairs"`
	ListMs          []float64 `json:"listMs"`
	GetPodsMs       []float64 `json:"getPodsMs"`
	ListMedianMs    float64   `json:"listMedianMs"`
	GetPodsMedianMs float64   `json:"getPodsMedianMs"`
	Ratio           float64   `json:"ratio"`
	// Baseline*: another build of the plugin timed in the same rounds.
	BaselineMs       []float64 `json:"baselineMs"`
	BaselineMedianMs float64   `json:"baselineMedianMs"`
	// Scale is list timed at each number of backups; Phases where the
	// traced plugin's time went, at Backups.
	Scale  []listScale `json:"scale"`
	Phases []listPhase `json:"phases"`
}

type listScale struct {
	Backups         int     `json:"backups"`
	Pairs           int     `json:"pairs"`
	ListMedianMs    float64 `json:"listMedianMs"`
	GetPodsMedianMs float64 `json:"getPodsMedianMs"`
	Ratio           float64 `json:"ratio"`
}

type listPhase struct {
	Phase string  `json:"phase"`
	Ms    float64 `json:"ms"`
}

// tunnelPath and tunnelRow are BenchmarkTunnelDownload's lines.
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
}

type tunnelRow struct {
	Transport string     `json:"transport"`
	Link      string     `json:"link"`
	Runs      int        `json:"runs"`
	Plugin    tunnelPath `json:"plugin"`
	Parallel  tunnelPath `json:"parallel"`
	Raw       tunnelPath `json:"raw"`
}

// results is everything read from one set of benchmark outputs.
type results struct {
	tunnel          []tunnelRow
	backup, s3parts []row
	floors          []floorRow
	// profiled are the rows of runs under perf: their hot functions are
	// reported, their times and memory (perf's own included) are not.
	profiled []row
	list     *listResult
	restore  *restoreResult
	cluster  *restoreClusterResult
	// baseline holds the rows of another build run in the same rounds.
	baseline *results
}

func main() {
	out := flag.String("out", "docs/benchmarks.md", "the Markdown file to write; the chart goes beside it as .png")
	before := flag.String("before", "", "benchmark output of the code before a change, for the before/after tables, if it exists")
	include := flag.String("include", "", "a Markdown file to append (the download benchmarks' report), if it exists")
	notes := flag.String("notes", "", "a Markdown file of analysis to put after the tables, if it exists")
	flag.Parse()
	if err := run(*out, *before, *include, *notes, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

func run(out, before, include, notes string, inputs []string) error {
	if len(inputs) == 0 {
		return fmt.Errorf("no benchmark output given")
	}
	after, err := read(inputs...)
	if err != nil {
		return err
	}
	// A baseline run in the same rounds is the fairest "before"; a
	// separate run's output (-before) is the next best.
	old := after.baseline
	if _, serr := os.Stat(before); old == nil && before != "" && serr == nil {
		if old, err = read(before); err != nil {
			return err
		}
	}
	png := strings.TrimSuffix(out, filepath.Ext(out)) + ".png"
	var md bytes.Buffer
	md.WriteString("# Benchmarks\n\n")
	md.WriteString("Written by `make bench` (tests/bench, then tools/benchreport); do not edit by hand.\n")
	md.WriteString("Each table's numbers come from one run on one machine (`make bench`, or the benchmark it names run alone): compare rows of one table, not tables of different runs.\n\n")
	if len(after.backup) > 0 {
		if err := chart(after.backup, png); err != nil {
			return err
		}
		fmt.Fprintf(&md, "![throughput ratio and peak RSS against transfer size](%s)\n\n", filepath.Base(png))
		md.WriteString(backupSection(after.backup, old))
	}
	if len(after.floors) > 0 {
		md.WriteString(floorsSection(after.floors))
	}
	if len(after.s3parts) > 0 {
		md.WriteString(s3Section(after.s3parts))
	}
	if len(after.tunnel) > 0 {
		md.WriteString(tunnelSection(after.tunnel))
	}
	if after.list != nil || (old != nil && old.list != nil) {
		md.WriteString(listSection(after.list, old))
	}
	if after.restore != nil {
		md.WriteString(restoreSection(after.restore))
	}
	if after.cluster != nil {
		md.WriteString(restoreClusterSection(after.cluster))
	}
	md.WriteString(hotSection(after.profiled, old))
	for _, f := range []string{notes, include} {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		md.WriteString("\n")
		md.Write(bytes.ReplaceAll(b, []byte("\n# "), []byte("\n## ")))
	}
	return os.WriteFile(out, md.Bytes(), 0o644)
}

func read(files ...string) (*results, error) {
	r := &results{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		// A run under perf (any row with hot functions) is reported for
		// its profiles only: perf's own cost is in its times and memory.
		profiledRun := bytes.Contains(data, []byte(`"agentHot":`))
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "benchjson ")
			if !ok {
				continue
			}
			var v struct {
				Bench string `json:"bench"`
				Row   row    `json:"row"`
				listResult
			}
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			switch v.Bench {
			case "tunnel":
				var t tunnelRow
				if err := json.Unmarshal([]byte(line), &t); err != nil {
					return nil, fmt.Errorf("%s: %w", f, err)
				}
				r.tunnel = append(r.tunnel, t)
			case "backup":
				if v.Row.Build == "before" {
					// The baseline build, run in the same rounds.
					if r.baseline == nil {
						r.baseline = &results{}
					}
					if profiledRun {
						r.baseline.profiled = append(r.baseline.profiled, v.Row)
					} else {
						r.baseline.backup = append(r.baseline.backup, v.Row)
					}
				} else if profiledRun {
					r.profiled = append(r.profiled, v.Row)
				} else {
					r.backup = append(r.backup, v.Row)
				}
			case "s3parts":
				r.s3parts = append(r.s3parts, v.Row)
			case "floors":
				var fr struct {
					Row floorRow `json:"row"`
				}
				if err := json.Unmarshal([]byte(line), &fr); err != nil {
					return nil, fmt.Errorf("%s: %w", f, err)
				}
				r.floors = append(r.floors, fr.Row)
			case "list":
				l := v.listResult
				r.list = &l
			case "restore":
				var rr restoreResult
				if err := json.Unmarshal([]byte(line), &rr); err != nil {
					return nil, fmt.Errorf("%s: %w", f, err)
				}
				r.restore = &rr
			case "restore-cluster":
				var rc restoreClusterResult
				if err := json.Unmarshal([]byte(line), &rc); err != nil {
					return nil, fmt.Errorf("%s: %w", f, err)
				}
				r.cluster = &rc
			}
		}
	}
	return r, nil
}

func gib(r row) float64 { return float64(r.RawBytes) / (1 << 30) }

func mib(kib int64) string {
	if kib == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f MiB", float64(kib)/1024)
}

func backupSection(rows []row, old *results) string {
	var b strings.Builder
	b.WriteString("## Backup: agent → server against `etcdctl snapshot save`\n\n")
	b.WriteString("`BenchmarkBackup`: a real etcd in the benchmark process loaded with half-random values; etcd's own " +
		"`snapshot save` to a local file is the baseline; then the agent binary streams a snapshot into the server binary " +
		"(filesystem location, S3 location on versitygw over HTTPS), each as is and with zstd, a fresh server per row. " +
		"\"× save\" is against the `snapshot save` run right before the row (\"its save\"; runs that record none, against the save of " +
		"their round), and each backup is deleted after it is measured, as the save's file is. " +
		"CPU is user + system time of each process per GiB of snapshot; etcd's is the benchmark process's, which runs it.\n\n")
	b.WriteString("| size | path | wall | its save | × save | MB/s | stored | agent CPU s/GiB | server CPU s/GiB | etcd CPU s/GiB | agent peak RSS | server peak RSS | of which anonymous |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		save := "–"
		if r.SaveWall > 0 {
			save = fmt.Sprintf("%.2f s", r.SaveWall)
		}
		fmt.Fprintf(&b, "| %d MiB | %s | %.2f s | %s | %.2f | %.0f | %.0f MiB | %s | %s | %.2f | %s | %s | %s |\n", r.SizeMiB, r.Name, r.Wall, save, r.RatioToSave,
			float64(r.RawBytes)/r.Wall/1e6, float64(r.StoredBytes)/(1<<20), cpu(r.AgentCPU, r), cpu(r.ServerCPU, r), r.EtcdCPU/gib(r), mib(r.AgentRSS), mib(r.ServerRSS), mib(r.ServerAnon))
	}
	if old != nil && len(old.backup) > 0 {
		b.WriteString("\n### Before and after\n\n")
		b.WriteString("The agent and server built from the code before the change and after, each row against the `snapshot save` run right before it; " +
			"when both builds ran in the same rounds (ETCDBACKUP_BENCH_BASELINE_BIN), they saw the same machine.\n\n")
		b.WriteString("| size | path | × save before | × save after | agent CPU s/GiB before → after | server CPU s/GiB before → after | agent peak RSS before → after | server peak RSS before → after |\n")
		b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rows {
			i := slices.IndexFunc(old.backup, func(o row) bool { return o.Name == r.Name && o.SizeMiB == r.SizeMiB })
			if i < 0 || r.AgentCPU == 0 {
				continue
			}
			o := old.backup[i]
			fmt.Fprintf(&b, "| %d MiB | %s | %.2f | %.2f | %s → %s | %s → %s | %s → %s | %s → %s |\n", r.SizeMiB, r.Name, o.RatioToSave, r.RatioToSave,
				cpu(o.AgentCPU, o), cpu(r.AgentCPU, r), cpu(o.ServerCPU, o), cpu(r.ServerCPU, r), mib(o.AgentRSS), mib(r.AgentRSS), mib(o.ServerRSS), mib(r.ServerRSS))
		}
	}
	b.WriteString("\n")
	return b.String()
}

func cpu(s float64, r row) string {
	if s == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", s/gib(r))
}

func s3Section(rows []row) string {
	var b strings.Builder
	b.WriteString("## S3 part size and concurrency\n\n")
	b.WriteString("`BenchmarkS3PartSize`: one backup stored as is into the S3 location per setting (`partSizeMiB`, `concurrency` " +
		"in the location's config), a fresh server each time. The transfer manager holds concurrency + 1 part buffers and the " +
		"first part, whatever the backup's size; the garbage collector's headroom comes on top.\n\n")
	b.WriteString("| size | part × concurrency | server GOMEMLIMIT | wall | MB/s | server CPU s/GiB | server peak RSS | of which anonymous |\n|---:|---|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		limit := r.MemLimit
		if limit == "" {
			limit = "–"
		}
		fmt.Fprintf(&b, "| %d MiB | %d MiB × %d | %s | %.2f s | %.0f | %s | %s | %s |\n", r.SizeMiB, r.PartMiB, r.Concurrency, limit, r.Wall,
			float64(r.RawBytes)/r.Wall/1e6, cpu(r.ServerCPU, r), mib(r.ServerRSS), mib(r.ServerAnon))
	}
	b.WriteString("\n")
	return b.String()
}

func tunnelSection(rows []tunnelRow) string {
	var b strings.Builder
	b.WriteString("## Download through the tunnel against a raw port-forward\n\n")
	b.WriteString("`BenchmarkTunnelDownload` on the sandbox, 1 GiB: `kubectl etcdbackup download -o -` (one port-forward, " +
		"SHA-256 and etcd's trailer verified) and `download -o FILE --parallel 4` (four port-forwards, FILE in /dev/shm) against a raw " +
		"1 GiB byte stream from a pod through the same API server, kubelet and containerd, read through client-go's port forwarder " +
		"as `kubectl port-forward` does, hashed once (SHA-256) and written to a file in /dev/shm: what the plugin's download cannot " +
		"avoid, its floor. The three paths alternate in one run. MB/s is end to end (process start to exit; raw: " +
		"from dialling to the last byte). Rows with a link rate limit the node's link to the host (the kubelet's side of every " +
		"port-forward) to that rate, so that the network, not the machine's two CPUs, limits the paths. Aims: download / raw ≥ 0.90 " +
		"where the CPUs limit, ≥ 0.97 where the network does; kubectl + plugin ≤ 1.3 × the floor's CPU per GiB; plugin peak RSS ≤ 64 MiB.\n\n")
	b.WriteString("| transport | link | download MB/s | --parallel 4 MB/s | raw MB/s | download / raw | parallel / raw | first-to-last-byte download / raw |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	link := func(t tunnelRow) string {
		if t.Link == "" {
			return "as is (CPU-bound)"
		}
		return t.Link
	}
	for _, t := range rows {
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f |\n", t.Transport, link(t), t.Plugin.MBps, t.Parallel.MBps, t.Raw.MBps,
			t.Plugin.MBps/t.Raw.MBps, t.Parallel.MBps/t.Raw.MBps, t.Plugin.StreamMBps/t.Raw.StreamMBps)
	}
	b.WriteString("\nCPU seconds per GiB by process (user + system). \"bench process\" holds raw's port forwarder, reader, hash and " +
		"file (the plugin's floor); the byte source pod, the kubelet and containerd count in \"rest of machine\".\n\n")
	b.WriteString("| transport | link | path | all | kubectl + plugin | API server | data server | bench process | rest of machine | peak RSS |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range rows {
		for _, p := range []struct {
			name string
			p    tunnelPath
		}{{"download -o -", t.Plugin}, {"--parallel 4", t.Parallel}, {"raw", t.Raw}} {
			rss, plugin := "–", "–"
			if p.p.PeakRSSMiB > 0 {
				rss = fmt.Sprintf("%.0f MiB", p.p.PeakRSSMiB)
			}
			if p.p.Plugin > 0 {
				plugin = fmt.Sprintf("%.2f", p.p.Plugin)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %s | %.2f | %.2f | %.2f | %.2f | %s |\n", t.Transport, link(t), p.name, p.p.CPU,
				plugin, p.p.APIServer, p.p.Server, p.p.Bench, p.p.Rest, rss)
		}
	}
	b.WriteString("\nThe plugin's stage against its floor: kubectl + plugin CPU per GiB over the raw path's bench process " +
		"(its port forwarder, reader, hash and file).\n\n| transport | link | download -o - / floor | --parallel 4 / floor |\n|---|---|---:|---:|\n")
	for _, t := range rows {
		if t.Raw.Bench > 0 {
			fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f |\n", t.Transport, link(t), t.Plugin.Plugin/t.Raw.Bench, t.Parallel.Plugin/t.Raw.Bench)
		}
	}
	b.WriteString("\n")
	return b.String()
}

func listSection(l *listResult, old *results) string {
	var b strings.Builder
	b.WriteString("## `kubectl etcdbackup list` against `kubectl get pods`\n\n")
	n, pairsN := 20, 9
	if l != nil && l.Backups > 0 {
		n, pairsN = l.Backups, l.Pairs
	}
	fmt.Fprintf(&b, "`BenchmarkList` on the sandbox, the product installed with a filesystem and an S3 location: whole kubectl processes "+
		"from exec to exit, %d backups listed (half in each location), %d pairs interleaved in one run after a warm-up of each; "+
		"medians. Aim: ratio ≤ 1.3.\n\n", n, pairsN)
	b.WriteString("| run | list (median) | get pods (median) | ratio |\n|---|---:|---:|---:|\n")
	if l != nil && l.BaselineMedianMs > 0 {
		fmt.Fprintf(&b, "| before (the previous build, timed in the same rounds) | %.0f ms | %.0f ms | %.2f |\n",
			l.BaselineMedianMs, l.GetPodsMedianMs, l.BaselineMedianMs/l.GetPodsMedianMs)
	} else if old != nil && old.list != nil {
		fmt.Fprintf(&b, "| before | %.0f ms | %.0f ms | %.2f |\n", old.list.ListMedianMs, old.list.GetPodsMedianMs, old.list.Ratio)
	}
	if l != nil {
		fmt.Fprintf(&b, "| after | %.0f ms | %.0f ms | %.2f |\n", l.ListMedianMs, l.GetPodsMedianMs, l.Ratio)
		fmt.Fprintf(&b, "\nEvery pair (list / get pods, ms): %s\n", pairs(l))
	}
	if l != nil && len(l.Scale) > 0 {
		b.WriteString("\nList against the number of backups (half in each location), stored straight into the locations and growing " +
			"from one row to the next; each row's medians of its pairs:\n\n")
		b.WriteString("| backups | pairs | list (median) | get pods (median) | ratio |\n|---:|---:|---:|---:|---:|\n")
		for _, s := range l.Scale {
			fmt.Fprintf(&b, "| %d | %d | %.0f ms | %.0f ms | %.2f |\n", s.Backups, s.Pairs, s.ListMedianMs, s.GetPodsMedianMs, s.Ratio)
		}
	}
	if l != nil && len(l.Phases) > 0 {
		fmt.Fprintf(&b, "\nWhere the time goes at %d backups: kubectl's own start and exit (`kubectl version --client`, which a plugin's run "+
			"pays before kubectl execs it), and the plugin built with `-tags etcdbackup_trace` run on its own, each phase's end "+
			"from its exec (medians):\n\n", l.Backups)
		b.WriteString("| phase | ms from exec |\n|---|---:|\n")
		for _, p := range l.Phases {
			fmt.Fprintf(&b, "| %s | %.1f |\n", p.Phase, p.Ms)
		}
	}
	b.WriteString("\n")
	return b.String()
}

func pairs(l *listResult) string {
	var s []string
	for i := range min(len(l.ListMs), len(l.GetPodsMs)) {
		s = append(s, fmt.Sprintf("%.0f/%.0f", l.ListMs[i], l.GetPodsMs[i]))
	}
	return strings.Join(s, ", ")
}

func hotSection(rows []row, old *results) string {
	var b strings.Builder
	var any bool
	for _, set := range []struct {
		title string
		rows  []row
	}{{"after", rows}, {"before", func() []row {
		if old == nil {
			return nil
		}
		return old.profiled
	}()}} {
		for _, r := range set.rows {
			if len(r.AgentHot) == 0 && len(r.ServerHot) == 0 {
				continue
			}
			if !any {
				b.WriteString("## Where the CPU goes\n\n")
				b.WriteString("With `ETCDBACKUP_BENCH_PERF=DIR` the agent and the server run under `perf record`; " +
					"the functions with the most samples of each process (kernel functions included), per row.\n\n")
				any = true
			}
			fmt.Fprintf(&b, "<details><summary>%s, %d MiB: %s</summary>\n\n| agent | server |\n|---|---|\n", set.title, r.SizeMiB, r.Name)
			for i := range max(len(r.AgentHot), len(r.ServerHot)) {
				fmt.Fprintf(&b, "| %s | %s |\n", at(r.AgentHot, i), at(r.ServerHot, i))
			}
			b.WriteString("\n</details>\n\n")
		}
	}
	return b.String()
}

func at(s []string, i int) string {
	if i < len(s) {
		return "`" + strings.TrimSuffix(s[i], " - -") + "`"
	}
	return ""
}

// chart draws, side by side, the wall time as a multiple of `snapshot
// save` and the server's peak RSS, against the database size, one line
// per path.
func chart(rows []row, path string) error {
	ratio := plot.New()
	ratio.Title.Text = "backup wall time ÷ snapshot save"
	ratio.X.Label.Text = "etcd database (MiB)"
	ratio.Y.Label.Text = "× save"
	rss := plot.New()
	rss.Title.Text = "server peak RSS"
	rss.X.Label.Text = "etcd database (MiB)"
	rss.Y.Label.Text = "MiB"
	var names []string
	for _, r := range rows {
		if r.AgentCPU != 0 && !slices.Contains(names, r.Name) {
			names = append(names, r.Name)
		}
	}
	for i, name := range names {
		var pr, pm plotter.XYs
		for _, r := range rows {
			if r.Name == name {
				pr = append(pr, plotter.XY{X: float64(r.SizeMiB), Y: r.RatioToSave})
				pm = append(pm, plotter.XY{X: float64(r.SizeMiB), Y: float64(r.ServerRSS) / 1024})
			}
		}
		for _, p := range []struct {
			plt *plot.Plot
			xys plotter.XYs
		}{{ratio, pr}, {rss, pm}} {
			l, s, err := plotter.NewLinePoints(p.xys)
			if err != nil {
				return err
			}
			l.Color, s.Color = plotutil.Color(i), plotutil.Color(i)
			s.Shape = plotutil.Shape(i)
			p.plt.Add(l, s)
			if p.plt == ratio {
				p.plt.Legend.Add(name, l, s)
			}
		}
	}
	aim := func(p *plot.Plot, y float64, label string) error {
		var xs plotter.XYs
		for _, r := range rows {
			xs = append(xs, plotter.XY{X: float64(r.SizeMiB), Y: y})
		}
		slices.SortFunc(xs, func(a, b plotter.XY) int { return int(a.X - b.X) })
		l, err := plotter.NewLine(xs)
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 128}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(l)
		p.Legend.Add(label, l)
		return nil
	}
	if err := aim(ratio, 1.1, "aim ≤ 1.10"); err != nil {
		return err
	}
	if err := aim(rss, 64, "aim ≤ 64 MiB"); err != nil {
		return err
	}
	ratio.Legend.Top, rss.Legend.Top = true, true
	ratio.Y.Min, rss.Y.Min = 0, 0
	ratio.X.Scale, rss.X.Scale = plot.LogScale{}, plot.LogScale{}
	ratio.X.Tick.Marker, rss.X.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}

	img := vgimg.New(vg.Points(1100), vg.Points(420))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(20), PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	canvases := plot.Align([][]*plot.Plot{{ratio, rss}}, tiles, dc)
	ratio.Draw(canvases[0][0])
	rss.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
