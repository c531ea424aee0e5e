package member_test

import (
	"context"
	"errors"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// backUp writes marker=value into a real etcd and stores a backup of it
// through a real data server with the backup agent.
func backUp(t *testing.T, name, compression, value string) *servertest.Server {
	t.Helper()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	if _, err := c.Put(context.Background(), "marker", value); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, "")
	if _, err := backup.Run(context.Background(), c, srv.Client, backup.Options{Endpoint: te.Endpoint, Name: name, Compression: compression}); err != nil {
		t.Fatal(err)
	}
	return srv
}

func memberAt(t *testing.T, dataDir string) (snapshot.Member, url.URL) {
	peer := etcdtest.FreeURL(t)
	return snapshot.Member{Name: "m1", InitialCluster: "m1=" + peer.String(), InitialAdvertisePeerURLs: []string{peer.String()}, DataDir: dataDir}, peer
}

func TestRestoreThroughTheServerBringsTheDataBack(t *testing.T) {
	for _, compression := range []string{"", "zstd"} {
		t.Run("compression="+compression, func(t *testing.T) {
			srv := backUp(t, "b1", compression, "before")
			dataDir := filepath.Join(t.TempDir(), "data")
			m, peer := memberAt(t, dataDir)
			var verified member.Verified
			var progressed bool
			// What a caller timing the steps relies on: every byte before
			// the checks end, the checks before the rebuild starts.
			var order []string
			res, err := member.Restore(context.Background(), srv.Client, member.Options{Name: "b1", Member: m}, member.Events{
				Downloading: func(done, total int64) {
					progressed = progressed || (done > 0 && total > 0)
					if done == total && !slices.Contains(order, "downloaded") {
						order = append(order, "downloaded")
					}
				},
				Verified:   func(v member.Verified) { verified = v; order = append(order, "verified") },
				Rebuilding: func() { order = append(order, "rebuilding") },
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"downloaded", "verified", "rebuilding"}; !slices.Equal(order, want) {
				t.Errorf("events %q, want %q", order, want)
			}
			if res.DataDir != dataDir || !progressed || verified.Backup.GetName() != "b1" || verified.Status.TotalKey == 0 {
				t.Fatalf("result %+v, verified %+v, progressed %v", res, verified, progressed)
			}
			// By default the revision is bumped and marked compacted.
			if res.BumpRevision != snapshot.DefaultRevisionBump || !res.MarkedCompacted || res.SnapshotRevision != verified.Status.Revision ||
				res.Revision != verified.Status.Revision+snapshot.DefaultRevisionBump {
				t.Fatalf("result %+v after a snapshot at revision %d, want it bumped by %d and marked compacted", res, verified.Status.Revision, snapshot.DefaultRevisionBump)
			}
			if _, err := os.Stat(member.DefaultWorkDir(dataDir, "b1")); !os.IsNotExist(err) {
				t.Errorf("work dir left behind: %v", err)
			}
			if got := readMarker(t, m, peer); got != "before" {
				t.Fatalf("marker = %q, want %q", got, "before")
			}
		})
	}
}

func TestRestoreFromAFileNeedsNoServer(t *testing.T) {
	srv := backUp(t, "b1", "zstd", "from-file")
	file := filepath.Join(t.TempDir(), "b1.backup")
	if _, err := srv.Client.DownloadFile(context.Background(), client.FileDownload{Path: file, DownloadRequest: client.DownloadRequest{Name: "b1"}}); err != nil {
		t.Fatal(err)
	}
	m, peer := memberAt(t, filepath.Join(t.TempDir(), "data"))
	var verified member.Verified
	rebuilding := 0
	if _, err := member.Restore(context.Background(), nil, member.Options{Name: "b1", FromFile: file, Member: m}, member.Events{
		Downloading: func(int64, int64) { t.Error("a restore from a file reported a download") },
		Verified:    func(v member.Verified) { verified = v },
		Rebuilding: func() {
			if verified.File == "" {
				t.Error("the rebuild started before the file was verified")
			}
			rebuilding++
		},
	}); err != nil {
		t.Fatal(err)
	}
	if verified.File != file || verified.Backup != nil || rebuilding != 1 {
		t.Fatalf("verified %+v, rebuilding reported %d times", verified, rebuilding)
	}
	if got := readMarker(t, m, peer); got != "from-file" {
		t.Fatalf("marker = %q", got)
	}
}

func TestRestoreRefusesWithoutTouchingTheDataDir(t *testing.T) {
	srv := backUp(t, "b1", "", "x")
	ctx := context.Background()

	// A backup that does not exist: a download error carrying the API's
	// NotFound, and no data dir.
	dataDir := filepath.Join(t.TempDir(), "data")
	m, _ := memberAt(t, dataDir)
	_, err := member.Restore(ctx, srv.Client, member.Options{Name: "missing", Member: m}, member.Events{})
	var fe *fetch.Error
	if !errors.As(err, &fe) || fe.Kind != fetch.Download || status.Code(fe.Err) != codes.NotFound {
		t.Fatalf("got %v, want a fetch.Error of its download with NotFound", err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatal("a failed restore created the data dir")
	}

	// A non-empty data dir is refused before anything is downloaded.
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "keep"), []byte("precious"), 0o600)
	m2, _ := memberAt(t, full)
	_, err = member.Restore(ctx, srv.Client, member.Options{Name: "b1", Member: m2}, member.Events{
		Downloading: func(int64, int64) { t.Error("downloaded although the data dir is not empty") },
	})
	if !errors.Is(err, snapshot.ErrDataDirNotEmpty) {
		t.Fatalf("got %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(full, "keep")); string(b) != "precious" {
		t.Fatal("the data dir was changed")
	}

	// A flipped byte in storage: corrupt, refused, data dir untouched.
	stored := filepath.Join(srv.Dir, "backups", "b1.db")
	b, err := os.ReadFile(stored)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	os.WriteFile(stored, b, 0o600)
	_, err = member.Restore(ctx, srv.Client, member.Options{Name: "b1", Member: m}, member.Events{})
	if err == nil || !strings.Contains(err.Error(), "corrupt") || !errors.Is(err, snapshot.ErrCorrupt) {
		t.Fatalf("got %v, want corrupt", err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatal("a corrupt backup created the data dir")
	}
}

func TestOptionsValidateDoesNoIO(t *testing.T) {
	if err := (member.Options{}).Validate(); err == nil || !strings.Contains(err.Error(), "name of a backup") {
		t.Fatalf("got %v", err)
	}
	if err := (member.Options{Name: "b", Member: snapshot.Member{Name: "m"}}).Validate(); err == nil || !strings.Contains(err.Error(), "initial cluster") {
		t.Fatalf("got %v", err)
	}
	m, _ := memberAt(t, "/d")
	m.BumpRevision = ptr[int64](-1)
	if err := (member.Options{Name: "b", Member: m}).Validate(); err == nil || !strings.Contains(err.Error(), "revision bump -1 is negative") {
		t.Fatalf("negative bump: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// The flow passes the bump to etcd's restore and says what it did: with 0
// the member starts at the snapshot's revision; a bump that would take the
// revision past int64 is refused before the data dir is written.
func TestRestoreRevisionBump(t *testing.T) {
	srv := backUp(t, "b1", "", "kept")
	ctx := context.Background()

	m, peer := memberAt(t, filepath.Join(t.TempDir(), "data"))
	m.BumpRevision = ptr[int64](0)
	res, err := member.Restore(ctx, srv.Client, member.Options{Name: "b1", Member: m}, member.Events{})
	if err != nil {
		t.Fatal(err)
	}
	if res.BumpRevision != 0 || res.MarkedCompacted || res.Revision != res.SnapshotRevision || res.SnapshotRevision == 0 {
		t.Fatalf("result %+v, want the snapshot's revision kept and nothing marked", res)
	}
	c := etcdtest.StartOn(t, m.DataDir, m.Name, m.InitialCluster, peer).Client(t)
	got, err := c.Get(ctx, "marker")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "kept" || got.Header.Revision != res.SnapshotRevision {
		t.Fatalf("restored member: %+v %v, want marker=kept at revision %d", got, err, res.SnapshotRevision)
	}

	huge, _ := memberAt(t, filepath.Join(t.TempDir(), "data"))
	huge.BumpRevision = ptr[int64](math.MaxInt64)
	_, err = member.Restore(ctx, srv.Client, member.Options{Name: "b1", Member: huge}, member.Events{})
	if err == nil || !strings.Contains(err.Error(), "past the largest etcd can hold") {
		t.Fatalf("bump of MaxInt64: %v", err)
	}
	if _, err := os.Stat(filepath.Join(huge.DataDir, "member")); !os.IsNotExist(err) {
		t.Fatalf("a refused bump wrote the data dir: %v", err)
	}
}

func readMarker(t *testing.T, m snapshot.Member, peer url.URL) string {
	return etcdtest.ReadKey(t, m.DataDir, m.Name, m.InitialCluster, peer, "marker")
}

func TestRestorePinnedToASHA256RefusesABackupReplacedUnderTheSameName(t *testing.T) {
	ctx := context.Background()
	srv := backUp(t, "b1", "", "original")
	got, err := srv.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	pinned := got.GetBackup().GetSha256()
	// Someone replaces b1 with a snapshot of another cluster.
	if _, err := srv.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b1"}); err != nil {
		t.Fatal(err)
	}
	other := etcdtest.Start(t, false)
	oc := other.Client(t)
	if _, err := oc.Put(ctx, "marker", "replaced"); err != nil {
		t.Fatal(err)
	}
	replaced, err := backup.Run(ctx, oc, srv.Client, backup.Options{Endpoint: other.Endpoint, Name: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if replaced.GetSha256() == pinned {
		t.Fatal("the replacement has the same SHA-256; the test proves nothing")
	}

	dataDir := filepath.Join(t.TempDir(), "data")
	m, peer := memberAt(t, dataDir)
	_, err = member.Restore(ctx, srv.Client, member.Options{Name: "b1", Member: m, SHA256: pinned}, member.Events{})
	// The hashes stay out of the error: it reaches the agent's log.
	if !errors.Is(err, fetch.ErrWrongBackup) || strings.Contains(err.Error(), pinned) || strings.Contains(err.Error(), replaced.GetSha256()) {
		t.Fatalf("restore pinned to %s of a backup now %s: %v; want ErrWrongBackup naming neither hash", pinned, replaced.GetSha256(), err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("the refused restore touched the data dir: %v", err)
	}

	// Pinned to what is stored now, the same restore goes through.
	if _, err := member.Restore(ctx, srv.Client, member.Options{Name: "b1", Member: m, SHA256: replaced.GetSha256()}, member.Events{}); err != nil {
		t.Fatal(err)
	}
	if got := readMarker(t, m, peer); got != "replaced" {
		t.Fatalf("marker = %q, want %q", got, "replaced")
	}
}

func TestRestoreRefusesAMalformedSHA256(t *testing.T) {
	m, _ := memberAt(t, filepath.Join(t.TempDir(), "data"))
	err := member.Options{Name: "b1", Member: m, SHA256: "abc"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "--sha256") {
		t.Fatalf("Validate with --sha256 abc: %v; want an error naming --sha256", err)
	}
}

// The agent checks again just before writing: an etcd that took its data
// directory after the early check (here, between download and restore)
// is seen by its WAL lock, and the directory is neither moved nor written.
func TestRestoreRechecksJustBeforeWriting(t *testing.T) {
	srv := backUp(t, "b1", "", "x")
	dataDir := filepath.Join(t.TempDir(), "data")
	wal := filepath.Join(dataDir, "member", "wal", "0000000000000000-0000000000000000.wal")
	m, _ := memberAt(t, dataDir)
	m.MoveAside = true
	var held *fileutil.LockedFile
	defer func() {
		if held != nil {
			held.Close()
		}
	}()
	_, err := member.Restore(context.Background(), srv.Client, member.Options{Name: "b1", Member: m}, member.Events{
		Verified: func(member.Verified) {
			// A member starts on the directory: it writes its WAL and locks it.
			if err := os.MkdirAll(filepath.Dir(wal), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(wal, []byte("wal"), 0o600); err != nil {
				t.Fatal(err)
			}
			var err error
			if held, err = fileutil.TryLockFile(wal, os.O_WRONLY, fileutil.PrivateFileMode); err != nil {
				t.Fatal(err)
			}
		},
		MovedAside: func(to string) { t.Errorf("moved the running member's data to %s", to) },
	})
	if !errors.Is(err, snapshot.ErrMemberRunning) {
		t.Fatalf("restore while a member holds the data dir: %v, want ErrMemberRunning", err)
	}
	if b, err := os.ReadFile(wal); err != nil || string(b) != "wal" {
		t.Fatalf("the running member's WAL: %q, %v", b, err)
	}
}

// A restore of a Kubernetes cluster the data server runs in removes the
// server's key Secrets (every backup holds them) one revision past the
// restored keyspace and says so; the member starts there (issue 37).
func TestRestoreRevokesTheServersKeys(t *testing.T) {
	ctx := context.Background()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	for k, v := range map[string]string{
		"/registry/secrets/etcdbackup-system/etcdbackup-job-signing-key": "key",
		"/registry/secrets/etcdbackup-system/etcdbackup-agent-ca":        "ca",
		"/registry/secrets/kube-system/bootstrap-token":                  "kept",
	} {
		if _, err := c.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	srv := servertest.Start(t, "")
	if _, err := backup.Run(ctx, c, srv.Client, backup.Options{Endpoint: te.Endpoint, Name: "cp"}); err != nil {
		t.Fatal(err)
	}
	m, peer := memberAt(t, filepath.Join(t.TempDir(), "data"))
	res, err := member.Restore(ctx, srv.Client, member.Options{Name: "cp", Member: m}, member.Events{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/registry/secrets/etcdbackup-system/etcdbackup-agent-ca", "/registry/secrets/etcdbackup-system/etcdbackup-job-signing-key"}
	slices.Sort(res.RevokedServerKeys)
	if !slices.Equal(res.RevokedServerKeys, want) || res.Revision != res.SnapshotRevision+snapshot.DefaultRevisionBump+1 {
		t.Fatalf("result %+v, want %q removed at the bumped revision + 1", res, want)
	}
	r := etcdtest.StartOn(t, m.DataDir, m.Name, m.InitialCluster, peer).Client(t)
	got, err := r.Get(ctx, "/registry/secrets/", clientv3.WithPrefix())
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Key) != "/registry/secrets/kube-system/bootstrap-token" || got.Header.Revision != res.Revision {
		t.Fatalf("restored secrets: %v, %v; want only bootstrap-token, at revision %d", got, err, res.Revision)
	}
}
