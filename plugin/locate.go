package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Backups live in one of the server's storage locations. Commands span
// every location unless --location names one: list merges them, and a
// command given a backup's name finds the location that holds it, asking
// for --location only when the name is in more than one. A location the
// server cannot reach (its store down) costs only itself: both go on
// without it, saying so on stderr.

// locationNames returns --location, or every location of the server,
// default first.
func (g *GlobalOptions) locationNames(ctx context.Context, conn *Connection) ([]string, error) {
	if g.Location != "" {
		return []string{g.Location}, nil
	}
	return serverLocations(ctx, conn)
}

// serverLocations returns every location of the server, default first.
func serverLocations(ctx context.Context, conn *Connection) ([]string, error) {
	info, err := conn.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
	if err != nil {
		return nil, conn.explain("list storage locations", err)
	}
	trace("server info got")
	var names []string
	for _, l := range info.GetLocations() {
		names = append(names, l.GetName())
	}
	return names, nil
}

// listBackups lists the backups matching selector in --location, or in
// every location, newest first. Without --location, a location the
// server cannot reach (its store down) costs only itself: it comes back
// in unavailable, for the caller to warn about, and the others' backups
// are listed. Any other failure of a location does not hide the others
// either: their backups come back with an error naming the location
// that failed.
//
// Without --location, the default location ("" on the wire) is listed
// while the server is asked for its locations, and the others, if any,
// are listed side by side: a server with one location answers in one
// round trip, not two.
func (g *GlobalOptions) listBackups(ctx context.Context, conn *Connection, selector string) ([]*ebv1.Backup, []unavailableLocation, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var locs []string
	lists := map[string]<-chan listed{}
	if g.Location != "" {
		locs = []string{g.Location}
	} else {
		dflt := listAside(ctx, conn, "", selector)
		info, err := conn.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
		if err != nil {
			return nil, nil, conn.explain("list storage locations", err)
		}
		trace("server info got")
		for _, l := range info.GetLocations() {
			locs = append(locs, l.GetName())
			// The server's default is what "" listed; a server that
			// flags none has its listing ignored.
			if l.GetDefault() && lists[l.GetName()] == nil {
				lists[l.GetName()] = dflt
			}
		}
	}
	for _, l := range locs {
		if lists[l] == nil {
			lists[l] = listAside(ctx, conn, l, selector)
		}
	}
	var all []*ebv1.Backup
	var unavailable []unavailableLocation
	var errs []error
	for _, l := range locs {
		r := <-lists[l]
		if u, ok := asUnavailable(r.err); ok && g.Location == "" {
			unavailable = append(unavailable, u)
			continue
		}
		if r.err != nil {
			op := "list backups"
			if g.Location == "" {
				op += " in location " + quote(l)
			}
			errs = append(errs, conn.explain(op, r.err))
			continue
		}
		all = append(all, r.backups...)
	}
	ebv1.SortBackups(all) // as the server lists them; locations merged
	if len(errs) > 0 {
		// The exit code is the first failure's, default location first.
		return all, unavailable, withCode(ExitCode(errs[0]), errors.Join(errs...))
	}
	if len(locs) > 0 && len(unavailable) == len(locs) {
		// Not an empty list: nothing could be looked at.
		var why []string
		for _, u := range unavailable {
			why = append(why, "location "+quote(u.name)+" is unavailable: "+u.reason)
		}
		return nil, nil, fmt.Errorf("list backups: no storage location can be read: %s", strings.Join(why, "; "))
	}
	return all, unavailable, nil
}

// unavailableLocation is a storage location the server answered for
// but could not reach (its store down): why, as the server put it.
type unavailableLocation struct {
	name   string
	reason string
}

// asUnavailable returns the location err says the server cannot reach
// now, if err is the server's LOCATION_UNAVAILABLE (not a lost
// connection to the server, which is also Unavailable).
func asUnavailable(err error) (unavailableLocation, bool) {
	s, ok := status.FromError(err)
	if err == nil || !ok || s.Code() != codes.Unavailable {
		return unavailableLocation{}, false
	}
	name, ok := ebv1.UnavailableLocation(s)
	if !ok {
		return unavailableLocation{}, false
	}
	// The server says `[op: ]storage location "X" is unavailable: WHY`;
	// the warnings name the location themselves.
	reason := s.Message()
	if _, why, ok := strings.Cut(reason, "storage location "+quote(name)+" is unavailable: "); ok {
		reason = why
	}
	return unavailableLocation{name: name, reason: reason}, true
}

// warnUnavailable prints one warning per location the server could not
// reach, saying what the command did without it.
func (g *GlobalOptions) warnUnavailable(us []unavailableLocation, consequence string) {
	for _, u := range us {
		fmt.Fprintf(g.ErrOut, "Warning: storage location %s is unavailable: %s; %s\n", quote(u.name), u.reason, consequence)
	}
}

// listed is one location's listing.
type listed struct {
	backups []*ebv1.Backup
	err     error
}

