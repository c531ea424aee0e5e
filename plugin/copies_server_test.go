package plugin

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

// The plugin against a real server whose locations hold copies. The
// copies are made here as the server's copier stores them (the same
// bytes, the original's manifest with Copy set), with no copies
// configured, so that no copier runs beside the test.

// copyByHand stores in dst the copy of backup name of src (location
// from) that the copier makes, copied at.
func copyByHand(t *testing.T, src, dst storage.Location, from, name string, at time.Time) {
	t.Helper()
	r, m, err := src.Open(context.Background(), name, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := m.Clone()
	c.LockedUntil = time.Time{} // the destination's own lock, if any
	c.Copy = &storage.CopyOf{From: from, Time: at}
	backuptest.Put(t, dst, c, data)
}

// fsLocation opens the filesystem location name of srv beside the
// server, as another replica would.
func fsLocation(t *testing.T, srv *servertest.Server, name string) storage.Location {
	t.Helper()
	l, err := filesystem.NewShared(srv.Dirs[name])
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// copiesServer serves filesystem locations default, offsite and tape.
func copiesServer(t *testing.T) (string, *servertest.Server) {
	t.Helper()
	srv := servertest.StartWith(t, servertest.Options{Locations: []string{"default", "offsite", "tape"}})
	return "--server-address=" + srv.Addr, srv
}

// uploadTo uploads data as backup name to location.
func uploadTo(t *testing.T, srv *servertest.Server, location, name string, data []byte) {
	t.Helper()
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: name, Location: location}, nil); err != nil {
		t.Fatal(err)
	}
}

func rowsOf(t *testing.T, out string, cols ...string) []string {
	t.Helper()
	_, rows := parseTable(t, out)
	var got []string
	for _, r := range rows {
		var cells []string
		for _, c := range cols {
			cells = append(cells, r[c])
		}
		got = append(got, strings.Join(cells, "|"))
	}
	return got
}

