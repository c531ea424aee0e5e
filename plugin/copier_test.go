package plugin

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

// The server's own copier, end to end: a location (dc1; the test
// server's first location, default, stays empty) copied to a real
// versitygw bucket. What is uploaded reaches the copy location with equal
// hashes; while the copy location's store is stopped, list says the copy
// is retrying, and once it is back the copy catches up; a backup whose
// bytes are gone from the primary, or that was deleted there, is read
// from its copy, and the command says so.
func TestCopiesMadeByTheServer(t *testing.T) {
	store := s3test.Start(t)
	offsite := store.Config("copier").S3Config
	dir := t.TempDir()
	srv := servertest.StartWith(t, servertest.Options{
		Configured: []storage.LocationConfig{
			{Name: "dc1", Filesystem: &storage.FilesystemConfig{Path: dir}, Copies: []storage.CopyConfig{{To: "offsite"}}},
			{Name: "offsite", S3: &offsite},
		},
		LocationOptions: locations.Options{CallTimeout: 3 * time.Second, ListTimeout: 3 * time.Second, OpenTimeout: 3 * time.Second},
		PollInterval:    200 * time.Millisecond,
	})
	addr := "--server-address=" + srv.Addr
	// copyState is what get says of name's copy in offsite.
	copyState := func(name string) string {
		return mustRun(t, addr, "get", name, "--location", "dc1", "-o", "jsonpath={.status.copies[0].state}").out
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("waited a minute for %s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	data1 := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(200_000))
	uploadTo(t, srv, "dc1", "b1", data1)
	waitFor("b1 to be copied", func() bool { return copyState("b1") == "Copied" })
	if got := rowsOf(t, mustRun(t, addr, "list").out, "NAME", "LOCATION", "COPIES"); strings.Join(got, ";") != "b1|dc1|2/2" {
		t.Errorf("list: %v, want b1 in default with its copy", got)
	}
	orig := mustRun(t, addr, "get", "b1", "--location", "dc1", "-o", "jsonpath={.status.sha256}").out
	cp := mustRun(t, addr, "get", "b1", "--location", "offsite", "-o", "jsonpath={.status.sha256} {.status.copyOf.location}").out
	if orig != sha(data1) || cp != sha(data1)+" dc1" {
		t.Errorf("SHA-256 of the upload %s, of the original %q, of the copy %q", sha(data1), orig, cp)
	}

	// The copy location's store stopped: the copy waits and says why.
	store.Kill()
	data2 := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(100_000))
	uploadTo(t, srv, "dc1", "b2", data2)
	waitFor("b2's copy to be retrying", func() bool { return copyState("b2") == "Retrying" })
	if got := rowsOf(t, mustRun(t, addr, "list", "--location", "dc1").out, "NAME", "COPIES"); len(got) != 2 || !strings.HasPrefix(got[0], "b2|1/2 offsite: retrying") {
		t.Errorf("list while the copy location is down: %v", got)
	}
	if err := store.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor("b2 to be copied once the store is back", func() bool { return copyState("b2") == "Copied" })

	// b2's bytes removed from the primary (its manifest left): a
	// download reads the copy.
	if err := os.Remove(filepath.Join(dir, "backups", "b2.db")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "b2.db")
	r := mustRun(t, addr, "download", "b2", "-o", out)
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data2) {
		t.Fatalf("download of b2 with its bytes gone from default: %v (%d bytes, want %d)", err, len(got), len(data2))
	}
	if !strings.Contains(r.errOut, "offsite") {
		t.Errorf("download did not say it read the copy in offsite: %q", r.errOut)
	}
	// b1 deleted from the primary: found in offsite, downloaded from it.
	if r := mustRun(t, addr, "delete", "b1", "--location", "dc1", "--yes"); !strings.Contains(r.errOut, "in offsite are kept") {
		t.Errorf("delete of the original does not say its copy is kept: %q", r.errOut)
	}
	out = filepath.Join(t.TempDir(), "b1.db")
	r = mustRun(t, addr, "download", "b1", "-o", out)
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data1) {
		t.Fatalf("download of b1 deleted from default: %v", err)
	}
	if !strings.Contains(r.errOut, `its copy in location "offsite"`) {
		t.Errorf("download did not say it read the copy: %q", r.errOut)
	}
	// The copy location's ledger records the copies.
	if got := mustRun(t, addr, "audit", "-o", "wide").out; strings.Count(got, "copied from location dc1") != 2 {
		t.Errorf("audit does not show the two copies:\n%s", got)
	}

	// A copy deleted in the copy location is not made again: deleted.
	mustRun(t, addr, "delete", "b2", "--location", "offsite", "--yes")
	waitFor("b2's copy to be reported deleted", func() bool { return copyState("b2") == "Skipped" })
	if got := rowsOf(t, mustRun(t, addr, "list", "--location", "dc1").out, "NAME", "COPIES"); strings.Join(got, ";") != "b2|1/2 offsite: deleted" {
		t.Errorf("list after the copy was deleted: %v", got)
	}
	// Another backup of the same name in the copy location is not
	// overwritten: conflict.
	uploadTo(t, srv, "offsite", "b3", etcdtest.TrailedBytes(t, 544))
	uploadTo(t, srv, "dc1", "b3", etcdtest.TrailedBytes(t, etcdtest.TrailedSize(5000)))
	waitFor("b3's copy to be reported in conflict", func() bool { return copyState("b3") == "Conflict" })
	if msg := mustRun(t, addr, "get", "b3", "--location", "dc1", "-o", "jsonpath={.status.copies[0].message}").out; !strings.Contains(msg, "holds another backup named") {
		t.Errorf("conflict message: %q", msg)
	}
}
