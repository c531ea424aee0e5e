package main

import (
	"strings"
	"testing"
)

// A package that builds on Linux and not on Windows passes for the one and
// fails for the other, naming the platform and the compiler's error.
func TestCheckNamesThePlatformThatDoesNotBuild(t *testing.T) {
	if report, failed := check("testdata/lockmod", "linux/arm64", []string{"."}); failed {
		t.Fatalf("linux/arm64 failed:\n%s", report)
	}
	report, failed := check("testdata/lockmod", "windows/amd64", []string{"."})
	if !failed {
		t.Fatalf("windows/amd64 passed:\n%s", report)
	}
	for _, want := range []string{"crosscheck windows/amd64: ", "undefined: syscall.Flock", "does not build for windows/amd64"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}