// list folds a copy into its original's row, lists it on its own with
// --location or once its original is gone; findBackup uses the original,
// and the copy when the original is deleted, saying so; download of the
// copy gives the original's bytes; describe and get show both sides.
func TestCopiesListFindDescribe(t *testing.T) {
	addr, srv := copiesServer(t)
	def, offsite := fsLocation(t, srv, "default"), fsLocation(t, srv, "offsite")
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(3000))
	uploadTo(t, srv, "default", "x", data)
	copied := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	copyByHand(t, def, offsite, "default", "x", copied)
	uploadTo(t, srv, "default", "plain", etcdtest.TrailedBytes(t, 544))

	// Every location: one row for x, whose COPIES counts the copy.
	r := mustRun(t, addr, "list")
	header, _ := parseTable(t, r.out)
	if want := []string{"NAME", "LOCATION", "PHASE", "SIZE", "AGE", "VERIFIED", "COPIES"}; !reflect.DeepEqual(header, want) {
		t.Fatalf("list header %v, want %v", header, want)
	}
	if got, want := rowsOf(t, r.out, "NAME", "LOCATION", "COPIES"), []string{"plain|default|<none>", "x|default|2/2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("list rows %v, want %v", got, want)
	}
	if r := mustRun(t, addr, "list", "-o", "wide"); !strings.Contains(r.out, " COPIES ") {
		t.Errorf("list -o wide has no COPIES:\n%s", r.out)
	}
	if got := mustRun(t, addr, "list", "-o", "name").out; got != "backup/plain\nbackup/x\n" {
		t.Errorf("list -o name = %q, want each name once", got)
	}
	// The documents hold the copy too, saying what it is.
	if got := mustRun(t, addr, "list", "-o", "jsonpath={range .items[*]}{.metadata.name}@{.spec.location}:{.status.copyOf.location} {end}").out; got != "plain@default: x@offsite:default x@default: " &&
		got != "plain@default: x@default: x@offsite:default " {
		t.Errorf("list -o jsonpath = %q", got)
	}
	// --location offsite: the copy is a row of its own.
	if got, want := rowsOf(t, mustRun(t, addr, "list", "--location", "offsite").out, "NAME", "LOCATION", "COPIES"), []string{"x|offsite|copy of default"}; !reflect.DeepEqual(got, want) {
		t.Errorf("list --location offsite: %v, want %v", got, want)
	}
	if got := mustRun(t, addr, "list", "--location", "offsite", "-o", "name").out; got != "backup/x\n" {
		t.Errorf("list --location offsite -o name = %q", got)
	}

	// The name is not ambiguous: the original is used, silently.
	r = mustRun(t, addr, "get", "x", "-o", "jsonpath={.spec.location}")
	if r.out != "default" || r.errOut != "" {
		t.Errorf("get x: %q, stderr %q; want default's, no note", r.out, r.errOut)
	}
	r = mustRun(t, addr, "describe", "x")
	if !strings.Contains(r.out, "Location:") || !strings.Contains(r.out, "default\n") || strings.Contains(r.out, "Copy Of:") {
		t.Errorf("describe x:\n%s", r.out)
	}
	r = mustRun(t, addr, "describe", "x", "--location", "offsite")
	if !strings.Contains(r.out, "Copy Of:") || !strings.Contains(r.out, "default (copied 2026-12-06T07:00:00Z, ") {
		t.Errorf("describe x --location offsite does not say what it is a copy of:\n%s", r.out)
	}
	r = mustRun(t, addr, "get", "x", "--location", "offsite", "-o", "jsonpath={.status.copyOf.location} {.status.copyOf.copyTime} {.status.sha256}")
	if want := "default 2026-12-06T07:00:00Z " + sha(data); r.out != want {
		t.Errorf("get x --location offsite: %q, want %q", r.out, want)
	}

	// Deleting x deletes the original only; the copy stays, and then
	// is what the name means: each command says it uses the copy.
	r = mustRun(t, addr, "delete", "x")
	if r.out != "backup \"x\" deleted\n" || !strings.Contains(r.errOut, `Note: the copies of backup "x" in offsite are kept; delete --all-copies removes them too`) {
		t.Fatalf("delete x: stdout %q, stderr %q", r.out, r.errOut)
	}
	if got, want := rowsOf(t, mustRun(t, addr, "list").out, "NAME", "LOCATION", "COPIES"), []string{"plain|default|<none>", "x|offsite|copy of default"}; !reflect.DeepEqual(got, want) {
		t.Errorf("list after deleting the original: %v, want %v", got, want)
	}
	out := filepath.Join(t.TempDir(), "x.db")
	r = mustRun(t, addr, "download", "x", "-o", out)
	note := `Note: backup "x" is not in storage location "default", which it was copied from (not found there); using its copy in location "offsite" (copied 2026-12-06T07:00:00Z)`
	if !strings.Contains(r.errOut, note) {
		t.Errorf("download of the copy: stderr %q, want the note %q", r.errOut, note)
	}
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download of the copy: %d bytes (sha256 %s), %v; want the original's %d (%s)", len(got), sha(got), err, len(data), sha(data))
	}
	if r := mustRun(t, addr, "get", "x", "-o", "name"); r.out != "backup/x\n" || !strings.Contains(r.errOut, note) {
		t.Errorf("get x: %q, stderr %q", r.out, r.errOut)
	}
	if r := mustRun(t, addr, "describe", "x"); !strings.Contains(r.out, "Copy Of:") || !strings.Contains(r.errOut, note) {
		t.Errorf("describe x:\n%s\nstderr %q", r.out, r.errOut)
	}
}

