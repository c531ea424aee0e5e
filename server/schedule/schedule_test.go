package schedule

import (
	"strings"
	"testing"
	"time"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTimeZones(t *testing.T) {
	s, err := Parse("0 2 * * *", "America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, want string }{
		{"2026-12-01T00:00:00Z", "2026-12-01T07:00:00Z"}, // EST, UTC-5
		{"2026-07-01T00:00:00Z", "2026-07-01T06:00:00Z"}, // EDT, UTC-4
	} {
		if got := s.Next(mustTime(t, tc.from)); !got.Equal(mustTime(t, tc.want)) {
			t.Errorf("next after %s: %s, want %s", tc.from, got.UTC().Format(time.RFC3339), tc.want)
		}
	}
	if got := Name("cp", s.Next(mustTime(t, "2026-12-01T00:00:00Z"))); got != "cp-20261201-070000" {
		t.Errorf("name %q: the scheduled time in UTC", got)
	}
	utc, err := Parse("0 2 * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := utc.Next(mustTime(t, "2026-12-01T00:00:00Z")); !got.Equal(mustTime(t, "2026-12-01T02:00:00Z")) {
		t.Errorf("no time zone is UTC: %s", got)
	}
}

func TestLatest(t *testing.T) {
	s, err := Parse("*/5 * * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		after, now, want string
	}{
		{"2026-12-01T10:00:00Z", "2026-12-01T10:04:59Z", ""},
		{"2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z", "2026-12-01T10:05:00Z"},
		{"2026-12-01T10:00:00Z", "2026-12-01T11:23:00Z", "2026-12-01T11:20:00Z"},
		{"2025-12-01T10:00:00Z", "2026-12-01T11:23:00Z", "2026-12-01T11:20:00Z"}, // a year down
	} {
		got, ok := s.Latest(mustTime(t, tc.after), mustTime(t, tc.now))
		if tc.want == "" {
			if ok {
				t.Errorf("latest in (%s, %s]: %s, want none", tc.after, tc.now, got)
			}
			continue
		}
		if !ok || !got.Equal(mustTime(t, tc.want)) {
			t.Errorf("latest in (%s, %s]: %s %v, want %s", tc.after, tc.now, got, ok, tc.want)
		}
	}
}

func TestPeriod(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want time.Duration
	}{
		{"* * * * *", time.Minute},
		{"@every 6h", 6 * time.Hour},
		{"0 2 * * *", 24 * time.Hour},
		{"0 2 * * 1-5", 72 * time.Hour}, // the weekend
	} {
		s, err := Parse(tc.expr, "Europe/Berlin")
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Period(mustTime(t, "2026-12-01T00:00:00Z")); got != tc.want {
			t.Errorf("period of %q: %s, want %s", tc.expr, got, tc.want)
		}
	}
}

func TestParseRefusals(t *testing.T) {
	for _, tc := range []struct{ expr, tz, want string }{
		{"* * *", "", "expected exactly 5 fields"},
		{"CRON_TZ=UTC * * * * *", "", "set timeZone instead"},
		{"* * * * *", "Mars/Olympus", `unknown time zone "Mars/Olympus"`},
		{"61 * * * *", "", "61"},
	} {
		_, err := Parse(tc.expr, tc.tz)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q, %q): %v, want an error saying %q", tc.expr, tc.tz, err, tc.want)
		}
	}
}

func TestTimeOf(t *testing.T) {
	if got, ok := TimeOf("cp", "cp-20261201-070000"); !ok || !got.Equal(mustTime(t, "2026-12-01T07:00:00Z")) {
		t.Errorf("TimeOf: %s %v", got, ok)
	}
	if got, ok := TimeOf("cp", AltName("cp", mustTime(t, "2026-12-01T07:00:00Z"), 2)); !ok || !got.Equal(mustTime(t, "2026-12-01T07:00:00Z")) {
		t.Errorf("TimeOf an alternative name: %s %v", got, ok)
	}
	for _, n := range []string{"cp-by-hand", "other-20261201-070000", "cp-2026", "cp-20261201-070000x", "cp-20261201-070000-", "cp-20261201-070000-2a", "cp-chain-20261201-070000"} {
		if _, ok := TimeOf("cp", n); ok {
			t.Errorf("TimeOf(%q) is a scheduled time", n)
		}
		if Reserved("cp", n) {
			t.Errorf("%q is reserved", n)
		}
	}
	if !Reserved("cp", "cp-29991231-235900") || !Reserved("cp", "cp-20261201-070000-3") {
		t.Error("scheduled names are not reserved")
	}
}

// The names the server gives a target's own backups are told apart, and
// only those.
func TestAutomatic(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 5, 0, 0, time.UTC)
	for name, want := range map[string]string{
		Name("cp", at):                       KindScheduled,
		AltName("cp", at, 2):                 KindScheduled,
		ChainName("cp", at):                  KindChain,
		FoldName("cp", 1200):                 KindFold,
		"cp-chain-20261301-000000":           "", // no such month
		"cp-fold-12a":                        "",
		"cp-fold-":                           "",
		"app-chain-20261201-100500":          "",
		"cp-2-chain-20261201-100500":         "",
		"cp-" + at.Format("20060102-150405"): KindScheduled,
	} {
		got, ok := Automatic("cp", name)
		if got != want || ok != (want != "") {
			t.Errorf("Automatic(cp, %q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}
