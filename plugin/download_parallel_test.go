package plugin

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

func TestDownloadParallel(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	file, data, sum := writeSnapshot(t, "p.db", bigSnapshot)
	mustRun(t, addr, "upload", file, "--name", "p")
	out := filepath.Join(t.TempDir(), "p.db")
	r := mustRun(t, addr, "download", "p", "-o", out, "--raw", "--parallel", "3")
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatalf("download --parallel 3 wrote %d bytes sha256 %s, want %d bytes sha256 %s (stderr %q)", len(got), sha(got), len(data), sum, r.errOut)
	}
	noFiles(t, out+".part", out+".part.ranges")

	mustFail(t, "--parallel -1: must be 1 or more", addr, "download", "p", "-o", out+"2", "--parallel", "-1")
	mustFail(t, "--parallel 2: standard output", addr, "download", "p", "-o", "-", "--parallel", "2")
	// Random bytes are no snapshot: a plain parallel download checks the
	// file as a plain one does, and keeps nothing. (upload refuses them:
	// they replace the stored backup, its manifest rewritten to match.)
	_, junk, _ := writeRandom(t, "junk", len(data))
	replaceStored(t, srv.Dir, "p", junk)
	mustFail(t, "do not restore it", addr, "download", "p", "-o", out+"3", "--parallel", "2")
	noFiles(t, out+"3", out+"3.part", out+"3.part.ranges")
}

func TestDownloadParallelPlainSnapshot(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	snapFile := etcdSnapshot(t, map[string]string{"k": marker})
	snap, _ := os.ReadFile(snapFile)
	mustRun(t, addr, "upload", snapFile, "--name", "s")
	out := filepath.Join(t.TempDir(), "s.db")
	mustRun(t, addr, "download", "s", "-o", out, "--parallel", "2")
	if got, _ := os.ReadFile(out); !bytes.Equal(got, snap) {
		t.Fatal("a plain download in parallel is not the snapshot")
	}
	noFiles(t, out+".part", out+".part.ranges")
}

// A backup stored as the plain snapshot is checked in one pass: the
// stored SHA-256, etcd's trailer from the same hash, and the recorded
// size; a snapshot whose trailer is wrong is refused and nothing kept.
// (The server stores no such snapshot: it is put in place of a stored
// backup, its manifest rewritten to match.)
func TestDownloadPlainSnapshotOnePass(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	snap, _ := os.ReadFile(etcdSnapshot(t, map[string]string{"k": marker}))
	bad := append([]byte(nil), snap...)
	bad[len(bad)-100] ^= 1 // in the database: the trailer no longer matches
	ctx := context.Background()
	for _, name := range []string{"good", "bad"} {
		if _, err := srv.Client.Upload(ctx, bytes.NewReader(snap), &ebv1.UploadHeader{Name: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	replaceStored(t, srv.Dir, "bad", bad)
	dir := t.TempDir()
	r := mustRun(t, addr, "download", "good", "-o", filepath.Join(dir, "good.db"))
	if got, _ := os.ReadFile(filepath.Join(dir, "good.db")); !bytes.Equal(got, snap) {
		t.Fatalf("plain download is not the snapshot (stderr %q)", r.errOut)
	}
	if r := mustRun(t, addr, "download", "good", "-o", "-"); r.out != string(snap) {
		t.Fatal("plain download to standard output is not the snapshot")
	}
	mustFail(t, "etcd's SHA-256 trailer does not match the database; do not restore it", addr, "download", "bad", "-o", filepath.Join(dir, "bad.db"))
	noFiles(t, filepath.Join(dir, "bad.db"), filepath.Join(dir, "bad.db.part"))
	mustFail(t, "do not restore it", addr, "download", "bad", "-o", "-")
	// The same checks from the parallel download's one pass.
	mustFail(t, "etcd's SHA-256 trailer does not match the database; do not restore it", addr, "download", "bad", "-o", filepath.Join(dir, "bad.db"), "--parallel", "2")
	noFiles(t, filepath.Join(dir, "bad.db"), filepath.Join(dir, "bad.db.part"), filepath.Join(dir, "bad.db.part.ranges"))
}
