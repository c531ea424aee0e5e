// Package backuptest puts backups straight into a storage location, as an
// agent or an upload would have left them, reads back which are there, and
// holds the small checks the server's tests of them share (times, lists of
// names). It links none of the server's request layer or wiring, so that
// in-package tests of what the server is made of (server/controller's)
// can use it too; servertest builds on it.
package backuptest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Put stores data in loc as backup m.Name, committed with m; a zero
// m.Size and an empty m.SHA256 are filled in from data first.
func Put(t testing.TB, loc storage.Location, m *storage.Manifest, data []byte) {
	t.Helper()
	if m.Size == 0 {
		m.Size = int64(len(data))
	}
	if m.SHA256 == "" {
		sum := sha256.Sum256(data)
		m.SHA256 = hex.EncodeToString(sum[:])
	}
	ctx := context.Background()
	up, err := loc.Create(ctx, m.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := up.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := up.Commit(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// Store puts a backup in loc as an agent of target would, created at
// created; a scheduled one carries the labels retention goes by.
func Store(t testing.TB, loc storage.Location, target, name string, scheduled bool, created time.Time) {
	t.Helper()
	m := &storage.Manifest{Name: name, SHA256: strings.Repeat("0", 64), CreateTime: created,
		Source: storage.Source{Kind: ebv1.SourceAgent, Target: target}}
	if scheduled {
		// As the server stores a scheduled agent's backup: the source
		// says so, the labels repeat it.
		m.Source.Scheduled = true
		m.Source.ScheduledTime, _ = schedule.TimeOf(target, name)
		m.Labels = map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: target}
	}
	Put(t, loc, m, []byte("data of "+name))
}

// Names lists the names of the backups in loc, sorted.
func Names(t testing.TB, loc storage.Location) []string {
	t.Helper()
	ms, err := loc.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// MustTime parses s, in RFC 3339.
func MustTime(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Equal stops the test unless got and want hold the same names in the
// same order; what says which list it is.
func Equal(t testing.TB, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %q, want %q", what, got, want)
	}
}
