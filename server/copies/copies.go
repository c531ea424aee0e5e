// Package copies keeps each storage location's copy locations holding
// what it holds: the data server's copier, which runs on the elected
// replica beside the controller. For each location with copies and each
// of its copy locations a loop of its own compares the two listings —
// storage is the queue, so a restart or a new leader resumes where the
// last stopped — and copies what is missing as stored (backups, delta
// segments, recovery kits: encrypted bytes stay encrypted), the bytes
// read once and their SHA-256 checked against the manifest before the
// copy's manifest is written. A failed copy is retried with backoff, per
// object; a copy location that is down holds up only its own loop. After
// copying it applies each target's retention in the copy location
// (config.Target.RetentionIn). An object the copy location's ledger
// records deleted there (by delete or retention) is not copied again.
package copies

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Defaults of Config.
const (
	DefaultInterval   = 10 * time.Second
	DefaultMinBackoff = 10 * time.Second
	DefaultMaxBackoff = 10 * time.Minute
)

// Config is what a Copier needs.
type Config struct {
	Locations *domain.Locations
	// Targets' retention is applied in copy locations after copying.
	Targets []config.Target
	Pruner  *retention.Pruner
	Metrics *metrics.Metrics
	// Logger nil logs nothing; Now nil is time.Now.
	Logger *slog.Logger
	Now    func() time.Time
	// Interval is how often each pair of locations is compared (0:
	// DefaultInterval); MinBackoff and MaxBackoff bound the wait before
	// a failed copy is tried again (0: the defaults).
	Interval               time.Duration
	MinBackoff, MaxBackoff time.Duration
}

// Copier copies each location's objects to its copy locations (Run),
// and answers what it knows of them (CopyStatus). Safe for concurrent
// use.
type Copier struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex
	pairs map[pair]*pairState
	// deleted are the objects each copy location's ledger records
	// deleted, read incrementally.
	deleted map[string]*Deletions
}

type pair struct{ from, to string }

// pairState is what one loop knows between its rounds.
type pairState struct {
	failing map[string]*domain.CopyFailure // by object name
	sha     map[string]string              // the SHA-256 each failure was of
	// have are the names the copy location held when it last answered a
	// listing, with what was copied since: what counts as copied while
	// it does not answer.
	have map[string]bool
	// down is set while the copy location does not answer a listing.
	down *domain.CopyFailure
}

// New returns the Copier cfg describes.
func New(cfg Config) *Copier {
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, DefaultMinBackoff)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, DefaultMaxBackoff)
	c := &Copier{cfg: cfg, log: cfg.Logger, now: cfg.Now, pairs: map[pair]*pairState{}, deleted: map[string]*Deletions{}}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// Run copies until ctx ends: one loop per location and copy location,
// each a round every Interval.
func (c *Copier) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, from := range c.cfg.Locations.All() {
		for _, name := range from.Copies {
			to, ok := c.cfg.Locations.Lookup(name)
			if !ok { // domain.NewLocations checked it
				continue
			}
			// Series an alert reads exist from the start, at zero.
			c.cfg.Metrics.CopyFailures.WithLabelValues(from.Name, to.Name)
			c.cfg.Metrics.Copied.WithLabelValues(from.Name, to.Name)
			c.cfg.Metrics.CopiedBytes.WithLabelValues(from.Name, to.Name)
			c.cfg.Metrics.CopyLag.WithLabelValues(from.Name, to.Name)
			c.cfg.Metrics.CopiesPending.WithLabelValues(from.Name, to.Name)
			wg.Go(func() { c.loop(ctx, from, to) })
		}
	}
	wg.Wait()
}

func (c *Copier) loop(ctx context.Context, from, to *domain.Location) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		c.Round(ctx, from, to)
		timer.Reset(c.cfg.Interval)
	}
}

// RoundResult is what one round did.
type RoundResult struct {
	// Copied are the names copied; Failed those that failed.
	Copied, Failed []string
	// Pending counts what is still to copy (failed ones included).
	Pending int
}

