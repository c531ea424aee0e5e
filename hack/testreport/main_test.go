package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A real `go test -json` run of a small module with a passing, a failing
// and a skipped test, one slow: the report shows the failure's output, the
// skip's reason, the slow test first among the slowest, and fails.
func TestReportOfARealRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test on a generated module")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.test/m\n\ngo 1.26\n",
		"m_test.go": `package m

import (
	"testing"
	"time"
)

func TestSlow(t *testing.T) {
	t.Run("inner", func(t *testing.T) { time.Sleep(300 * time.Millisecond) })
}
func TestFast(t *testing.T)    {}
func TestBroken(t *testing.T)  { t.Log("the reason it broke"); t.Fail() }
func TestSkipped(t *testing.T) { t.Skip("needs a disk") }
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(t.Context(), "go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	stream, _ := cmd.Output() // the run fails: TestBroken
	if len(stream) == 0 {
		t.Fatal("go test -json wrote nothing")
	}

	var out bytes.Buffer
	if report(bytes.NewReader(stream), &out) {
		t.Errorf("a run with a failing test reported success:\n%s", &out)
	}
	got := out.String()
	for _, want := range []string{
		"--- FAIL: TestBroken (example.test/m)",
		"the reason it broke",
		"example.test/m TestSkipped: m_test.go:13: needs a disk",
		"FAIL\texample.test/m",
		"3 passed, 1 failed, 1 skipped", // TestSlow, TestSlow/inner, TestFast
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	_, slow, ok := strings.Cut(got, "slowest tests:\n")
	if !ok {
		t.Fatalf("report lists no slowest tests:\n%s", got)
	}
	lines := strings.Split(slow, "\n")
	if !strings.Contains(lines[0], "TestSlow (example.test/m)") {
		t.Errorf("slowest test is not TestSlow:\n%s", slow)
	}
	if strings.Contains(slow, "inner") || strings.Contains(slow, "TestSkipped") {
		t.Errorf("slowest tests list a subtest or a skipped test:\n%s", slow)
	}
}
