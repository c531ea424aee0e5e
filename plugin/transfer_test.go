package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

func TestUploadDownloadRoundTrip(t *testing.T) {
	addr := startServer(t)
	file, data, sum := writeSnapshot(t, "snapshot.db", bigSnapshot) // several gRPC messages, not a round number
	size := len(data)

	r := mustRun(t, addr, "upload", file, "--name", "rt", "--labels", "reason=test")
	if want := fmt.Sprintf("backup %q uploaded: %d bytes, sha256 %s\n", "rt", size, sum); r.out != want {
		t.Fatalf("upload stdout %q, want %q", r.out, want)
	}
	mustFail(t, "rt", addr, "upload", file, "--name", "rt") // backups are immutable

	// --raw transfers the backup as stored (plain downloads, which check
	// the snapshot, are in encryption_test.go).
	out := filepath.Join(t.TempDir(), "out.db")
	r = mustRun(t, addr, "download", "rt", "-o", out, "--raw")
	if want := fmt.Sprintf("backup %q downloaded to %s (%d bytes, sha256 %s verified)\n", "rt", out, size, sum); r.errOut != want {
		t.Fatalf("download stderr %q, want %q", r.errOut, want)
	}
	if r.out != "" {
		t.Fatalf("download to a file wrote %d bytes to stdout", len(r.out))
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) || sha(got) != sum {
		t.Fatalf("downloaded %d bytes sha256 %s, uploaded %d bytes sha256 %s", len(got), sha(got), size, sum)
	}
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Fatalf("%s.part left behind: %v", out, err)
	}

	// -o - streams the bytes to stdout and nothing else.
	r = mustRun(t, addr, "download", "rt", "-o", "-", "--raw")
	if r.out != string(data) {
		t.Fatalf("download -o - wrote %d bytes sha256 %s, want %d bytes sha256 %s", len(r.out), sha([]byte(r.out)), size, sum)
	}

	// The default file is the backup's name in the current directory.
	dir := t.TempDir()
	t.Chdir(dir)
	mustRun(t, addr, "download", "rt", "--raw")
	if got, err := os.ReadFile(filepath.Join(dir, "rt")); err != nil || sha(got) != sum {
		t.Fatalf("download without -o: %v, sha256 %s", err, sha(got))
	}
}

// replaceStored puts data in place of what the filesystem location at dir
// stores for backup name, and rewrites its manifest's sizes and SHA-256 to
// match: a backup that is no longer what was uploaded, though its record
// and bytes agree, as a damaged disk and a rewritten manifest would leave.
func replaceStored(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "backups", name+".db"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, "backups", name+".json")
	m, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(m, &doc); err != nil {
		t.Fatal(err)
	}
	doc["size"], doc["sha256"] = len(data), sha(data)
	doc["rawSize"], doc["rawSHA256"] = len(data), sha(data)
	if m, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, m, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestDownloadRefusesToOverwrite(t *testing.T) {
	addr := startServer(t)
	file, data, _ := writeSnapshot(t, "b", smallSnapshot)
	mustRun(t, addr, "upload", file)

	out := filepath.Join(t.TempDir(), "existing.db")
	if err := os.WriteFile(out, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := mustFail(t, "--overwrite", addr, "download", "b", "-o", out)
	if want := out + " already exists; pass --overwrite to replace it or -o to choose another file"; r.err.Error() != want {
		t.Fatalf("error %q, want %q", r.err, want)
	}
	if got, _ := os.ReadFile(out); string(got) != "keep me" {
		t.Fatalf("refused download changed the file to %d bytes", len(got))
	}
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Fatalf("refused download left a .part: %v", err)
	}

	// The refusal comes before any connection: nothing need listen.
	mustFail(t, "already exists", "--server-address", nowhere, "download", "b", "-o", out)

	mustRun(t, addr, "download", "b", "-o", out, "--overwrite", "--raw")
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatalf("download --overwrite: file has %d bytes, want the backup's %d", len(got), len(data))
	}
}

func TestDownloadMissingBackupLeavesNothing(t *testing.T) {
	addr := startServer(t)
	out := filepath.Join(t.TempDir(), "x")
	mustFail(t, `backup "nope" not found`, addr, "download", "nope", "-o", out)
	for _, p := range []string{out, out + ".part"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("failed download left %s: %v", p, err)
		}
	}
}