// Round compares from with to once and copies what is missing, then
// applies retention in to if it copied anything.
func (c *Copier) Round(ctx context.Context, from, to *domain.Location) RoundResult {
	var res RoundResult
	labels := []string{from.Name, to.Name}
	src, err := from.List(ctx)
	if err != nil {
		// The location's own unavailability is reported (and alerted on)
		// as such; its copies wait for it.
		c.log.Debug("copies: list the location copied from", "location", from.Name, "copy", to.Name, "error", err)
		return res
	}
	dst, dstErr := to.List(ctx)
	del, delErr := c.deletionsOf(ctx, to)
	if delErr != nil && !errors.Is(delErr, domain.ErrNoLedger) {
		c.log.Warn("copies: read the copy location's ledger (what was deleted there is copied again)", "copy", to.Name, "error", delErr)
	}
	now := c.now()
	st := c.state(from.Name, to.Name)
	if dstErr != nil {
		// Pending is what was pending when it last answered, with what
		// was stored since; the lag grows from the oldest of them.
		c.mu.Lock()
		if st.down == nil {
			// Said once, not every round: the metrics and list tell the rest.
			c.log.Warn("copies: the copy location cannot be listed; copies wait and are retried every round", "location", from.Name, "copy", to.Name, "error", dstErr)
			st.down = &domain.CopyFailure{Since: now}
		}
		st.down.Attempts++
		st.down.Message = fmt.Sprintf("copy location %q cannot be listed: %v", to.Name, dstErr)
		st.down.Next = now.Add(c.cfg.Interval)
		c.mu.Unlock()
		c.cfg.Metrics.CopyFailures.WithLabelValues(labels...).Inc()
		c.record(from.Name, to.Name, Missing(src, c.have(st, nil), del), now)
		return res
	}
	c.mu.Lock()
	if st.down != nil {
		c.log.Info("copies: the copy location answers again; catching up", "location", from.Name, "copy", to.Name, "down", now.Sub(st.down.Since).Round(time.Second))
	}
	st.down = nil
	c.mu.Unlock()
	todo := Missing(src, c.have(st, dst), del)
	res.Pending = len(todo)
	for _, m := range todo {
		if ctx.Err() != nil {
			break
		}
		c.mu.Lock()
		f := st.failing[m.Name]
		waiting := f != nil && st.sha[m.Name] == m.SHA256 && now.Before(f.Next)
		c.mu.Unlock()
		if waiting {
			continue
		}
		n, err := c.copyOne(ctx, from, to, m)
		if err == nil {
			c.succeeded(st, m.Name)
			res.Copied = append(res.Copied, m.Name)
			res.Pending--
			c.cfg.Metrics.Copied.WithLabelValues(labels...).Inc()
			c.cfg.Metrics.CopiedBytes.WithLabelValues(labels...).Add(float64(n))
			c.log.Info("copied", "location", from.Name, "copy", to.Name, "name", m.Name, "bytes", n, "sha256", m.SHA256)
			continue
		}
		if ctx.Err() != nil {
			break
		}
		res.Failed = append(res.Failed, m.Name)
		c.failed(st, m, err)
		c.cfg.Metrics.CopyFailures.WithLabelValues(labels...).Inc()
		c.log.Warn("copy failed; retrying with backoff", "location", from.Name, "copy", to.Name, "name", m.Name, "error", err)
		if to.Unavailable() != nil {
			break // the rest would fail the same way
		}
	}
	c.forgetGone(st, src)
	if len(res.Copied) > 0 {
		// What retention removes here stays among the names held until
		// the next round lists them: none of it is pending either way.
		c.retain(ctx, from, to)
	}
	c.record(from.Name, to.Name, Missing(src, c.have(st, nil), del), c.now())
	return res
}

// have records dst (nil: keeps the last) and returns the names the copy
// location holds as far as the pair knows.
func (c *Copier) have(st *pairState, dst []*storage.Manifest) map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dst != nil || st.have == nil {
		st.have = make(map[string]bool, len(dst))
		for _, m := range dst {
			st.have[m.Name] = true
		}
	}
	return maps.Clone(st.have)
}

// record sets the pair's pending count and lag: the age of the oldest
// object still to copy.
func (c *Copier) record(from, to string, todo []*storage.Manifest, now time.Time) {
	var lag time.Duration
	for _, m := range todo {
		lag = max(lag, now.Sub(m.CreateTime))
	}
	c.cfg.Metrics.CopiesPending.WithLabelValues(from, to).Set(float64(len(todo)))
	c.cfg.Metrics.CopyLag.WithLabelValues(from, to).Set(lag.Seconds())
}

