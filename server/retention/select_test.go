package retention_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

func TestSelectPrunable(t *testing.T) {
	base := backuptest.MustTime(t, "2026-12-01T00:00:00Z")
	m := func(name string, hoursAgo int, scheduled bool, target string) *storage.Manifest {
		man := &storage.Manifest{Name: name, CreateTime: base.Add(-time.Duration(hoursAgo) * time.Hour), Source: storage.Source{Kind: ebv1.SourceAgent, Target: target}}
		man.Source.Scheduled = scheduled
		return man
	}
	all := []*storage.Manifest{
		m("s1", 1, true, "cp"), m("s2", 2, true, "cp"), m("s3", 3, true, "cp"), m("s4", 50, true, "cp"),
		m("d1", 0, false, "cp"), m("d2", 60, false, "cp"),
		m("other", 100, true, "app"),
		{Name: "upload", CreateTime: base.Add(-200 * time.Hour), Source: storage.Source{Kind: ebv1.SourceUpload}},
		// Labels decide nothing: an upload that carries the server's
		// labels (stored before they were refused) is no scheduled backup,
		// nor is another target's agent backup labelled as cp's.
		{Name: "upload-labelled", CreateTime: base.Add(-300 * time.Hour), Source: storage.Source{Kind: ebv1.SourceUpload},
			Labels: map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: "cp"}},
		{Name: "app-labelled", CreateTime: base.Add(-300 * time.Hour), Source: storage.Source{Kind: ebv1.SourceAgent, Target: "app"},
			Labels: map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: "cp"}},
	}
	for _, tc := range []struct {
		name string
		r    config.Retention
		all  bool
		want []string
	}{
		{"keepLast 2: scheduled only", config.Retention{KeepLast: 2}, false, []string{"s3", "s4"}},
		{"keepLast 2 with unscheduled", config.Retention{KeepLast: 2}, true, []string{"s2", "s3", "s4", "d2"}},
		{"maxAge 24h", config.Retention{MaxAge: metav1.Duration{Duration: 24 * time.Hour}}, false, []string{"s4"}},
		{"both: either removes", config.Retention{KeepLast: 3, MaxAge: metav1.Duration{Duration: 150 * time.Minute}}, false, []string{"s3", "s4"}},
		{"never the newest, however old", config.Retention{KeepLast: 1, MaxAge: metav1.Duration{Duration: time.Minute}}, false, []string{"s2", "s3", "s4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backuptest.Equal(t, "prunable", names(retention.Select(all, retention.Policy{Target: "cp", Retention: tc.r, IncludeUnscheduled: tc.all}, base)), tc.want)
		})
	}
	// The newest of a target stays even when every one is past maxAge.
	old := []*storage.Manifest{m("a", 100, true, "cp"), m("b", 200, true, "cp")}
	backuptest.Equal(t, "prunable of old ones", names(retention.Select(old, retention.Policy{Target: "cp", Retention: config.Retention{MaxAge: metav1.Duration{Duration: time.Hour}}}, base)), []string{"b"})
}

