package main

import (
	"strings"
	"testing"
)

// BenchmarkList's line at several sizes makes the scaling table and the
// phases, and BenchmarkRestoreLocal's its table with the plugin's own
// account of the steps. testdata/scale is apart from testdata/*.txt, the
// run docs/benchmarks.md was written from.
func TestListScaleAndRestoreTables(t *testing.T) {
	md, _ := reportOf(t, "testdata/scale/list.txt", "testdata/scale/restore.txt")
	wantIn(t, md,
		"1000 backups listed (half in each location), 9 pairs",
		"| backups | pairs | list (median) | get pods (median) | ratio |",
		"| 10000 | 3 | 2027 ms | 196 ms | 10.33 |",
		"| plugin: backups listed | 251.7 |",
		"## Local restore against download + etcd's own restore",
		"| 20.50 s | 10.10 s | 9.20 s | 1.06 | 88 MiB |",
		"`restored in 21s: download 11s, verify 1.2s, rebuild 8.8s`",
	)
	if strings.Contains(md, "tunnel: ") {
		t.Error("the report lists the tunnel's reads and writes as phases")
	}
}
