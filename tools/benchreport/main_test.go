package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The report of the run docs/benchmarks.md was written from has every
// section, the before/after table from the baseline build run in the same
// rounds, and a PNG chart.
func TestReportOfARecordedRun(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/*.txt")
	md, out := reportOf(t, inputs...)
	wantIn(t, md,
		"![throughput ratio and peak RSS against transfer size](benchmarks.png)",
		"| 1024 MiB | agent → server → S3 | 12.17 s | 3.24 s | 3.76 |",
		"### Before and after",
		"| 1024 MiB | agent → server → filesystem | 2.32 | 2.26 | 3.00 → 2.50 | 3.02 → 3.37 | 53 MiB → 33 MiB |",
		"| 256 MiB | 5 MiB × 2 | – |",
		"| after | 343 ms | 119 ms | 2.89 |",
		"| 10000 | 3 | 1626 ms | 129 ms | 12.63 |",
		"| 1024 MiB | data server upload | filesystem | 2.96 | 2.27 | **1.30** | 48 MiB | 27 MiB |",
		"| 15.56 s | 9.06 s | 5.28 s | 1.09 | 1268 MiB |",
		"## Where the CPU goes",
		"| spdy | 800mbit | 93 | 93 | 95 | 0.98 | 0.98 | 1.00 |",
		"| spdy | as is (CPU-bound) | download -o - | 6.47 | 3.20 | 1.90 | 0.77 | 0.60 | 3.15 | 131 MiB |",
		"| spdy | as is (CPU-bound) | 1.22 | 1.50 |",
		"| websocket | as is (CPU-bound) | raw | 8.65 | – | 2.19 |",
	)
	png, err := os.ReadFile(filepath.Join(filepath.Dir(out), "benchmarks.png"))
	if err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Fatalf("chart: %v", err)
	}
}

// reportOf writes the report of the benchmark outputs inputs and returns
// it, and where it was written.
func reportOf(t *testing.T, inputs ...string) (md, out string) {
	t.Helper()
	out = filepath.Join(t.TempDir(), "benchmarks.md")
	if err := run(out, "", "", "", inputs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), out
}

// wantIn fails t for each of wants that md lacks.
func wantIn(t *testing.T, md string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