// Which manifests are scheduled backups: the source's word; labels only
// on an agent's backup of that target stored before the source said it.
func TestScheduledOf(t *testing.T) {
	labels := map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: "cp"}
	at := backuptest.MustTime(t, "2026-12-01T09:00:00Z")
	for _, tc := range []struct {
		name string
		m    storage.Manifest
		want string
	}{
		{"scheduled agent backup", storage.Manifest{Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Scheduled: true, ScheduledTime: at}}, "cp"},
		{"on-demand agent backup", storage.Manifest{Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp"}}, ""},
		{"agent backup labelled by an earlier server", storage.Manifest{Labels: labels, Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp"}}, "cp"},
		{"agent backup of another target labelled cp", storage.Manifest{Labels: labels, Source: storage.Source{Kind: ebv1.SourceAgent, Target: "app"}}, ""},
		{"upload labelled as scheduled", storage.Manifest{Labels: labels, Source: storage.Source{Kind: ebv1.SourceUpload}}, ""},
		{"upload claiming the field", storage.Manifest{Source: storage.Source{Kind: ebv1.SourceUpload, Target: "cp", Scheduled: true}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := retention.ScheduledOf(&tc.m)
			if got != tc.want || ok != (tc.want != "") {
				t.Fatalf("ScheduledOf: %q %v, want %q", got, ok, tc.want)
			}
		})
	}
}

// Retention never removes the newest backup a drill verified, however
// many newer ones keepLast keeps; a failed drill earns nothing.
func TestSelectKeepsTheNewestVerified(t *testing.T) {
	base := backuptest.MustTime(t, "2026-12-01T00:00:00Z")
	m := func(name string, hoursAgo int, result string) *storage.Manifest {
		man := &storage.Manifest{Name: name, CreateTime: base.Add(-time.Duration(hoursAgo) * time.Hour),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Scheduled: true}}
		if result != "" {
			man.Verification = &storage.Verification{Result: result}
		}
		return man
	}
	all := []*storage.Manifest{
		m("s1", 1, storage.VerificationFailed), m("s2", 2, ""), m("s3", 3, storage.VerificationSucceeded),
		m("s4", 4, storage.VerificationSucceeded), m("s5", 5, ""),
	}
	var got []string
	for _, p := range retention.Select(all, retention.Policy{Target: "cp", Retention: config.Retention{KeepLast: 1}}, base) {
		got = append(got, p.Name)
	}
	backuptest.Equal(t, "prunable", got, []string{"s2", "s4", "s5"})
}

// The fulls a target's delta capture takes (chain bases, folds: names
// only the server gives) count with its scheduled backups, so a target
// with deltas and no schedule does not grow until someone prunes by
// hand; an on-demand backup counts only with --all, and the full the
// delta chain grows from is never removed.
func TestSelectCountsTheDeltaCapturesFulls(t *testing.T) {
	base := backuptest.MustTime(t, "2026-12-01T00:00:00Z")
	full := func(name string, hoursAgo int, revision int64) *storage.Manifest {
		return &storage.Manifest{Name: name, CreateTime: base.Add(-time.Duration(hoursAgo) * time.Hour),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp"},
			Etcd:   &storage.EtcdInfo{Revision: revision, SnapshotStatus: true, Keyspace: true}}
	}
	// The fold of an old chain, stored after the newest chain base: the
	// newest by creation, but the chain grows from cp-chain-…-000000.
	fold := full("cp-fold-900", 1, 900)
	fold.Source.StartTime = base.Add(-30 * time.Hour)
	all := []*storage.Manifest{
		fold,
		full("cp-chain-20261130-220000", 2, 1200),
		full("cp-fold-800", 20, 800),
		full("cp-chain-20261129-000000", 48, 500),
		full("before-upgrade", 50, 400), // on demand
		{Name: "cp-chain-20261128-000000", CreateTime: base.Add(-72 * time.Hour), Source: storage.Source{Kind: ebv1.SourceUpload, ClaimedTarget: "cp"}},
	}
	keep1 := config.Retention{KeepLast: 1}
	got := retention.Plan(all, retention.Policy{Target: "cp", Retention: keep1, Deltas: true}, base)
	var kept, removed []string
	for _, d := range got {
		if d.Keep {
			kept = append(kept, d.Manifest.Name+": "+strings.Join(d.Rules, ", "))
		} else {
			removed = append(removed, d.Manifest.Name)
		}
	}
	backuptest.Equal(t, "kept", kept, []string{"cp-fold-900: newest, keepLast #1", "cp-chain-20261130-220000: delta chain base"})
	backuptest.Equal(t, "removed", removed, []string{"cp-fold-800", "cp-chain-20261129-000000"})
	withAll := retention.Select(all, retention.Policy{Target: "cp", Retention: keep1, Deltas: true, IncludeUnscheduled: true}, base)
	backuptest.Equal(t, "removed with --all", names(withAll), []string{"cp-fold-800", "cp-chain-20261129-000000", "before-upgrade"})
}

func names(ms []*storage.Manifest) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// A year of hourly scheduled backups (made with an injected clock),
// pruned by grandfather-father-son rules: exactly the newest backup of
// each of the newest N hours, days, ISO weeks, months and years is kept,
// in the target's time zone, and the plan names the rules that keep each.
func TestPlanGrandfatherFatherSon(t *testing.T) {
	tz, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	// Wednesday 2026-12-02 00:30 in Berlin (23:30 UTC the day before).
	now := time.Date(2026, 12, 2, 0, 30, 0, 0, tz)
	var all []*storage.Manifest
	first := now.AddDate(-1, 0, 0)
	for at := first; !at.After(now); at = at.Add(time.Hour) {
		name := "cp-" + at.UTC().Format("20060102-150405")
		all = append(all, &storage.Manifest{Name: name, CreateTime: at.UTC(),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Scheduled: true, ScheduledTime: at.UTC()}})
	}
	// Listed in storage order, not by time.
	slices.Reverse(all[len(all)/2:])
	berlin := func(s string) string {
		at, err := time.ParseInLocation("2006-01-02 15:04", s, tz)
		if err != nil {
			t.Fatal(err)
		}
		return "cp-" + at.UTC().Format("20060102-150405")
	}
	for _, tc := range []struct {
		name string
		r    config.Retention
		want map[string]string // backup (Berlin time) → rules
	}{
		{"keepLast and keepHourly", config.Retention{KeepLast: 2, KeepHourly: 3}, map[string]string{
			"2026-12-02 00:30": "newest, keepLast #1, keepHourly 2026-12-02 00h",
			"2026-12-01 23:30": "keepLast #2, keepHourly 2026-12-01 23h",
			"2026-12-01 22:30": "keepHourly 2026-12-01 22h",
		}},
		{"keepDaily 3: the last backup of each day", config.Retention{KeepDaily: 3}, map[string]string{
			"2026-12-02 00:30": "newest, keepDaily 2026-12-02",
			"2026-12-01 23:30": "keepDaily 2026-12-01",
			"2026-11-30 23:30": "keepDaily 2026-11-30",
		}},
		{"keepWeekly 3: ISO weeks, Monday first", config.Retention{KeepWeekly: 3}, map[string]string{
			"2026-12-02 00:30": "newest, keepWeekly 2026-W49",
			"2026-11-29 23:30": "keepWeekly 2026-W48", // Sunday
			"2026-11-22 23:30": "keepWeekly 2026-W47",
		}},
		{"keepMonthly 13 reaches the first backup", config.Retention{KeepMonthly: 13}, map[string]string{
			"2026-12-02 00:30": "newest, keepMonthly 2026-12",
			"2026-11-30 23:30": "keepMonthly 2026-11", "2026-10-31 23:30": "keepMonthly 2026-10",
			"2026-09-30 23:30": "keepMonthly 2026-09", "2026-08-31 23:30": "keepMonthly 2026-08",
			"2026-07-31 23:30": "keepMonthly 2026-07", "2026-06-30 23:30": "keepMonthly 2026-06",
			"2026-05-31 23:30": "keepMonthly 2026-05", "2026-04-30 23:30": "keepMonthly 2026-04",
			"2026-03-31 23:30": "keepMonthly 2026-03", "2026-02-28 23:30": "keepMonthly 2026-02",
			"2026-01-31 23:30": "keepMonthly 2026-01", "2025-12-31 23:30": "keepMonthly 2025-12",
		}},
		{"keepYearly 5: only the years that have one", config.Retention{KeepYearly: 5}, map[string]string{
			"2026-12-02 00:30": "newest, keepYearly 2026",
			"2025-12-31 23:30": "keepYearly 2025",
		}},
		{"rules overlap: one backup, every rule named", config.Retention{KeepDaily: 2, KeepWeekly: 2, KeepMonthly: 2}, map[string]string{
			"2026-12-02 00:30": "newest, keepDaily 2026-12-02, keepWeekly 2026-W49, keepMonthly 2026-12",
			"2026-12-01 23:30": "keepDaily 2026-12-01",
			"2026-11-30 23:30": "keepMonthly 2026-11",
			"2026-11-29 23:30": "keepWeekly 2026-W48",
		}},
		{"maxAge removes what the rules keep", config.Retention{KeepDaily: 3, MaxAge: metav1.Duration{Duration: 24 * time.Hour}}, map[string]string{
			"2026-12-02 00:30": "newest, keepDaily 2026-12-02",
			"2026-12-01 23:30": "keepDaily 2026-12-01",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]string{}
			for at, rules := range tc.want {
				want[berlin(at)] = rules
			}
			got := map[string]string{}
			removed := 0
			for _, d := range retention.Plan(all, retention.Policy{Target: "cp", Retention: tc.r, TimeZone: tz}, now.UTC()) {
				if d.Keep {
					got[d.Manifest.Name] = strings.Join(d.Rules, ", ")
				} else {
					removed++
				}
			}
			if !maps.Equal(got, want) {
				t.Errorf("kept:\n%s\nwant:\n%s", show(got), show(want))
			}
			if removed+len(got) != len(all) {
				t.Errorf("%d kept and %d removed of %d backups", len(got), removed, len(all))
			}
		})
	}
}

func show(m map[string]string) string {
	var lines []string
	for k, v := range m {
		lines = append(lines, k+": "+v)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
