package main

import (
	"fmt"
	"strings"
)

// floorRow is one line of BenchmarkFloors: a stage on a path against its
// floor, medians over the rounds of CPU seconds per GiB of snapshot.
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
}

// floorAim is the aim for every stage: at most this many times
// its floor's CPU.
const floorAim = 1.3

func floorsSection(rows []floorRow) string {
	var b strings.Builder
	b.WriteString("## Every stage against its floor\n\n")
	b.WriteString("`BenchmarkFloors`: each loopback stage of a backup against its floor, `tests/bench/floor`, a program that does " +
		"the least work the stage cannot avoid and nothing else, in the product's message sizes, over gRPC with a codec that " +
		"passes bytes through (no protobuf). The floor agent reads etcd's snapshot through clientv3's Maintenance client, " +
		"hashes it once with SHA-256 (checking etcd's trailer; the product's agent leaves that to the server when it stores the " +
		"snapshot as is), compresses it with zstd at the agent's settings when the path says so, and sends it on one client " +
		"stream; its rows are from the filesystem runs. The floor server hashes what arrives once with SHA-256 and writes it to " +
		"a file fsynced once at the end, or puts it through the S3 transfer manager at the product's default part size and " +
		"concurrency. For a download it reads the file (or GETs the object once) and frames it on a server stream to a client " +
		"in the benchmark process, where the product's server is read by the `client` package. Product and floor alternate in " +
		"each round, each in a fresh process; the product's server runs with `--check-locations=false`, as the location check " +
		"it makes once it starts (a third of a CPU second with an S3 location) is no transfer's work. CPU is user + system time " +
		"per GiB of snapshot, the median of the rounds; peak RSS the largest of the rounds. " +
		fmt.Sprintf("Aim: product / floor ≤ %.1f.\n\n", floorAim))
	b.WriteString("| size | stage | path | product CPU s/GiB | floor CPU s/GiB | ratio | product peak RSS | floor peak RSS |\n")
	b.WriteString("|---:|---|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		ratio := fmt.Sprintf("%.2f", r.Ratio)
		if r.Ratio > floorAim {
			ratio = "**" + ratio + "**"
		}
		fmt.Fprintf(&b, "| %d MiB | %s | %s | %.2f | %.2f | %s | %s | %s |\n", r.SizeMiB, r.Stage, r.Path, r.ProductCPU, r.FloorCPU, ratio,
			mib(r.ProductRSS), mib(r.FloorRSS))
	}
	b.WriteString("\n")
	return b.String()
}