// Missing are the objects of src that a copy location holding the names
// have lacks
// and that were not deleted there on purpose (del): backups newest first
// (the newest is the one a restore wants), then their parts (delta
// segments, kits) oldest first. A part of a backup deleted in the copy
// location is not copied; an object whose name it holds is not either,
// whatever its content (CopyStatus says conflict).
func Missing(src []*storage.Manifest, have map[string]bool, del *Deletions) []*storage.Manifest {
	backups, parts := storage.SplitParts(src)
	sha := make(map[string]string, len(backups))
	for _, m := range backups {
		sha[m.Name] = m.SHA256
	}
	var todo []*storage.Manifest
	for _, m := range backups {
		if !have[m.Name] && !del.Has(m.Name, m.SHA256) {
			todo = append(todo, m)
		}
	}
	slices.SortFunc(todo, func(a, b *storage.Manifest) int {
		return cmp.Or(b.CreateTime.Compare(a.CreateTime), cmp.Compare(a.Name, b.Name))
	})
	var later []*storage.Manifest
	for _, m := range parts {
		if have[m.Name] || del.Has(m.Name, m.SHA256) {
			continue
		}
		if b := backupOf(m); b != "" && del.Has(b, sha[b]) {
			continue
		}
		later = append(later, m)
	}
	slices.SortFunc(later, func(a, b *storage.Manifest) int {
		return cmp.Or(a.CreateTime.Compare(b.CreateTime), cmp.Compare(a.Name, b.Name))
	})
	return append(todo, later...)
}

// backupOf is the backup part m is stored with.
func backupOf(m *storage.Manifest) string {
	switch {
	case m.Kit != nil:
		return m.Kit.Backup
	case m.Delta != nil:
		return m.Delta.Chain
	}
	return ""
}

