// Package retention decides which of a target's backups its retention
// keeps and why (keepLast; keepHourly, keepDaily, keepWeekly, keepMonthly
// and keepYearly as restic and borg count them; maxAge; never the newest,
// the newest verified nor the full the delta chain grows from) and
// removes the others, keeping those in use: downloads in progress and
// backups a running restore Job reads.
package retention

import (
	"fmt"
	"slices"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Labels the server puts on scheduled backups, for `list -l`. They say
// what the manifest's source says (storage.Source.Scheduled, Target);
// nothing is decided by them, and clients may not set any label under
// etcdbackup.io/ (ReservedLabelPrefix).
const (
	LabelScheduled = "etcdbackup.io/scheduled"
	LabelTarget    = "etcdbackup.io/target"
	// ReservedLabelPrefix is the prefix of the labels only the server
	// writes.
	ReservedLabelPrefix = ebv1.ReservedLabelPrefix
)

// The rules that keep a backup whatever the count rules and maxAge say.
const (
	RuleNewest         = "newest"
	RuleNewestVerified = "newest verified"
	RuleChainBase      = "delta chain base"
	// RuleWithinMaxAge keeps a backup when no count rule is configured
	// and it is not older than maxAge.
	RuleWithinMaxAge = "within maxAge"
)

// ScheduledOf tells whether m is a scheduled backup, and of which target.
// The server's word is the manifest's source (Scheduled, written when a
// scheduled agent's upload commits). Backups stored by servers before it
// had that field say so in their labels, which then came from the agent
// Job; those are believed only for an agent's backup of that very
// target.
func ScheduledOf(m *storage.Manifest) (target string, ok bool) {
	switch {
	case m.Source.Kind != ebv1.SourceAgent || m.Source.Target == "":
		return "", false
	case m.Source.Scheduled:
		return m.Source.Target, true
	case m.Source.ScheduledTime.IsZero() && m.Labels[LabelScheduled] == "true" && m.Labels[LabelTarget] == m.Source.Target:
		return m.Source.Target, true // written before Source.Scheduled
	}
	return "", false
}

// Automatic tells whether m is one of the backups the server takes of
// target on its own: a scheduled one, or a full its delta capture took
// (a chain base or a fold: names no user may choose).
func Automatic(m *storage.Manifest, target string) bool {
	if t, ok := ScheduledOf(m); ok {
		return t == target
	}
	if !m.OfTarget(target) {
		return false
	}
	kind, ok := schedule.Automatic(target, m.Name)
	return ok && kind != schedule.KindScheduled
}

// ofTarget tells whether m is a backup of target retention counts: one
// the server took on its own or, when others count too, any an agent
// took of it.
func ofTarget(m *storage.Manifest, target string, includeUnscheduled bool) bool {
	if includeUnscheduled {
		return m.OfTarget(target)
	}
	return Automatic(m, target)
}

// Policy is one target's retention as Plan applies it.
type Policy struct {
	Target    string
	Retention config.Retention
	// TimeZone places the hours, days, weeks, months and years the
	// calendar rules count (nil: UTC).
	TimeZone *time.Location
	// IncludeUnscheduled counts the target's other agent backups too.
	IncludeUnscheduled bool
	// Deltas keeps the full the target's delta chain grows from.
	Deltas bool
}

// PolicyOf is target t's retention policy; t.Retention must be set.
func PolicyOf(t config.Target, includeUnscheduled bool) Policy {
	p := Policy{Target: t.Name, Retention: *t.Retention, IncludeUnscheduled: includeUnscheduled, Deltas: t.Deltas != nil, TimeZone: time.UTC}
	if t.TimeZone != "" {
		if loc, err := time.LoadLocation(t.TimeZone); err == nil { // config.Validate checked it
			p.TimeZone = loc
		}
	}
	return p
}

// Decision is what retention does with one backup.
type Decision struct {
	Manifest *storage.Manifest
	// Keep is false for a backup retention removes.
	Keep bool
	// Rules are those that keep it ("newest", "keepLast #2",
	// "keepDaily 2026-12-05", …), or for a removed one why it goes.
	Rules []string
}

// calendarRule keeps the newest backup of each of the newest N periods
// that have one; period names the period a time falls in.
type calendarRule struct {
	name   string
	n      int
	period func(time.Time) string
}

func calendarRules(r config.Retention) []calendarRule {
	return []calendarRule{
		{"keepHourly", r.KeepHourly, func(t time.Time) string { return t.Format("2006-01-02 15h") }},
		{"keepDaily", r.KeepDaily, func(t time.Time) string { return t.Format("2006-01-02") }},
		{"keepWeekly", r.KeepWeekly, func(t time.Time) string {
			y, w := t.ISOWeek()
			return fmt.Sprintf("%04d-W%02d", y, w)
		}},
		{"keepMonthly", r.KeepMonthly, func(t time.Time) string { return t.Format("2006-01") }},
		{"keepYearly", r.KeepYearly, func(t time.Time) string { return t.Format("2006") }},
	}
}

// Plan returns, newest first, what p keeps and removes of its target's
// backups among manifests (one location), and why. As in restic and
// borg, the backups are walked newest first and each calendar rule keeps
// one when its period differs from the last one the rule kept, until it
// has kept N; keepLast keeps the first N. A backup any count rule keeps
// is kept; with no count rule, every one is. Then maxAge removes what is
// older, kept or not — but never the newest backup, the newest one a
// restore drill verified (the one known to restore), nor the full the
// delta chain grows from (its agent is appending to it).
func Plan(manifests []*storage.Manifest, p Policy, now time.Time) []Decision {
	var mine []*storage.Manifest
	for _, m := range manifests {
		if ofTarget(m, p.Target, p.IncludeUnscheduled) {
			mine = append(mine, m)
		}
	}
	// Newest first, as backups are listed.
	slices.SortFunc(mine, func(a, b *storage.Manifest) int {
		return ebv1.CompareListing(a.CreateTime, a.Name, b.CreateTime, b.Name)
	})
	tz := p.TimeZone
	if tz == nil {
		tz = time.UTC
	}
	r := p.Retention
	verified := slices.IndexFunc(mine, Verified)
	var base *storage.Manifest
	if p.Deltas {
		base = storage.NewestChainBase(mine, p.Target)
	}
	rules := calendarRules(r)
	kept := make([]int, len(rules))
	last := make([]string, len(rules))
	out := make([]Decision, 0, len(mine))
	for i, m := range mine {
		d := Decision{Manifest: m}
		var protected []string
		if i == 0 {
			protected = append(protected, RuleNewest)
		}
		if i == verified {
			protected = append(protected, RuleNewestVerified)
		}
		if m == base {
			protected = append(protected, RuleChainBase)
		}
		var counted []string
		if i < r.KeepLast {
			counted = append(counted, fmt.Sprintf("keepLast #%d", i+1))
		}
		t := m.CreateTime.In(tz)
		for j, rule := range rules {
			if kept[j] >= rule.n {
				continue
			}
			if period := rule.period(t); period != last[j] {
				last[j] = period
				kept[j]++
				counted = append(counted, rule.name+" "+period)
			}
		}
		old := r.MaxAge.Duration > 0 && now.Sub(m.CreateTime) > r.MaxAge.Duration
		switch {
		case len(protected) > 0:
			d.Keep, d.Rules = true, append(protected, counted...)
		case old:
			d.Rules = []string{"older than maxAge " + r.MaxAge.Duration.String()}
		case len(counted) > 0:
			d.Keep, d.Rules = true, counted
		case !r.Counts():
			d.Keep, d.Rules = true, []string{RuleWithinMaxAge}
		default:
			d.Rules = []string{"kept by no rule"}
		}
		out = append(out, d)
	}
	return out
}

// Select returns what p removes of its target's backups among manifests
// (one location), newest first.
func Select(manifests []*storage.Manifest, p Policy, now time.Time) []*storage.Manifest {
	var out []*storage.Manifest
	for _, d := range Plan(manifests, p, now) {
		if !d.Keep {
			out = append(out, d.Manifest)
		}
	}
	return out
}

// Verified says whether m's newest restore drill succeeded.
func Verified(m *storage.Manifest) bool {
	return m.Verification != nil && m.Verification.Result == storage.VerificationSucceeded
}
