package ledger_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

// Writers in several processes (here: several Writers on one store,
// as replicas and break-glass are) append without losing or forking an
// entry, and the chain verifies whole, on a filesystem location and on a
// real S3 store (versitygw).
func TestConcurrentWritersKeepOneChain(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var wg sync.WaitGroup
			for w := range 3 {
				writer := ledger.NewWriter(store, nil)
				wg.Go(func() {
					for i := range 10 {
						if _, err := writer.Append(ctx, ledger.Entry{Action: ledger.ActionDownload, Location: "l", Backup: fmt.Sprintf("b-%d-%d", w, i), Who: "user alice"}); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			recs, err := store.ReadLedger(ctx, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			r := ledger.Verify(recs)
			if r.Problem != "" || len(r.Entries) != 30 || r.Head == "" {
				t.Fatalf("%d entries, head %q, problem %q", len(r.Entries), r.Head, r.Problem)
			}
			seen := map[string]bool{}
			for _, e := range r.Entries {
				seen[e.Backup] = true
			}
			if len(seen) != 30 {
				t.Fatalf("%d distinct entries of 30", len(seen))
			}
			if page, err := store.ReadLedger(ctx, 10, 5); err != nil || len(page) != 5 || page[0].Seq != 11 || page[4].Seq != 15 {
				t.Fatalf("a page after 10: %v %v", err, page)
			}
		})
	}
}

// An entry changed or removed in storage breaks the chain exactly there,
// and Verify names it.
func TestVerifyNamesTheEntryChangedOrRemoved(t *testing.T) {
	dir := t.TempDir()
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := ledger.NewWriter(loc, func() time.Time { return time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC) })
	for i := range 6 {
		if _, err := w.Append(ctx, ledger.Entry{Action: ledger.ActionDownload, Location: "default", Backup: fmt.Sprintf("cp-%d", i), Who: "user alice"}); err != nil {
			t.Fatal(err)
		}
	}
	read := func() ledger.Report {
		recs, err := loc.ReadLedger(ctx, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return ledger.Verify(recs)
	}
	if r := read(); r.Problem != "" || len(r.Entries) != 6 {
		t.Fatalf("whole ledger: %+v", r)
	}
	path := func(seq uint64) string { return filepath.Join(dir, "ledger", storage.LedgerName(seq)) }

	// Who downloaded cp-2 is rewritten.
	b, err := os.ReadFile(path(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path(3), bytes.Replace(b, []byte("user alice"), []byte("user bob"), 1), 0o640); err != nil {
		t.Fatal(err)
	}
	if r := read(); r.At != 3 || !strings.Contains(r.Problem, "entry 3 was changed") || len(r.Entries) != 2 {
		t.Fatalf("after editing entry 3: %+v", r)
	}
	if err := os.WriteFile(path(3), b, 0o640); err != nil {
		t.Fatal(err)
	}

	// Entry 5 is removed.
	if err := os.Remove(path(5)); err != nil {
		t.Fatal(err)
	}
	if r := read(); r.At != 5 || !strings.Contains(r.Problem, "entry 5 is missing") {
		t.Fatalf("after removing entry 5: %+v", r)
	}
	// The next append still follows the newest entry.
	if e, err := w.Append(ctx, ledger.Entry{Action: ledger.ActionDelete, Location: "default", Backup: "cp-0", Who: "user alice"}); err != nil || e.Seq != 7 {
		t.Fatalf("append after the removal: %+v %v", e, err)
	}
}

func stores(t *testing.T) map[string]storage.LedgerStore {
	fs, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := s3test.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s3loc, err := s3.New(ctx, srv.LockedConfig("ledger", storage.ObjectLockCompliance, 1))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]storage.LedgerStore{"filesystem": fs, "s3 with object lock": s3loc}
}
