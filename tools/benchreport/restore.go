package main

import (
	"fmt"
	"strings"
)

// restoreResult is BenchmarkRestoreLocal's line.
type restoreResult struct {
	SizeMiB     int     `json:"sizeMiB"`
	Runs        int     `json:"runs"`
	Restore     float64 `json:"restoreSeconds"`
	Download    float64 `json:"downloadSeconds"`
	EtcdRestore float64 `json:"etcdRestoreSeconds"`
	Ratio       float64 `json:"ratio"`
	PeakRSSMiB  float64 `json:"pluginPeakRSSMiB"`
	// Steps is the plugin's own last line: "restored in …: download …".
	Steps string `json:"steps"`
}

func restoreSection(r *restoreResult) string {
	var b strings.Builder
	b.WriteString("## Local restore against download + etcd's own restore\n\n")
	fmt.Fprintf(&b, "`BenchmarkRestoreLocal` on the sandbox, a real etcd snapshot of about %d MiB (runs: %d, means): "+
		"`kubectl etcdbackup restore --local` through the API server, against `kubectl etcdbackup download` of the same "+
		"backup then etcd's own restore of the file (etcdutl's snapshot package), in the same rounds. Aim: ≤ 1.10.\n\n", r.SizeMiB, r.Runs)
	b.WriteString("| restore --local | download | + etcd's restore | restore / (download + restore) | plugin peak RSS |\n|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| %.2f s | %.2f s | %.2f s | %.2f | %.0f MiB |\n", r.Restore, r.Download, r.EtcdRestore, r.Ratio, r.PeakRSSMiB)
	if r.Steps != "" {
		fmt.Fprintf(&b, "\nThe plugin's own account of its last run: `%s`.\n", r.Steps)
	}
	b.WriteString("\n")
	return b.String()
}