// copyOne copies m from from to to as stored: its bytes read once, their
// SHA-256 and size checked against the manifest before the copy's
// manifest is written (which makes it exist there). The copy's manifest
// is the original's, marked a copy, with the copy location's own object
// lock.
func (c *Copier) copyOne(ctx context.Context, from, to *domain.Location, m *storage.Manifest) (int64, error) {
	r, got, err := from.Open(ctx, m.Name, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("read %q from location %q: %w", m.Name, from.Name, err)
	}
	defer r.Close()
	u, err := to.Create(ctx, m.Name)
	if err != nil {
		return 0, fmt.Errorf("create %q in location %q: %w", m.Name, to.Name, err)
	}
	committed := false
	defer func() {
		if !committed {
			u.Abort()
		}
	}()
	h := sha256.New()
	n, err := io.CopyBuffer(u, io.TeeReader(r, h), make([]byte, 1<<20))
	if err != nil {
		return n, fmt.Errorf("copy %q from location %q to %q: %w", m.Name, from.Name, to.Name, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != got.Size || sum != got.SHA256 {
		return n, fmt.Errorf("%w: %q in location %q read as %d bytes with SHA-256 %s, its manifest records %d bytes with %s: nothing was stored in %q; check it with `kubectl etcdbackup verify %s --location %s`",
			ErrDamaged, m.Name, from.Name, n, sum, got.Size, got.SHA256, to.Name, m.Name, from.Name)
	}
	cm := got.Clone()
	cm.LockedUntil = time.Time{}
	cm.Copy = &storage.CopyOf{From: from.Name, Time: c.now().UTC()}
	if err := u.Commit(ctx, cm); err != nil {
		return n, fmt.Errorf("store %q in location %q: %w", m.Name, to.Name, err)
	}
	committed = true
	if !got.IsSegment() {
		// A delta segment is not entered on its own (one every few
		// seconds would bury the rest): its chain's full is.
		who := "server (copies)"
		to.Note(ctx, c.log, ledger.Entry{Action: ledger.ActionCopy, Backup: m.Name, SHA256: got.SHA256, Who: who,
			Detail: fmt.Sprintf("copied from location %s (%d bytes, SHA-256 checked)", from.Name, n)})
		from.Note(ctx, c.log, ledger.Entry{Action: ledger.ActionCopy, Backup: m.Name, SHA256: got.SHA256, Who: who,
			Detail: "copied to location " + to.Name})
	}
	return n, nil
}

// ErrDamaged is a copy refused because the bytes read do not hash to
// what the original's manifest records.
var ErrDamaged = errors.New("the stored bytes do not match their manifest")

// retain applies, in the copy location to, the retention of each target
// whose backups are stored in from.
func (c *Copier) retain(ctx context.Context, from, to *domain.Location) {
	if c.cfg.Pruner == nil {
		return
	}
	var ms []*storage.Manifest
	for _, t := range c.cfg.Targets {
		if c.cfg.Locations.OfTarget(t) != from.Name {
			continue
		}
		r := t.RetentionIn(to.Name)
		if r == nil {
			continue
		}
		if ms == nil {
			var err error
			if ms, err = to.List(ctx); err != nil {
				c.log.Warn("copies: retention in the copy location", "copy", to.Name, "error", err)
				return
			}
		}
		t.Retention = r
		res, err := c.cfg.Pruner.Prune(ctx, retention.Request{Location: to, Manifests: ms, Policy: retention.PolicyOf(t, false),
			By: "server (retention of copies from " + from.Name + ")"})
		if err != nil {
			c.log.Warn("copies: retention in the copy location", "copy", to.Name, "target", t.Name, "error", err)
			continue
		}
		if len(res.Pruned) > 0 {
			ms = nil // listed again for the next target
		}
	}
}

func (c *Copier) state(from, to string) *pairState {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := pair{from, to}
	st := c.pairs[k]
	if st == nil {
		st = &pairState{failing: map[string]*domain.CopyFailure{}, sha: map[string]string{}}
		c.pairs[k] = st
	}
	return st
}

func (c *Copier) succeeded(st *pairState, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(st.failing, name)
	delete(st.sha, name)
	if st.have != nil {
		st.have[name] = true
	}
}

func (c *Copier) failed(st *pairState, m *storage.Manifest, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	f := st.failing[m.Name]
	if f == nil || st.sha[m.Name] != m.SHA256 {
		f = &domain.CopyFailure{Since: now}
		st.failing[m.Name], st.sha[m.Name] = f, m.SHA256
	}
	f.Attempts++
	f.Message = err.Error()
	f.Next = now.Add(c.backoff(f.Attempts))
}

// backoff is the wait after the nth failed attempt: doubling from
// MinBackoff up to MaxBackoff.
func (c *Copier) backoff(n int) time.Duration {
	d := c.cfg.MinBackoff
	for i := 1; i < n && d < c.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, c.cfg.MaxBackoff)
}

// forgetGone drops failures of objects no longer in the location.
func (c *Copier) forgetGone(st *pairState, src []*storage.Manifest) {
	names := make(map[string]bool, len(src))
	for _, m := range src {
		names[m.Name] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for n := range st.failing {
		if !names[n] {
			delete(st.failing, n)
			delete(st.sha, n)
		}
	}
}

// CopyStatus implements domain.CopyTracker.
func (c *Copier) CopyStatus(from, to, name, sha string) domain.CopyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s domain.CopyStatus
	if d := c.deleted[to]; d != nil && d.Has(name, sha) {
		s.Skipped = true
		return s
	}
	if st := c.pairs[pair{from, to}]; st != nil {
		if f := st.failing[name]; f != nil && st.sha[name] == sha {
			cp := *f
			s.Failing = &cp
		} else if f := st.down; f != nil && !st.have[name] {
			cp := *f
			s.Failing = &cp
		}
	}
	return s
}

// Deletions are the objects a location's ledger records deleted (by
// delete or retention), by name and SHA-256.
type Deletions struct {
	// after is the last record read.
	after  uint64
	byName map[string][]string
}

// Has says whether name with content sha was deleted; a nil Deletions
// holds nothing.
func (d *Deletions) Has(name, sha string) bool {
	if d == nil {
		return false
	}
	for _, s := range d.byName[name] {
		if s == "" || s == sha {
			return true
		}
	}
	return false
}

// deletionsOf reads the records of to's ledger it has not read yet.
func (c *Copier) deletionsOf(ctx context.Context, to *domain.Location) (*Deletions, error) {
	c.mu.Lock()
	d := c.deleted[to.Name]
	if d == nil {
		d = &Deletions{byName: map[string][]string{}}
		c.deleted[to.Name] = d
	}
	after := d.after
	c.mu.Unlock()
	const page = 1000
	for {
		recs, err := to.ReadLedger(ctx, after, page)
		if err != nil {
			c.mu.Lock()
			defer c.mu.Unlock()
			return &Deletions{after: d.after, byName: maps.Clone(d.byName)}, err
		}
		c.mu.Lock()
		for _, r := range recs {
			var e ledger.Entry
			if json.Unmarshal(r.Data, &e) == nil && (e.Action == ledger.ActionDelete || e.Action == ledger.ActionPrune) && e.Backup != "" {
				d.byName[e.Backup] = append(d.byName[e.Backup], e.SHA256)
			}
			after = max(after, r.Seq)
		}
		d.after = after
		snapshot := &Deletions{after: after, byName: maps.Clone(d.byName)}
		c.mu.Unlock()
		if len(recs) < page {
			return snapshot, nil
		}
	}
}
