package plugin

import (
	"strings"
	"testing"
	"time"
)

func TestRetryTimeoutMustNotBeNegative(t *testing.T) {
	r := mustFail(t, "--retry-timeout", "--server-address", nowhere, "--retry-timeout=-1s", "list")
	if ExitCode(r.err) != ExitUsage {
		t.Fatalf("exit code %d, want %d (usage)", ExitCode(r.err), ExitUsage)
	}
}

// backup --wait whose server goes away for good: it says once that it
// retries, then fails after --retry-timeout naming the flag, not at the
// first failed poll.
func TestBackupWaitRetriesThenGivesUp(t *testing.T) {
	w := newAgentWorld(t, "cp")
	cmd := start(w.addr, "--retry-timeout=2s", "backup", "--target", "cp", "--name", "gone", "--wait")
	var stopped time.Time
	if j := w.jobsOf(t, serverNS, "backup-agent", "gone", 1); len(j) > 0 {
		cmd.waitErrOut(t, `backup "gone": Running`) // --wait sees Running first
		w.srv.Stop()
		stopped = time.Now()
	}
	r := cmd.result()
	t.Logf("error: %v\nstderr:\n%s", r.err, r.errOut)
	if r.err == nil {
		t.Fatalf("backup --wait succeeded with its server gone:\n%s", r.errOut)
	}
	for _, want := range []string{"connection to the server lost", "retrying for 2s", "--retry-timeout"} {
		if !strings.Contains(r.err.Error(), want) {
			t.Errorf("error %q does not say %q", r.err, want)
		}
	}
	if n := strings.Count(r.errOut, "connection to the server lost ("); n != 1 {
		t.Errorf("stderr tells about the outage %d times, want once:\n%s", n, r.errOut)
	}
	if !strings.Contains(r.errOut, "retrying for up to 2s") {
		t.Errorf("stderr does not say how long it retries:\n%s", r.errOut)
	}
	if d := time.Since(stopped); stopped.IsZero() || d < 2*time.Second {
		t.Errorf("gave up %s after the server stopped, before the 2s budget", d)
	}
}
