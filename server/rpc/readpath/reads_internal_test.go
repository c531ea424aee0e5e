package readpath

import (
	"testing"
	"time"
)

// A caller's ranged calls of one backup within the window are one read
// in the ledger; another caller, another backup, other content, or the
// same after the window, are new reads.
func TestRecentReadsRecordAReadNotACall(t *testing.T) {
	var r recentReads
	at := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	for i, tc := range []struct {
		who, backup, sha string
		after            time.Duration
		want             bool
	}{
		{"user alice", "cp-1", "aa", 0, true},
		{"user alice", "cp-1", "aa", time.Second, false}, // the next 32 MiB piece
		{"user alice", "cp-1", "aa", 9 * time.Minute, false},
		{"user bob", "cp-1", "aa", 9 * time.Minute, true},
		{"user alice", "cp-2", "aa", 9 * time.Minute, true},
		{"user alice", "cp-1", "bb", 9 * time.Minute, true}, // replaced under its name
		{"user alice", "cp-1", "aa", 20 * time.Minute, true},
	} {
		if got := r.first(tc.who, "default", tc.backup, tc.sha, at.Add(tc.after)); got != tc.want {
			t.Errorf("%d: %s reading %s (%s) after %s: first %v, want %v", i, tc.who, tc.backup, tc.sha, tc.after, got, tc.want)
		}
	}
}