// Copies with other bytes than the original's are another backup: the
// name stays ambiguous, and list shows both.
func TestCopiesOtherBytesStayAmbiguous(t *testing.T) {
	addr, srv := copiesServer(t)
	uploadTo(t, srv, "default", "y", etcdtest.TrailedBytes(t, 544))
	other := etcdtest.TrailedBytes(t, 1056)
	backuptest.Put(t, fsLocation(t, srv, "offsite"), &storage.Manifest{Name: "y", CreateTime: time.Now(), Source: storage.Source{Kind: ebv1.SourceUpload},
		Copy: &storage.CopyOf{From: "default", Time: time.Now()}}, other)
	r := mustFail(t, `backup "y" is in 2 storage locations (default, offsite); say which with --location`, addr, "get", "y")
	if ExitCode(r.err) != ExitUsage {
		t.Errorf("exit code %d, want %d", ExitCode(r.err), ExitUsage)
	}
	if got := mustRun(t, addr, "list", "-o", "name").out; got != "backup/y\nbackup/y\n" {
		t.Errorf("list -o name = %q, want both", got)
	}
}

// delete --all-copies deletes the backup in every location that holds
// it (a copy of a copy too), the copies first, and nothing else of that
// name; --location starts from that location's.
func TestDeleteAllCopies(t *testing.T) {
	addr, srv := copiesServer(t)
	def, offsite, tape := fsLocation(t, srv, "default"), fsLocation(t, srv, "offsite"), fsLocation(t, srv, "tape")
	now := time.Now()
	uploadTo(t, srv, "default", "z", etcdtest.TrailedBytes(t, 544))
	copyByHand(t, def, offsite, "default", "z", now)
	copyByHand(t, offsite, tape, "offsite", "z", now)
	uploadTo(t, srv, "default", "w", etcdtest.TrailedBytes(t, 1056))
	copyByHand(t, def, offsite, "default", "w", now)
	// A backup of the same name with other bytes is not a copy of w.
	uploadTo(t, srv, "tape", "w", etcdtest.TrailedBytes(t, 1568))

	mustFail(t, "--all-copies goes with backup names", addr, "delete", "-l", "a=b", "--all-copies", "--yes")

	// On a terminal, it asks first, naming each location.
	r := runIn(t, "n\n", true, addr, "delete", "z", "--all-copies")
	if r.err != nil || r.out != "" || !strings.Contains(r.errOut, "about to delete 3 backup(s):\n  z (location offsite)\n  z (location tape)\n  z (location default)\n") ||
		!strings.HasSuffix(r.errOut, "nothing deleted\n") {
		t.Fatalf("delete z --all-copies, answered n: %v, stdout %q, stderr %q", r.err, r.out, r.errOut)
	}
	r = mustRun(t, addr, "delete", "z", "--all-copies")
	want := "backup \"z\" deleted from location \"offsite\"\nbackup \"z\" deleted from location \"tape\"\nbackup \"z\" deleted from location \"default\"\n"
	if r.out != want || strings.Contains(r.errOut, "kept") {
		t.Fatalf("delete z --all-copies: stdout %q, want %q; stderr %q", r.out, want, r.errOut)
	}
	r = mustRun(t, addr, "delete", "w", "--all-copies", "--location", "offsite")
	if want := "backup \"w\" deleted from location \"offsite\"\nbackup \"w\" deleted from location \"default\"\n"; r.out != want {
		t.Fatalf("delete w --all-copies --location offsite: stdout %q, want %q; stderr %q", r.out, want, r.errOut)
	}
	if got, want := rowsOf(t, mustRun(t, addr, "list").out, "NAME", "LOCATION"), []string{"w|tape"}; !reflect.DeepEqual(got, want) {
		t.Errorf("left after delete --all-copies: %v, want %v", got, want)
	}
}