// listAside lists location on a goroutine of its own; the channel
// delivers the result once. Cancelling ctx ends a listing no one waits
// for any more.
func listAside(ctx context.Context, conn *Connection, location, selector string) <-chan listed {
	c := make(chan listed, 1)
	go func() {
		bs, err := listLocation(ctx, conn, location, selector)
		c <- listed{bs, err}
	}()
	return c
}

// listMaxRecvBytes is what one page of ListBackups may be: the server
// bounds a page to 2 MiB, but a newer one may send more.
const listMaxRecvBytes = 16 << 20

// listLocation lists the backups of one location, every page of them.
// A location whose listing changes between pages still lists each
// backup at most once: a page starts after the last one listed.
func listLocation(ctx context.Context, conn *Connection, location, selector string, chain ...string) ([]*ebv1.Backup, error) {
	var all []*ebv1.Backup
	// The largest page the server sends: fewer round trips through the
	// port-forward.
	req := &ebv1.ListBackupsRequest{Location: location, LabelSelector: selector, PageSize: 1000}
	if len(chain) > 0 {
		// The segments of one delta chain instead of backups.
		req.Chain = chain[0]
	}
	for {
		resp, err := conn.Backups.ListBackups(ctx, req, grpc.MaxCallRecvMsgSize(listMaxRecvBytes))
		if err != nil {
			return nil, err
		}
		all = append(all, resp.GetBackups()...)
		if resp.GetNextPageToken() == "" {
			return all, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// findBackup returns the backup called name from --location or from the
// one location that holds it. op prefixes errors ("get backup \"x\"").
//
// A location the server cannot reach now (its store down) does not stop
// finding the backup in the others: the command goes on with a warning
// that it could not be searched. Only when the name is in none of the
// others is that an error, naming what could not be searched.
//
// A name held by a backup and its copies (the server's copies of a
// location: the same SHA-256, each copy's copyOf naming where it came
// from) is not ambiguous: it is the original, or, when the original is
// not found or its location cannot be read, its first copy in location
// order, with a note on stderr saying which copy is used.
func (g *GlobalOptions) findBackup(ctx context.Context, conn *Connection, op, name string) (*ebv1.Backup, error) {
	f, err := g.findBackups(ctx, conn, op, name)
	if err != nil {
		return nil, err
	}
	return f.backup, nil
}

// found is what findBackups found of a name.
type found struct {
	// backup is the one a command acts on.
	backup *ebv1.Backup
	// all are the backups of that name found, in location order:
	// backup and, when it has copies, its copies (or, when it is a
	// copy, the other copies). Only backup when one location was
	// searched (--location, or a server with one).
	all []*ebv1.Backup
}

// findBackups is findBackup, saying what else it found.
func (g *GlobalOptions) findBackups(ctx context.Context, conn *Connection, op, name string) (*found, error) {
	locs, err := g.locationNames(ctx, conn)
	if err != nil {
		return nil, err
	}
	if len(locs) <= 1 {
		// One place to look: the server's own message says what to do.
		resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name, Location: g.Location})
		if err != nil {
			return nil, conn.explain(op, err)
		}
		return &found{backup: resp.GetBackup(), all: []*ebv1.Backup{resp.GetBackup()}}, nil
	}
	all, searched, unavailable, err := searchBackup(ctx, conn, op, name, locs)
	if err != nil {
		return nil, err
	}
	b, err := pickBackup(op, name, locs, all, searched, unavailable)
	if err != nil {
		return nil, err
	}
	from := b.GetCopyOf().GetLocation() // "" unless b is a copy: its original is not found
	for _, u := range unavailable {
		if u.name == from {
			fmt.Fprintf(g.ErrOut, "Warning: storage location %s could not be searched for backup %q (unavailable: %s); using its copy in location %s%s\n",
				quote(u.name), name, u.reason, quote(b.GetLocation()), copiedWhen(b))
			continue
		}
		fmt.Fprintf(g.ErrOut, "Warning: storage location %s could not be searched for backup %q (unavailable: %s); using the one in location %s\n",
			quote(u.name), name, u.reason, quote(b.GetLocation()))
	}
	switch {
	case from == "" || slices.ContainsFunc(unavailable, func(u unavailableLocation) bool { return u.name == from }):
	case slices.Contains(searched, from):
		fmt.Fprintf(g.ErrOut, "Note: backup %q is not in storage location %s, which it was copied from (not found there); using its copy in location %s%s\n",
			name, quote(from), quote(b.GetLocation()), copiedWhen(b))
	default:
		fmt.Fprintf(g.ErrOut, "Note: backup %q was copied from storage location %s, which the server does not have; using its copy in location %s%s\n",
			name, quote(from), quote(b.GetLocation()), copiedWhen(b))
	}
	return &found{backup: b, all: all}, nil
}

// searchBackup asks each of locs for the backup called name: those
// found, in locs' order, the locations that answered (found or not),
// and those the server cannot reach now. Any other failure is the
// error.
func searchBackup(ctx context.Context, conn *Connection, op, name string, locs []string) (all []*ebv1.Backup, searched []string, unavailable []unavailableLocation, err error) {
	for _, l := range locs {
		resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name, Location: l})
		if u, ok := asUnavailable(err); ok {
			unavailable = append(unavailable, u)
			continue
		}
		if status.Code(err) == codes.NotFound {
			searched = append(searched, l)
			continue
		}
		if err != nil {
			return nil, nil, nil, conn.explain(op, err)
		}
		searched = append(searched, l)
		all = append(all, resp.GetBackup())
	}
	return all, searched, unavailable, nil
}

