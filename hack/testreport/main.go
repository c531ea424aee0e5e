// Command testreport reads `go test -json` on standard input and prints
// what a person needs from it: each package's result, the whole output of
// every failing test, every skipped test with its reason, the slowest
// top-level tests (where a run's time went), and a closing line
// "N passed, N failed, N skipped". It exits 1 when anything failed,
// so `go test -json ./... | testreport` can stand in for `go test ./...`
// in make.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// slowest is how many top-level tests the closing summary lists by time.
const slowest = 10

// event is one line of cmd/test2json's output.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

func main() {
	if !report(os.Stdin, os.Stdout) {
		os.Exit(1)
	}
}

// timed is a top-level test that ended, and how long it took.
type timed struct {
	name    string
	elapsed float64
}

// report writes the summary of the `go test -json` stream r to w and tells
// whether everything passed.
func report(r io.Reader, w io.Writer) bool {
	output := map[key]*strings.Builder{}
	var skipped []string
	var tops []timed
	passed, failed, nSkipped := 0, 0, 0
	buildFailed, pkgFailed := false, false
	in := bufio.NewScanner(r)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		line := in.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			// Build errors and other non-JSON lines come through as is.
			fmt.Fprintln(w, string(line))
			buildFailed = true
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "build-fail":
			buildFailed = true
		case "output":
			b := output[k]
			if b == nil {
				b = &strings.Builder{}
				output[k] = b
			}
			b.WriteString(e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				if !pkgResult(w, e, output[k]) {
					pkgFailed = true
				}
				delete(output, k)
				continue
			}
			if e.Action != "skip" && !strings.Contains(e.Test, "/") {
				tops = append(tops, timed{e.Test + " (" + e.Package + ")", e.Elapsed})
			}
			switch e.Action {
			case "pass":
				passed++
			case "fail":
				failed++
				fmt.Fprintf(w, "--- FAIL: %s (%s)\n%s", e.Test, e.Package, text(output[k]))
			case "skip":
				nSkipped++
				skipped = append(skipped, fmt.Sprintf("  %s %s: %s", e.Package, e.Test, skipReason(text(output[k]))))
			}
			delete(output, k)
		}
	}
	if len(skipped) > 0 {
		slices.Sort(skipped)
		fmt.Fprintf(w, "skipped tests and why:\n%s\n", strings.Join(skipped, "\n"))
	}
	if len(tops) > 0 {
		slices.SortStableFunc(tops, func(a, b timed) int { return cmp.Compare(b.elapsed, a.elapsed) })
		fmt.Fprintf(w, "slowest tests:\n")
		for _, t := range tops[:min(slowest, len(tops))] {
			fmt.Fprintf(w, "  %8.1fs  %s\n", t.elapsed, t.name)
		}
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", passed, failed, nSkipped)
	return failed == 0 && !buildFailed && !pkgFailed
}

// pkgResult prints a package's line as `go test` does, and tells whether
// the package passed; a package that failed outside any test (a build
// error, a panic in TestMain) shows its output.
func pkgResult(w io.Writer, e event, out *strings.Builder) bool {
	switch e.Action {
	case "pass":
		fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
	case "skip":
		fmt.Fprintf(w, "?   \t%s\t[no test files]\n", e.Package)
	case "fail":
		fmt.Fprintf(w, "%sFAIL\t%s\t%.3fs\n", text(out), e.Package, e.Elapsed)
		return false
	}
	return true
}

func text(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	return b.String()
}

// skipReason is the message t.Skip printed: the last line of the test's
// output that is not the "--- SKIP" line itself.
func skipReason(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "=== ") {
			continue
		}
		return l
	}
	return "(no reason given)"
}