// A copy the store's object lock keeps is reported as a locked original
// is, the others are deleted all the same, and the exit says it failed.
func TestDeleteAllCopiesLockedCopy(t *testing.T) {
	store := s3test.Start(t)
	vaultCfg := store.LockedConfig("servertest", storage.ObjectLockCompliance, 1)
	srv := servertest.StartWith(t, servertest.Options{Locations: []string{"default", "offsite"},
		Configured: []storage.LocationConfig{{Name: "vault", S3: &vaultCfg.S3Config}}})
	addr := "--server-address=" + srv.Addr
	vaultCfg.SkipCleanup = true // the server's location: its uploads are its own
	vault, err := s3.New(context.Background(), vaultCfg)
	if err != nil {
		t.Fatal(err)
	}
	def := fsLocation(t, srv, "default")
	uploadTo(t, srv, "default", "v", etcdtest.TrailedBytes(t, 544))
	copyByHand(t, def, vault, "default", "v", time.Now())
	copyByHand(t, def, fsLocation(t, srv, "offsite"), "default", "v", time.Now())

	if got := rowsOf(t, mustRun(t, addr, "list", "--location", "vault", "-o", "wide").out, "NAME", "COPIES", "LOCKED-UNTIL"); len(got) != 1 || !strings.HasPrefix(got[0], "v|copy of default|20") {
		t.Fatalf("list --location vault: %v", got)
	}
	r := run(t, addr, "delete", "v", "--all-copies")
	if r.err == nil || !IsAlreadyReported(r.err) || ExitCode(r.err) == ExitOK {
		t.Fatalf("delete v --all-copies with a locked copy: %v", r.err)
	}
	if want := "backup \"v\" deleted from location \"offsite\"\nbackup \"v\" deleted from location \"default\"\n"; r.out != want {
		t.Errorf("stdout %q, want %q", r.out, want)
	}
	if !strings.Contains(r.errOut, `error: delete backup "v": delete "v" in location "vault": `) || !strings.Contains(r.errOut, "is locked until") || strings.Count(r.errOut, "error:") != 1 {
		t.Errorf("stderr %q, want the lock named once", r.errOut)
	}
	if got := rowsOf(t, mustRun(t, addr, "list").out, "NAME", "LOCATION", "COPIES"); !reflect.DeepEqual(got, []string{"v|vault|copy of default"}) {
		t.Errorf("left: %v", got)
	}
}

// When the original's location cannot be read (its store stops
// answering), a name is read from the copy, with the warning that
// location could not be searched naming the copy used.
func TestCopyReadWhenOriginalUnavailable(t *testing.T) {
	store := s3test.Start(t)
	cfg := store.Config("plugin")
	bounds := locations.Options{CallTimeout: time.Second, ListTimeout: 2 * time.Second}
	srv := servertest.StartWith(t, servertest.Options{Locations: []string{"offsite"},
		Configured: []storage.LocationConfig{{Name: "primary", S3: &cfg.S3Config}}, LocationOptions: bounds})
	addr := "--server-address=" + srv.Addr
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(2000))
	uploadTo(t, srv, "primary", "x", data)
	cfg.SkipCleanup = true
	primary, err := s3.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	copied := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	copyByHand(t, primary, fsLocation(t, srv, "offsite"), "primary", "x", copied)
	if r := mustRun(t, addr, "get", "x", "-o", "jsonpath={.spec.location}"); r.out != "primary" || r.errOut != "" {
		t.Fatalf("get x with both answering: %q, stderr %q", r.out, r.errOut)
	}

	if err := store.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Signal(syscall.SIGCONT) })
	warning := regexp.MustCompile(`^Warning: storage location "primary" could not be searched for backup "x" \(unavailable: .*\); ` +
		`using its copy in location "offsite" \(copied 2026-12-06T07:00:00Z\)\n$`)
	r := mustRun(t, addr, "get", "x", "-o", "jsonpath={.spec.location} {.status.copyOf.location}")
	if r.out != "offsite primary" || !warning.MatchString(r.errOut) {
		t.Errorf("get x with primary stopped: %q, stderr %q", r.out, r.errOut)
	}
	out := filepath.Join(t.TempDir(), "x.db")
	r = mustRun(t, addr, "download", "x", "-o", out)
	if !strings.HasPrefix(r.errOut, "Warning: ") || !warning.MatchString(strings.SplitAfterN(r.errOut, "\n", 2)[0]) {
		t.Errorf("download x with primary stopped: stderr %q", r.errOut)
	}
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download of the copy: %d bytes, %v; want the original's %d", len(got), err, len(data))
	}
}