// pickBackup chooses among the backups of one name found in several
// locations: the one found, or the original of a backup and its copies
// (originalOf). Found in none, or several that are not one backup and
// its copies, is an error.
func pickBackup(op, name string, locs []string, all []*ebv1.Backup, searched []string, unavailable []unavailableLocation) (*ebv1.Backup, error) {
	if len(all) == 0 {
		if len(unavailable) > 0 {
			return nil, notSearched(op, name, searched, unavailable)
		}
		return nil, withCode(ExitNotFound, fmt.Errorf("%s: backup %q not found in any storage location (%s); see `kubectl etcdbackup list`", op, name, strings.Join(locs, ", ")))
	}
	if b, ok := originalOf(all); ok {
		return b, nil
	}
	var in []string
	for _, b := range all {
		in = append(in, b.GetLocation())
	}
	return nil, usageError(fmt.Errorf("%s: backup %q is in %d storage locations (%s); say which with --location", op, name, len(all), strings.Join(in, ", ")))
}

// originalOf returns the backup of bs (one name, in location order) to
// act on when they are one backup and its copies: all the same SHA-256,
// at most one of them not a copy (the original), and each copy's copyOf
// naming the location of another of them (a copy of a copy names its
// copy) — or, when none is the original, all naming one location
// besides theirs, the original's, where it is not found. That is the
// original, or else the first copy made from it. A single backup is
// itself.
func originalOf(bs []*ebv1.Backup) (*ebv1.Backup, bool) {
	if len(bs) == 1 {
		return bs[0], true
	}
	sum := bs[0].GetSha256()
	in := map[string]bool{}
	for _, b := range bs {
		if sum == "" || b.GetSha256() != sum {
			return nil, false
		}
		in[b.GetLocation()] = true
	}
	var original *ebv1.Backup
	elsewhere := map[string]bool{}
	for _, b := range bs {
		c := b.GetCopyOf()
		switch {
		case c == nil && original != nil:
			return nil, false
		case c == nil:
			original = b
		case c.GetLocation() == b.GetLocation():
			return nil, false
		case !in[c.GetLocation()]:
			elsewhere[c.GetLocation()] = true
		}
	}
	switch {
	case original != nil && len(elsewhere) == 0:
		return original, true
	case original == nil && len(elsewhere) == 1:
		// The first copy made from the original, not a copy of a copy.
		for _, b := range bs {
			if elsewhere[b.GetCopyOf().GetLocation()] {
				return b, true
			}
		}
	}
	return nil, false
}

// copiedWhen is " (copied TIME)" for a copy that records when it was
// made.
func copiedWhen(b *ebv1.Backup) string {
	if t := b.GetCopyOf().GetCopyTime(); knownTime(t) {
		return " (copied " + t.AsTime().UTC().Format(time.RFC3339) + ")"
	}
	return ""
}

// notSearched is the error of a name found in none of the locations that
// could be searched, while others could not: it may be in those, so it
// is not "not found" (exit code 3), which a script takes for certain.
func notSearched(op, name string, searched []string, unavailable []unavailableLocation) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: backup %q ", op, name)
	if len(searched) > 0 {
		in := "location"
		if len(searched) > 1 {
			in = "locations"
		}
		fmt.Fprintf(&b, "is not in storage %s %s, but ", in, strings.Join(searched, ", "))
	} else {
		b.WriteString("could not be looked for: ")
	}
	for i, u := range unavailable {
		if i > 0 {
			b.WriteString(", and ")
		}
		fmt.Fprintf(&b, "location %s could not be searched (unavailable: %s)", quote(u.name), u.reason)
	}
	it := "it is"
	if len(unavailable) > 1 {
		it = "they are"
	}
	fmt.Fprintf(&b, "; retry once %s available again (`kubectl etcdbackup version` shows each location's state)", it)
	return withCode(ExitError, errors.New(b.String()))
}

// resolveLocation returns the location to send a request about name to:
// --location, "" (the server's default) when the server has one location
// — so the server's own message answers for a name it lacks — or the one
// location that holds name.
func (g *GlobalOptions) resolveLocation(ctx context.Context, conn *Connection, op, name string) (string, error) {
	if g.Location != "" {
		return g.Location, nil
	}
	locs, err := g.locationNames(ctx, conn)
	if err != nil {
		return "", err
	}
	if len(locs) <= 1 {
		return "", nil
	}
	b, err := g.findBackup(ctx, conn, op, name)
	if err != nil {
		return "", err
	}
	return b.GetLocation(), nil
}
