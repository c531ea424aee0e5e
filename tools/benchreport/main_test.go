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
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	inputs, _ := filepath.Glob("testdata/*.txt")
	if err := run(out, "", "", "", inputs); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"![throughput ratio and peak RSS against transfer size](benchmarks.png)",
		"| 1024 MiB | agent → server → S3 | 12.17 s | 3.24 s | 3.76 |",
		"### Before and after",
		"| 1024 MiB | agent → server → filesystem | 2.32 | 2.26 | 3.00 → 2.50 | 3.02 → 3.37 | 53 MiB → 33 MiB |",
		"| 256 MiB | 5 MiB × 2 | – |",
		"| before (the previous build, timed in the same rounds) | 137 ms | 65 ms | 2.11 |",
		"## Where the CPU goes",
		"| spdy | 800mbit | 93 | 93 | 95 | 0.97 | 0.98 | 1.00 |",
		"| websocket | as is (CPU-bound) | raw | 5.89 | – | 2.50 |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	png, err := os.ReadFile(filepath.Join(filepath.Dir(out), "benchmarks.png"))
	if err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Fatalf("chart: %v", err)
	}
}
