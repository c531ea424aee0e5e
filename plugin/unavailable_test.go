package plugin

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

// TestUnavailableLocationCostsOnlyItself: a server with a filesystem
// location and a real S3 store (versitygw) that stops answering
// (SIGSTOP: it accepts connections and never answers). list shows the
// filesystem's backups, warns about S3 and exits 6; a name without
// --location is found in the filesystem with a warning; one that can
// only be in S3 is an error saying so; after SIGCONT all is back.
func TestUnavailableLocationCostsOnlyItself(t *testing.T) {
	store := s3test.Start(t)
	cfg := store.Config("plugin").S3Config
	// Short bounds, so the test does not wait the real ones (10 s, 30 s).
	bounds := locations.Options{CallTimeout: time.Second, ListTimeout: 2 * time.Second}
	srv := servertest.StartWith(t, servertest.Options{
		Locations:       []string{"default"},
		Configured:      []storage.LocationConfig{{Name: "s3", S3: &cfg}},
		LocationOptions: bounds,
	})
	addr := "--server-address=" + srv.Addr
	snap := filepath.Join(t.TempDir(), "snapshot.db")
	data := etcdtest.SnapshotFile(t, snap, 64<<10)
	for _, up := range [][]string{
		{"--name", "in-fs"},
		{"--name", "in-s3", "--location", "s3"},
		{"--name", "both"},
		{"--name", "both", "--location", "s3"},
		{"--name", "test-fs", "--labels", "env=test"},
		{"--name", "test-s3", "--labels", "env=test", "--location", "s3"},
	} {
		mustRun(t, append([]string{addr, "upload", snap}, up...)...)
	}

	if err := store.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			_ = store.Signal(syscall.SIGCONT)
		}
	})

	listWithS3Stopped(t, addr, bounds)
	findWithS3Stopped(t, addr, data)

	// Deleting by selector deletes what it can and says what it could not.
	r := run(t, addr, "delete", "-l", "env=test", "--yes")
	if r.out != "backup \"test-fs\" deleted\n" || !strings.Contains(r.errOut, `Warning: storage location "s3" is unavailable: `) ||
		!strings.HasSuffix(r.errOut, "; its backups are not deleted\n") || ExitCode(r.err) != ExitIncomplete {
		t.Errorf("delete -l env=test with S3 stopped: exit code %d, stdout %q, stderr %q", ExitCode(r.err), r.out, r.errOut)
	}

	// S3 answers again: the server finds out by itself.
	if err := store.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	began := time.Now()
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		r = run(t, addr, "list", "-o", "name")
		return r.err == nil, nil
	}); err != nil {
		t.Fatalf("list a minute after SIGCONT: %v\nstderr %q", r.err, r.errOut)
	}
	t.Logf("S3 listed again %s after SIGCONT", time.Since(began).Round(time.Millisecond))
	if want := "backup/test-s3\nbackup/both\nbackup/both\nbackup/in-s3\nbackup/in-fs\n"; r.out != want || r.errOut != "" {
		t.Errorf("list after SIGCONT: stdout %q, want %q; stderr %q", r.out, want, r.errOut)
	}
}

