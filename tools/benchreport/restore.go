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

// restoreClusterResult is BenchmarkRestoreCluster's line.
type restoreClusterResult struct {
	SizeMiB int     `json:"sizeMiB"`
	Members int     `json:"members"`
	Runs    int     `json:"runs"`
	Backup  float64 `json:"backupSeconds"`
	Restore float64 `json:"restoreSeconds"`
	Jobs    float64 `json:"jobsSeconds"`
	Start   float64 `json:"startSeconds"`
	Total   float64 `json:"totalSeconds"`
	Steps   string  `json:"steps"`
	// AgentSteps is the slowest member's agent's own account.
	AgentSteps string  `json:"agentSteps"`
	Glass      float64 `json:"breakGlassSeconds"`
	GlassDL    float64 `json:"breakGlassDownloadSeconds"`
	GlassEtc   float64 `json:"breakGlassEtcdRestoreSeconds"`
	GlassX     float64 `json:"breakGlassRatio"`
	// GlassSteps is the break-glass restore's own last line.
	GlassSteps string `json:"breakGlassSteps"`
}

func restoreClusterSection(r *restoreClusterResult) string {
	var b strings.Builder
	b.WriteString("## In-cluster restore of a three-member target; the break-glass restore from S3\n\n")
	fmt.Fprintf(&b, "`BenchmarkRestoreCluster` on the sandbox (runs: %d, means): a %d-member etcd of pods on PVCs holding about %d MiB, "+
		"a ClusterTarget whose backups are in the S3 location, the product installed as a user would. The recovery is timed from "+
		"`kubectl etcdbackup restore --target --wait` to every member's Job done, then from scaling the members up to all of them "+
		"serving a quorum read of the backup's data; stopping and wiping the members before it is not timed. Its backup "+
		"(`backup --target --wait`) took %.2f s.\n\n", r.Runs, r.Members, r.SizeMiB, r.Backup)
	b.WriteString("| restore --target --wait | of which the Jobs (first created → last done) | members started → all serving | command → cluster serving |\n|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| %.2f s | %.0f s | %.2f s | %.2f s |\n", r.Restore, r.Jobs, r.Start, r.Total)
	if r.Steps != "" {
		fmt.Fprintf(&b, "\nThe plugin's own account of its last run: `%s`.\n", r.Steps)
	}
	if r.AgentSteps != "" {
		fmt.Fprintf(&b, "The slowest member's restore agent, in its Job's log: `%s`.\n", r.AgentSteps)
	}
	b.WriteString("\nThe break-glass restore, with the API server not used at all (no kubeconfig): `restore --local --storage-config` " +
		"straight from S3, against `download --storage-config` then etcd's own restore of the file, in the same rounds.\n\n")
	b.WriteString("| restore --local --storage-config | download --storage-config | + etcd's restore | restore / (download + restore) |\n|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| %.2f s | %.2f s | %.2f s | %.2f |\n", r.Glass, r.GlassDL, r.GlassEtc, r.GlassX)
	if r.GlassSteps != "" {
		fmt.Fprintf(&b, "\nIts own account of its last run: `%s`.\n", r.GlassSteps)
	}
	b.WriteString("\n")
	return b.String()
}