func TestDelete(t *testing.T) {
	addr := startServer(t)
	for _, n := range []string{"a", "b"} {
		file, _, _ := writeSnapshot(t, n, smallSnapshot)
		mustRun(t, addr, "upload", file)
	}

	// kubectl's wording, on stdout.
	r := mustRun(t, addr, "delete", "a")
	if r.out != "backup \"a\" deleted\n" || r.errOut != "" {
		t.Fatalf("delete: stdout %q, stderr %q", r.out, r.errOut)
	}

	// One missing: the others are still deleted, each failure is printed
	// once, and the command fails without main printing it again.
	r = run(t, addr, "delete", "gone", "b")
	if !IsAlreadyReported(r.err) {
		t.Fatalf("delete with a missing name: error %v, want it already reported", r.err)
	}
	if r.out != "backup \"b\" deleted\n" {
		t.Fatalf("delete gone b: stdout %q", r.out)
	}
	if !strings.HasPrefix(r.errOut, `error: delete backup "gone": backup "gone" not found`) || strings.Count(r.errOut, "error:") != 1 {
		t.Fatalf("delete gone b: stderr %q", r.errOut)
	}

	// A single missing name is printed once too.
	r = run(t, addr, "delete", "gone")
	if !IsAlreadyReported(r.err) || strings.Count(r.errOut, "not found") != 1 {
		t.Fatalf("delete gone: error %v, stderr %q", r.err, r.errOut)
	}

	r = mustRun(t, addr, "list")
	if r.out != "" || r.errOut != "No backups found.\n" {
		t.Fatalf("list after deleting all: stdout %q, stderr %q", r.out, r.errOut)
	}
}

// A server without agents refuses backup and logs with a message that
// says why, and says what to do instead.
func TestBackupAndLogsWithoutAgents(t *testing.T) {
	addr := startServer(t)
	r := mustFail(t, "start backup: this server cannot launch backup agents", addr, "backup", "--wait")
	if !strings.Contains(r.err.Error(), "kubectl etcdbackup upload") || !strings.Contains(r.err.Error(), "FailedPrecondition") {
		t.Fatalf("backup error does not help: %v", r.err)
	}
	mustFail(t, `logs of "x": this server launches no agents, so there are no agent logs`, addr, "logs", "x")
}

// upload refuses random bytes, which are no etcd snapshot, before
// sending them: nothing is stored. verify re-reads a stored backup on the
// server: one whose stored bytes are random (damaged where it is kept, its
// manifest rewritten to match) is no etcd snapshot, and saying so is an
// error.
func TestVerifyRefusesNonSnapshot(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	junk, data, _ := writeRandom(t, "junk", 4096)
	r := mustFail(t, "upload: "+junk+" is not an etcd snapshot", addr, "upload", junk)
	if !strings.Contains(r.err.Error(), "nothing was sent") {
		t.Fatalf("upload of junk does not say nothing was sent: %v", r.err)
	}
	if r := mustRun(t, addr, "list"); r.out != "" || r.errOut != "No backups found.\n" {
		t.Fatalf("list after the refused upload: stdout %q, stderr %q", r.out, r.errOut)
	}

	file, _, _ := writeSnapshot(t, "junk", smallSnapshot)
	mustRun(t, addr, "upload", file)
	replaceStored(t, srv.Dir, "junk", data)
	r = mustFail(t, `verify "junk": backup "junk" in location "default" is corrupt`, addr, "verify", "junk")
	if !strings.Contains(r.err.Error(), "do not restore it") {
		t.Fatalf("verify error does not warn against restoring: %v", r.err)
	}
	if r.out != "" {
		t.Fatalf("verify of junk printed %q", r.out)
	}
	mustFail(t, `backup "nope" not found`, addr, "verify", "nope")
}

// upload checks the file on the user's machine before it connects: with
// no server listening at the address, what is no etcd snapshot (random
// bytes; a snapshot cut short, so its trailer is gone) is still refused
// as such, plain and with --encrypt-to (checked before it is encrypted),
// and the error names the file.
func TestUploadRefusesWhatIsNoSnapshotBeforeSending(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := "--server-address=" + l.Addr().String()
	l.Close()
	junk, _, _ := writeRandom(t, "junk", 4096)
	_, snap, _ := writeSnapshot(t, "whole.db", smallSnapshot)
	cut := filepath.Join(t.TempDir(), "cut.db")
	if err := os.WriteFile(cut, snap[:len(snap)-100], 0o600); err != nil {
		t.Fatal(err)
	}
	key := agetest.NewKey(t)
	for _, file := range []string{junk, cut} {
		for _, extra := range [][]string{nil, {"--encrypt-to", key.Recipient}} {
			args := append([]string{nobody, "upload", file, "--name", "x"}, extra...)
			r := mustFail(t, "upload: "+file+" is not an etcd snapshot", args...)
			if !strings.Contains(r.err.Error(), "nothing was sent") {
				t.Errorf("upload %v: the error does not say nothing was sent: %v", extra, r.err)
			}
		}
	}
}

// Labels under etcdbackup.io/ are the server's: upload and backup refuse
// them before connecting, naming the flag; nothing is stored.
func TestReservedLabelsAreRefusedEarly(t *testing.T) {
	addr := startServer(t)
	file, _, _ := writeSnapshot(t, "snapshot.db", 4096)
	mustFail(t, `--labels: "etcdbackup.io/scheduled" is under etcdbackup.io/`, addr, "upload", file, "--name", "fake-scheduled",
		"--labels", "etcdbackup.io/scheduled=true,etcdbackup.io/target=cp")
	mustFail(t, `--labels: "etcdbackup.io/target" is under etcdbackup.io/`, addr, "backup", "--labels", "etcdbackup.io/target=cp")
	if r := mustRun(t, addr, "list", "-o", "name"); r.out != "" {
		t.Fatalf("stored after the refusals: %q", r.out)
	}
}
