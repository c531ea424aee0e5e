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

// BenchmarkRestoreCluster's line makes the in-cluster and break-glass
// tables, with each restore's own account of itself.
func TestRestoreClusterTable(t *testing.T) {
	md, _ := reportOf(t, "testdata/scale/restore-cluster.txt")
	wantIn(t, md,
		"## In-cluster restore of a three-member target; the break-glass restore from S3",
		"a 3-member etcd of pods on PVCs holding about 256 MiB",
		"took 12.50 s",
		"| 31.25 s | 27 s | 9.50 s | 40.75 s |",
		"`target \"app-etcd\" restored in 31s, from the command to every member's Job succeeded`",
		"The slowest member's restore agent, in its Job's log: `etcd-2 took 26.1s: download 19.5s, verify 1.8s, rebuild 4.8s`.",
		"| 6.40 s | 3.50 s | 2.60 s | 1.05 |",
		"`restored in 6.3s: download 3.4s, verify 0.6s, rebuild 2.3s`",
	)
}
