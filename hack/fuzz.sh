#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each, one after another (Go's fuzzer
# takes one target per run). Their seed corpora also run as plain tests in
# `make unit`. A failure leaves the input under the package's
# testdata/fuzz/FuzzX/; `go test -run 'FuzzX/NAME' ./pkg` replays it.
set -euo pipefail

FUZZTIME=${FUZZTIME:-30s}
# Minimising every new interesting input can take the whole budget of a
# short run (up to 60 s each by default); a bounded count keeps fuzzing.
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-100x}
GO=${GO:-go}

# package fuzz-target, one a line.
targets="
./server/rpc/ FuzzUploadStream
./storage/filesystem/ FuzzManifest
./snapshot/ FuzzVerifier
./snapshot/ FuzzDecompress
./server/config/ FuzzLoad
./delta/ FuzzSegmentReader
./delta/ FuzzPlan
./snapshot/kube/ FuzzDecode
./storage/s3/ FuzzManifest
./server/jobs/ FuzzParseFoldInputs
./server/jobs/ FuzzDecodeSegments
./server/auth/ FuzzPrecheck
"

while read -r pkg fn; do
	[ -n "$pkg" ] || continue
	echo "== $fn ($pkg) for $FUZZTIME"
	"$GO" test -run '^$' -fuzz "^${fn}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "$pkg"
done <<<"$targets"
