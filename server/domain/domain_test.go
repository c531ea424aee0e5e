package domain_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

func storageErrors(t *testing.T, m *metrics.Metrics, loc, op string) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.StorageErrors.WithLabelValues(loc, op).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetCounter().GetValue()
}

// Every failing call to a location is counted once, where it passes,
// under the store's operation; a backup that is missing or exists, or a
// caller that went away, is not the storage's failure.
func TestLocationsCountStorageFailures(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := filesystem.New(dirA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := filesystem.New(dirB)
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	locs, err := domain.NewLocations([]locations.Named{{Name: "a", Location: a}, {Name: "b", Location: b}}, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	la, _ := locs.Lookup("a")
	backuptest.Put(t, la, &storage.Manifest{Name: "x"}, []byte("data"))

	if _, err := la.Stat(ctx, "missing"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("stat of a missing backup: %v", err)
	}
	if _, err := la.Create(ctx, "x"); !errors.Is(err, storage.ErrAlreadyExists) {
		t.Fatalf("create of a stored name: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := la.List(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("list with its caller gone: %v", err)
	}
	for _, op := range []string{"stat", "create", "list"} {
		if n := storageErrors(t, m, "a", op); n != 0 {
			t.Errorf("%s: %v storage errors counted for the caller's mistakes", op, n)
		}
	}

	// The store fails: its backups directory is gone.
	if err := os.RemoveAll(filepath.Join(dirA, "backups")); err != nil {
		t.Fatal(err)
	}
	if _, err := la.List(ctx); err == nil {
		t.Fatal("list of a location without its directory succeeded")
	}
	if n := storageErrors(t, m, "a", "list"); n != 1 {
		t.Errorf("a failed list counted %v times, want 1", n)
	}
	if n := storageErrors(t, m, "b", "list"); n != 0 {
		t.Errorf("location b counted %v failed lists of a", n)
	}
}

// The default is the first location; a name the server does not have is
// a NotConfiguredError naming those it has.
func TestLocationsResolveNames(t *testing.T) {
	a, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	locs, err := domain.NewLocations([]locations.Named{{Name: "a", Location: a}, {Name: "b", Location: b}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := locs.Get(""); err != nil || l.Name != "a" {
		t.Fatalf("default location: %v, %v", l, err)
	}
	if l, err := locs.Get("b"); err != nil || l.Name != "b" {
		t.Fatalf("location b: %v, %v", l, err)
	}
	_, err = locs.Get("c")
	var nc *domain.NotConfiguredError
	if !errors.As(err, &nc) || nc.Name != "c" || len(nc.Have) != 2 {
		t.Fatalf("location c: %v", err)
	}
	if _, err := domain.NewLocations([]locations.Named{{Name: "a", Location: a}, {Name: "a", Location: b}}, nil); err == nil {
		t.Fatal("two locations of one name were accepted")
	}
}

// A round's listings list each location once until told it changed.
func TestListingsListOnceUntilForgotten(t *testing.T) {
	fs, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	locs, err := domain.NewLocations([]locations.Named{{Name: "a", Location: fs}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := locs.Default()
	ctx := context.Background()
	ls := domain.NewListings()
	if ms, err := ls.List(ctx, l); err != nil || len(ms) != 0 {
		t.Fatalf("first listing: %v, %v", ms, err)
	}
	backuptest.Put(t, l, &storage.Manifest{Name: "x"}, []byte("data"))
	if ms, _ := ls.List(ctx, l); len(ms) != 0 {
		t.Fatalf("the round's listing was read again: %d backups", len(ms))
	}
	ls.Forget("a")
	if ms, _ := ls.List(ctx, l); len(ms) != 1 {
		t.Fatalf("after Forget the listing holds %d backups, want 1", len(ms))
	}
}

// A location check's probes are no backups: no listing through the
// location set shows one, while the store itself (what the check lists)
// holds it; As finds the store under the counting.
func TestListingsLeaveProbesOut(t *testing.T) {
	fs, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	locs, err := domain.NewLocations([]locations.Named{{Name: "a", Location: fs}}, m)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := locs.Lookup("a")
	backuptest.Put(t, l, &storage.Manifest{Name: "backup"}, []byte("data"))
	backuptest.Put(t, l, &storage.Manifest{Name: storage.ProbePrefix + "1"}, []byte("probe"))
	ms, err := l.List(context.Background())
	if err != nil || len(ms) != 1 || ms[0].Name != "backup" {
		t.Fatalf("the location set lists %v (%v), want the backup alone", ms, err)
	}
	if ms, err := l.Location.List(context.Background()); err != nil || len(ms) != 2 {
		t.Fatalf("the store lists %d (%v), want the backup and the probe", len(ms), err)
	}
	if got, ok := storage.As[*filesystem.Location](l.Location); !ok || got != fs {
		t.Fatalf("As through the counted location: %v %v", got, ok)
	}
}

// An entry the store does not take is counted as the location's
// failure, under "ledger"; the entries it takes are not, and chain.
func TestLedgerFailuresAreCounted(t *testing.T) {
	dir := t.TempDir()
	fs, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	locs, err := domain.NewLocations([]locations.Named{{Name: "default", Location: fs}}, m)
	if err != nil {
		t.Fatal(err)
	}
	l := locs.Default()
	ctx := context.Background()
	if err := l.Record(ctx, ledger.Entry{Action: ledger.ActionDownload, Backup: "cp-1", Who: "user alice"}); err != nil {
		t.Fatal(err)
	}
	if got := storageErrors(t, m, "default", "ledger"); got != 0 {
		t.Fatalf("ledger failures after an entry the store took: %v", got)
	}
	// The ledger directory replaced by a file: no entry can be written.
	if err := os.RemoveAll(filepath.Join(dir, "ledger")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ledger"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Record(ctx, ledger.Entry{Action: ledger.ActionDownload, Backup: "cp-1", Who: "user alice"}); err == nil {
		t.Fatal("an entry was recorded where the ledger cannot be written")
	}
	if got := storageErrors(t, m, "default", "ledger"); got != 1 {
		t.Fatalf("ledger failures: %v, want 1", got)
	}
}
