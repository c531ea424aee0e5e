// Command testreport reads `go test -json` on standard input and prints
// what a person needs from it: each package's result, the whole output of
// every failing test, every skipped test with its reason, and a closing
// line "N passed, N failed, N skipped". It exits 1 when anything failed,
// so `go test -json ./... | testreport` can stand in for `go test ./...`
// in make.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

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
	output := map[key]*strings.Builder{}
	var skipped []string
	passed, failed, nSkipped := 0, 0, 0
	buildFailed := false
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		line := in.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			// Build errors and other non-JSON lines come through as is.
			fmt.Println(string(line))
			buildFailed = true
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Print(e.Output)
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
				pkgResult(e, output[k])
				delete(output, k)
				continue
			}
			switch e.Action {
			case "pass":
				passed++
			case "fail":
				failed++
				fmt.Printf("--- FAIL: %s (%s)\n%s", e.Test, e.Package, text(output[k]))
			case "skip":
				nSkipped++
				skipped = append(skipped, fmt.Sprintf("  %s %s: %s", e.Package, e.Test, skipReason(text(output[k]))))
			}
			delete(output, k)
		}
	}
	if len(skipped) > 0 {
		sort.Strings(skipped)
		fmt.Printf("skipped tests and why:\n%s\n", strings.Join(skipped, "\n"))
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", passed, failed, nSkipped)
	if failed > 0 || buildFailed || pkgFailed {
		os.Exit(1)
	}
}

var pkgFailed bool

// pkgResult prints a package's line as `go test` does; a package that
// failed outside any test (a build error, a panic in TestMain) shows its
// output.
func pkgResult(e event, out *strings.Builder) {
	switch e.Action {
	case "pass":
		fmt.Printf("ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
	case "skip":
		fmt.Printf("?   \t%s\t[no test files]\n", e.Package)
	case "fail":
		pkgFailed = true
		fmt.Printf("%sFAIL\t%s\t%.3fs\n", text(out), e.Package, e.Elapsed)
	}
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
