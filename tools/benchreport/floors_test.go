package main

import (
	"strings"
	"testing"
)

// BenchmarkFloors' lines make the floors table, placed after the backup
// tables. testdata/floors is apart
// from testdata/*.txt, the run docs/benchmarks.md was written from.
func TestFloorsTable(t *testing.T) {
	md, _ := reportOf(t, "testdata/floors/floors.txt", "testdata/final.txt")
	wantIn(t, md,
		"## Every stage against its floor\n",
		"| size | stage | path | product CPU s/GiB | floor CPU s/GiB | ratio | product peak RSS | floor peak RSS |",
		"| 256 MiB | agent backup | filesystem | 2.18 | 3.89 | 0.56 | 54 MiB | 42 MiB |",
		"| 256 MiB | data server upload | filesystem | 2.11 | 2.07 | 1.02 | 48 MiB | 24 MiB |",
		"| 256 MiB | data server download | filesystem | 0.63 | 0.60 | 1.06 | 47 MiB | 22 MiB |",
	)
	backup, floors := strings.Index(md, "## Backup: agent → server"), strings.Index(md, "## Every stage against its floor")
	if backup < 0 || floors < backup || strings.Contains(md[backup:floors], "\n## ") {
		t.Errorf("the floors table is not right after the backup tables:\n%s", md)
	}
}

// A stage over the aim stands out.
func TestFloorsSectionMarksRatiosOverTheAim(t *testing.T) {
	md := floorsSection([]floorRow{
		{SizeMiB: 1024, Stage: "data server upload", Path: "S3", ProductCPU: 3, FloorCPU: 2, Ratio: 1.5},
		{SizeMiB: 1024, Stage: "data server download", Path: "S3", ProductCPU: 1.3, FloorCPU: 1, Ratio: 1.3},
	})
	for _, want := range []string{
		"| 1024 MiB | data server upload | S3 | 3.00 | 2.00 | **1.50** | – | – |",
		"| 1024 MiB | data server download | S3 | 1.30 | 1.00 | 1.30 | – | – |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("section lacks %q:\n%s", want, md)
		}
	}
}
