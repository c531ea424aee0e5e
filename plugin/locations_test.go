package plugin

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// startTwo runs a server with locations "default" and "s3" and stores
// only-default, only-s3 and "both" (in each).
func startTwo(t *testing.T) string {
	t.Helper()
	addr, _ := startTwoServer(t)
	return addr
}

func startTwoServer(t *testing.T) (string, *servertest.Server) {
	t.Helper()
	srv := servertest.StartWith(t, servertest.Options{Locations: []string{"default", "s3"}})
	addr := "--server-address=" + srv.Addr
	file, _, _ := writeSnapshot(t, "x.db", smallSnapshot)
	mustRun(t, addr, "upload", file, "--name", "only-default", "--labels", "env=test")
	mustRun(t, addr, "upload", file, "--name", "only-s3", "--location", "s3", "--labels", "env=test")
	mustRun(t, addr, "upload", file, "--name", "both")
	mustRun(t, addr, "upload", file, "--name", "both", "--location", "s3")
	return addr, srv
}

// A location that fails does not hide the others' backups; the failure
// is still reported, and is the exit status.
func TestListShowsWhatItCanWhenALocationFails(t *testing.T) {
	addr, srv := startTwoServer(t)
	backups := filepath.Join(srv.Dirs["s3"], "backups")
	if err := os.RemoveAll(backups); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(backups, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, addr, "list", "-o", "name")
	if r.out != "backup/both\nbackup/only-default\n" {
		t.Errorf("list with s3 broken printed %q, want default's backups", r.out)
	}
	if r.err == nil || !strings.Contains(r.err.Error(), `list backups in location "s3"`) || ExitCode(r.err) == ExitOK {
		t.Errorf("list with s3 broken: %v", r.err)
	}
}

func TestListSpansEveryLocation(t *testing.T) {
	addr := startTwo(t)
	header, rows := parseTable(t, mustRun(t, addr, "list").out)
	if want := []string{"NAME", "LOCATION", "PHASE", "SIZE", "AGE", "VERIFIED"}; !reflect.DeepEqual(header, want) {
		t.Fatalf("list header %v, want %v", header, want)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r["NAME"]+"@"+r["LOCATION"])
	}
	// Newest first: the uploads' order reversed.
	if want := []string{"both@s3", "both@default", "only-s3@s3", "only-default@default"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("list rows %v, want %v", got, want)
	}
	r := mustRun(t, addr, "list", "--location", "s3", "-o", "name")
	if r.out != "backup/both\nbackup/only-s3\n" {
		t.Fatalf("list --location s3 -o name = %q", r.out)
	}
	r = mustRun(t, addr, "list", "-l", "env=test", "-o", "jsonpath={range .items[*]}{.metadata.name}@{.spec.location} {end}")
	if r.out != "only-s3@s3 only-default@default " {
		t.Fatalf("list -l env=test -o jsonpath = %q", r.out)
	}
}

func TestNameFoundInWhicheverLocation(t *testing.T) {
	addr := startTwo(t)
	// get, describe, download, verify and delete find the location.
	r := mustRun(t, addr, "get", "only-s3", "-o", "jsonpath={.spec.location}")
	if r.out != "s3" {
		t.Fatalf("get only-s3: location %q, want s3", r.out)
	}
	if r := mustRun(t, addr, "describe", "only-s3"); !strings.Contains(r.out, "Location:") || !strings.Contains(r.out, "s3\n") {
		t.Fatalf("describe only-s3:\n%s", r.out)
	}
	out := t.TempDir() + "/only-s3.db"
	if r := mustRun(t, addr, "download", "backup/only-s3", "-o", out); !strings.Contains(r.errOut, "downloaded to "+out) {
		t.Fatalf("download backup/only-s3: %s", r.errOut)
	}
	// verify reaches the server in the right location: the server's
	// check (not a not-found) passes the snapshot.
	r = run(t, addr, "verify", "only-s3")
	if r.err != nil || !strings.Contains(r.out, `backup "only-s3" is intact`) {
		t.Fatalf("verify only-s3: %v, stdout %q; want the server's verdict on the data", r.err, r.out)
	}

	// A name in both locations needs --location, and the error says where.
	r = mustFail(t, `backup "both" is in 2 storage locations (default, s3); say which with --location`, addr, "get", "both")
	if code := ExitCode(r.err); code != ExitUsage {
		t.Errorf("ambiguous name: exit code %d, want %d", code, ExitUsage)
	}
	mustFail(t, "say which with --location", addr, "download", "both", "-o", t.TempDir()+"/x", "--raw")
	if r := mustRun(t, addr, "get", "both", "--location", "s3", "-o", "name"); r.out != "backup/both\n" {
		t.Fatalf("get both --location s3 -o name = %q", r.out)
	}

	// A name in none: not found, naming where it looked.
	r = mustFail(t, `backup "nope" not found in any storage location (default, s3)`, addr, "get", "nope")
	if code := ExitCode(r.err); code != ExitNotFound {
		t.Errorf("missing backup: exit code %d, want %d", code, ExitNotFound)
	}

	// delete finds only-s3 in s3 and removes it from there only.
	if r := mustRun(t, addr, "delete", "only-s3"); r.out != "backup \"only-s3\" deleted\n" {
		t.Fatalf("delete only-s3: %q", r.out)
	}
	if r := mustRun(t, addr, "list", "-o", "name"); r.out != "backup/both\nbackup/both\nbackup/only-default\n" {
		t.Fatalf("after delete: %q", r.out)
	}
	r = run(t, addr, "delete", "both")
	if r.err == nil || !IsAlreadyReported(r.err) || ExitCode(r.err) != ExitUsage || !strings.Contains(r.errOut, "say which with --location") {
		t.Fatalf("delete both: %v (code %d), stderr %q", r.err, ExitCode(r.err), r.errOut)
	}
}

// The default location is listed beside GetServerInfo; when it fails,
// the error still names it, and the other locations are listed.
func TestListDefaultLocationFails(t *testing.T) {
	addr, srv := startTwoServer(t)
	backups := filepath.Join(srv.Dirs["default"], "backups")
	if err := os.RemoveAll(backups); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(backups, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, addr, "list", "-o", "name")
	if r.out != "backup/both\nbackup/only-s3\n" {
		t.Errorf("list with default broken printed %q, want s3's backups", r.out)
	}
	if r.err == nil || !strings.Contains(r.err.Error(), `list backups in location "default"`) || ExitCode(r.err) == ExitOK {
		t.Errorf("list with default broken: %v", r.err)
	}
}
