package readpath

import (
	"context"
	"fmt"
	"testing"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

// Listing every page of a location lists it once, not once per page: the
// pages after the first come from the listing kept at the first, and show
// the location as it was then. A token whose listing is no longer kept
// (expired, or the server restarted) lists again and goes on after the
// token's backup.
func TestPagesAfterTheFirstListNothingAgain(t *testing.T) {
	fs, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	loc := &storagetest.ListCounter{Location: fs}
	created := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	const n = 25
	for i := range n {
		backuptest.Put(t, loc, &storage.Manifest{Name: fmt.Sprintf("b-%02d", i), CreateTime: created.Add(time.Duration(i) * time.Minute)}, []byte("x"))
	}
	now := created.Add(time.Hour)
	s := New(Config{Locations: oneLocation(t, loc, nil), Now: func() time.Time { return now }})
	ctx := context.Background()

	listAll := func(pageSize int32, between func(page int)) []string {
		t.Helper()
		var names []string
		req := &ebv1.ListBackupsRequest{PageSize: pageSize}
		for page := 0; ; page++ {
			resp, err := s.ListBackups(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range resp.GetBackups() {
				names = append(names, b.GetName())
			}
			if resp.GetNextPageToken() == "" {
				return names
			}
			if between != nil {
				between(page)
			}
			req.PageToken = resp.GetNextPageToken()
		}
	}

	names := listAll(10, func(page int) {
		if page == 0 {
			// Older than every listed backup: were the location listed
			// again, the last page would hold it.
			backuptest.Put(t, loc, &storage.Manifest{Name: "late", CreateTime: created.Add(-time.Hour)}, []byte("x"))
		}
	})
	if len(names) != n || names[0] != "b-24" || names[n-1] != "b-00" {
		t.Fatalf("listed %d backups %v; want the %d there at the first page, newest first", len(names), names, n)
	}
	if got := loc.Lists.Load(); got != 1 {
		t.Errorf("three pages listed the location %d times; want once", got)
	}
	if len(s.paged.kept) != 0 {
		t.Errorf("%d listings kept after their last page; want none", len(s.paged.kept))
	}

	// A listing that waited longer than listingTTL for its next page is
	// gone: the location is listed again, the next page starts after the
	// token's backup, and the backup stored meanwhile is listed.
	loc.Lists.Store(0)
	names = listAll(10, func(int) { now = now.Add(listingTTL + time.Second) })
	if len(names) != n+1 || names[n] != "late" {
		t.Fatalf("listed %v; want the %d backups and late, last", names, n+1)
	}
	if got := loc.Lists.Load(); got != 3 {
		t.Errorf("three pages, each after the kept listing expired, listed the location %d times; want 3", got)
	}
}

// The listings kept are bounded in number and in backups, and one is
// found only for the location and selector it was made for.
func TestKeptListingsAreBounded(t *testing.T) {
	var p pagedListings
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	some := make([]*ebv1.Backup, 10)
	var ids []string
	for i := range keptListings + 2 {
		ids = append(ids, p.keep("default", "", some, now.Add(time.Duration(i)*time.Second)))
	}
	if len(p.kept) != keptListings {
		t.Errorf("%d listings kept; want at most %d", len(p.kept), keptListings)
	}
	at := now.Add(keptListings * time.Second)
	if p.get(ids[0], "default", "", at) != nil || p.get(ids[1], "default", "", at) != nil {
		t.Error("the two listings kept first are still there; want them dropped for the newer ones")
	}
	if p.get(ids[2], "default", "", at) == nil {
		t.Error("a kept listing was not found")
	}
	if p.get(ids[2], "s3", "", at) != nil || p.get(ids[2], "default", "env=prod", at) != nil {
		t.Error("a listing was found for another location or selector")
	}
	if id := p.keep("default", "", make([]*ebv1.Backup, keptBackups+1), at); id != "" {
		t.Errorf("a listing of %d backups was kept; want none over %d", keptBackups+1, keptBackups)
	}
	// Making room for a large listing drops the older ones.
	big := p.keep("default", "", make([]*ebv1.Backup, keptBackups-5), at)
	if big == "" || len(p.kept) != 1 {
		t.Errorf("kept %d listings with one of %d backups; want it alone", len(p.kept), keptBackups-5)
	}
}
