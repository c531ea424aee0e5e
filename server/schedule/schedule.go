// Package schedule says when a target's scheduled backups are due: it
// parses a cron expression in a time zone, finds the latest scheduled time
// in an interval, the period an alert should allow, and the names of
// scheduled backups (TARGET-YYYYMMDD-HHMMSS, the scheduled time in UTC).
// It keeps no state and starts nothing.
package schedule

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	// The server image is static and has no zoneinfo: timeZone must work
	// all the same.
	_ "time/tzdata"
)

// Schedule is a parsed cron expression in its time zone.
type Schedule struct {
	cron cron.Schedule
	loc  *time.Location
}

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse parses expr — five fields (minute hour day-of-month month
// day-of-week) or a descriptor (@hourly, @daily, @weekly, @monthly,
// @every 6h) — in timeZone, an IANA name ("" is UTC).
func Parse(expr, timeZone string) (*Schedule, error) {
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, fmt.Errorf("a time zone in the expression is not supported; set timeZone instead")
	}
	loc := time.UTC
	if timeZone != "" {
		var err error
		if loc, err = time.LoadLocation(timeZone); err != nil {
			return nil, fmt.Errorf("unknown time zone %q: use an IANA name such as Europe/Berlin", timeZone)
		}
	}
	c, err := parser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("cron expression %q: %w", expr, err)
	}
	if spec, ok := c.(*cron.SpecSchedule); ok {
		spec.Location = loc
	}
	return &Schedule{cron: c, loc: loc}, nil
}

// Next is the first scheduled time after t.
func (s *Schedule) Next(t time.Time) time.Time {
	return s.cron.Next(t)
}

// maxSteps bounds Latest's walk: a per-minute schedule over a year of
// downtime is 525,600 steps.
const maxSteps = 1 << 20

// Latest is the latest scheduled time in (after, now], and whether there
// is one.
func (s *Schedule) Latest(after, now time.Time) (time.Time, bool) {
	var latest time.Time
	t := after
	for range maxSteps {
		n := s.cron.Next(t)
		if n.IsZero() || n.After(now) {
			break
		}
		latest, t = n, n
	}
	return latest, !latest.IsZero()
}

// Period is the longest gap between the next runs after t (up to 32 of
// them, within a year): the time between two successful backups that an
// alert must allow. A weekday schedule's period is its weekend.
func (s *Schedule) Period(t time.Time) time.Duration {
	var longest time.Duration
	prev := s.cron.Next(t)
	end := t.AddDate(1, 0, 0)
	for range 32 {
		n := s.cron.Next(prev)
		if n.IsZero() || n.After(end) {
			break
		}
		longest = max(longest, n.Sub(prev))
		prev = n
	}
	return longest
}

// nameLayout is the time in a scheduled backup's name.
const nameLayout = "20060102-150405"

// Name is the name of target's backup scheduled at t.
func Name(target string, t time.Time) string {
	return target + "-" + t.UTC().Format(nameLayout)
}

// TimeOf is the scheduled time a backup of target was named after, and
// whether name is such a name: Name's, or a run's stored under
// AltName because its own was taken.
func TimeOf(target, name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, target+"-")
	if !ok || len(rest) < len(nameLayout) {
		return time.Time{}, false
	}
	if tail := rest[len(nameLayout):]; tail != "" {
		n, ok := strings.CutPrefix(tail, "-")
		if !ok || n == "" || strings.Trim(n, "0123456789") != "" {
			return time.Time{}, false
		}
	}
	t, err := time.ParseInLocation(nameLayout, rest[:len(nameLayout)], time.UTC)
	return t, err == nil
}

// AltName is the name a run of target due at t takes when Name's was
// taken by a backup that is not the schedule's (an upload stored before
// such names were refused), the i-th try (i ≥ 2).
func AltName(target string, t time.Time, i int) string {
	return Name(target, t) + "-" + strconv.Itoa(i)
}

// Reserved says whether name is one the schedule of target may need
// (Name's or AltName's form): no user may take it.
func Reserved(target, name string) bool {
	_, ok := TimeOf(target, name)
	return ok
}