// listWithS3Stopped: list shows the filesystem's backups, warns about S3
// and exits 6, the first call finding out within the list bound, the next
// at once; a table says the same; listing S3 itself is an error naming it.
func listWithS3Stopped(t *testing.T, addr string, bounds locations.Options) {
	t.Helper()
	const listed = "backup/test-fs\nbackup/both\nbackup/in-fs\n"
	warning := regexp.MustCompile(`^Warning: storage location "s3" is unavailable: no answer within 2s to list; ` +
		`it is retried in the background \(since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\); its backups are not listed\n$`)
	for i, bound := range []time.Duration{bounds.ListTimeout, 0} {
		began := time.Now()
		r := run(t, addr, "list", "-o", "name")
		took := time.Since(began)
		t.Logf("list %d with S3 stopped: %s, exit code %d, stderr %q", i+1, took.Round(time.Millisecond), ExitCode(r.err), r.errOut)
		if r.out != listed || !warning.MatchString(r.errOut) || ExitCode(r.err) != ExitIncomplete || !IsAlreadyReported(r.err) {
			t.Fatalf("list %d with S3 stopped: exit code %d (%v)\nstdout %q, want %q\nstderr %q", i+1, ExitCode(r.err), r.err, r.out, listed, r.errOut)
		}
		if took > bound+time.Second {
			t.Errorf("list %d with S3 stopped took %s; the bound is %s", i+1, took.Round(time.Millisecond), bound)
		}
	}
	// A table says the same; an empty selection is still incomplete.
	if r := run(t, addr, "list", "-l", "env=none"); r.out != "" || !strings.HasPrefix(r.errOut, "No backups found.\nWarning: storage location \"s3\" is unavailable: ") ||
		ExitCode(r.err) != ExitIncomplete {
		t.Errorf("list -l env=none with S3 stopped: exit code %d, stdout %q, stderr %q", ExitCode(r.err), r.out, r.errOut)
	}
	// Listing the unavailable location itself is an error naming it.
	r := mustFail(t, `list backups: storage location "s3" is unavailable: `, addr, "list", "--location", "s3")
	if ExitCode(r.err) != ExitError || strings.Contains(r.err.Error(), "cannot reach the etcdbackup server") {
		t.Errorf("list --location s3 with S3 stopped: exit code %d: %v", ExitCode(r.err), r.err)
	}
}

// findWithS3Stopped: a name without --location is found where it can be,
// with a warning; one in no location that answers is an error, not "not
// found".
func findWithS3Stopped(t *testing.T, addr string, data []byte) {
	t.Helper()
	searched := func(name string) string {
		return `Warning: storage location "s3" could not be searched for backup "` + name + `" (unavailable: no answer within 2s to list; ` +
			`it is retried in the background (since `
	}
	for _, args := range [][]string{
		{"get", "in-fs", "-o", "jsonpath={.spec.location}"},
		{"get", "both", "-o", "jsonpath={.spec.location}"},
		{"describe", "in-fs"},
	} {
		r := mustRun(t, append([]string{addr}, args...)...)
		want := searched(args[1])
		if !strings.HasPrefix(r.errOut, want) || !strings.HasSuffix(r.errOut, `); using the one in location "default"`+"\n") || strings.Count(r.errOut, "\n") != 1 {
			t.Errorf("%v with S3 stopped: stderr %q, want one line starting %q", args, r.errOut, want)
		}
		t.Logf("%v with S3 stopped: stderr %q", args, r.errOut)
		if args[0] == "get" && r.out != "default" {
			t.Errorf("%v with S3 stopped: %q, want default", args, r.out)
		}
	}
	out := filepath.Join(t.TempDir(), "in-fs.db")
	if r := mustRun(t, addr, "download", "in-fs", "-o", out); !strings.Contains(r.errOut, `storage location "s3" could not be searched for backup "in-fs"`) {
		t.Errorf("download in-fs with S3 stopped: stderr %q", r.errOut)
	}
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download in-fs with S3 stopped: %d bytes (%v), want the %d uploaded", len(got), err, len(data))
	}

	// A name in no location that answers may be in the one that does not:
	// not "not found" (3), which a script would take for certain.
	r := mustFail(t, `get backup "in-s3": backup "in-s3" is not in storage location default, but location "s3" could not be searched (unavailable: no answer within 2s to list; `,
		addr, "get", "in-s3")
	t.Logf("get in-s3 with S3 stopped: %v", r.err)
	if !strings.Contains(r.err.Error(), "; retry once it is available again (`kubectl etcdbackup version` shows each location's state)") || ExitCode(r.err) != ExitError {
		t.Errorf("get in-s3 with S3 stopped: exit code %d: %v", ExitCode(r.err), r.err)
	}
}
