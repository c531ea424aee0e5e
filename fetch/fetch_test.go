package fetch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"filippo.io/age"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// world is a real etcd backed up by the real backup agent into a real
// data server, once in each stored form.
type world struct {
	srv *servertest.Server
	key agetest.Key
}

var forms = []struct{ name, compression string }{{"plain", ""}, {"zstd", ebv1.CompressionZstd}, {"age", ebv1.CompressionZstd}}

func newWorld(t *testing.T) *world {
	t.Helper()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	for i := range 50 {
		if _, err := c.Put(ctx, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	w := &world{srv: servertest.Start(t, ""), key: agetest.NewKey(t)}
	for _, f := range forms {
		o := backup.Options{Endpoint: te.Endpoint, Name: f.name, Compression: f.compression}
		if f.name == "age" {
			o.AgeRecipients = []string{w.key.Recipient}
		}
		if _, err := backup.Run(ctx, c, w.srv.Client, o); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func (w *world) record(t *testing.T, name string) *ebv1.Backup {
	t.Helper()
	resp, err := w.srv.Client.Backups.GetBackup(context.Background(), &ebv1.GetBackupRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetBackup()
}

// Every stored form yields its plain snapshot, the same streamed or into
// a file, whose size and SHA-256 are the ones recorded, and which etcd
// reads.
func TestSnapshotOfEveryFormToEveryDestination(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ids := []age.Identity{w.key.Identity}
	for _, f := range forms {
		b := w.record(t, f.name)
		rawSHA := b.GetRawSha256()
		if rawSHA == "" {
			rawSHA = b.GetSha256()
		}
		var out bytes.Buffer
		var progressed int64
		got, err := fetch.Snapshot(ctx, w.srv.Client, fetch.Request{Name: f.name, Record: b, Identities: ids, Out: &out,
			Progress: func(done, total int64) {
				if total != b.GetSize() {
					t.Errorf("progress of %d bytes, want the stored %d", total, b.GetSize())
				}
				progressed = done
			}})
		if err != nil {
			t.Fatalf("%s to a writer: %v", f.name, err)
		}
		if got.Plain.SHA256 != rawSHA || got.Plain.Size != int64(out.Len()) || progressed != b.GetSize() {
			t.Fatalf("%s to a writer: %+v of %d bytes, progress %d; want sha256 %s", f.name, got.Plain, out.Len(), progressed, rawSHA)
		}
		want := out.Bytes()

		path := filepath.Join(t.TempDir(), "snapshot.db")
		got, err = fetch.Snapshot(ctx, w.srv.Client, fetch.Request{Name: f.name, SHA256: b.GetSha256(), Identities: ids, Path: path, Resume: true, CheckDatabase: true})
		if err != nil {
			t.Fatalf("%s to a file: %v", f.name, err)
		}
		file, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(file, want) || got.Status.TotalKey < 50 || got.Backup.GetName() != f.name {
			t.Fatalf("%s to a file: %v, %d bytes, status %+v", f.name, err, len(file), got.Status)
		}
		if left, _ := filepath.Glob(path + ".*"); len(left) != 0 {
			t.Fatalf("%s to a file left %v", f.name, left)
		}

		// Looked up first: a backup stored plain comes in ranges, the
		// others stream into the file; an existing file is not replaced.
		path = filepath.Join(t.TempDir(), "looked-up.db")
		if _, err = fetch.Snapshot(ctx, w.srv.Client, fetch.Request{Name: f.name, Record: b, Identities: ids, Path: path, Parallel: 2}); err != nil {
			t.Fatalf("%s looked up, to a file: %v", f.name, err)
		}
		if file, err := os.ReadFile(path); err != nil || !bytes.Equal(file, want) {
			t.Fatalf("%s looked up, to a file: %v, %d bytes", f.name, err, len(file))
		}
		_, err = fetch.Snapshot(ctx, w.srv.Client, fetch.Request{Name: f.name, Record: b, Identities: ids, Path: path})
		if !errors.Is(err, client.ErrExists) {
			t.Fatalf("%s over an existing file: %v, want ErrExists", f.name, err)
		}
		if left, _ := filepath.Glob(path + ".*"); len(left) != 0 {
			t.Fatalf("%s to an existing file left %v", f.name, left)
		}
	}
}

// A backup other than the one asked for, an encrypted one without a key,
// one that is not there and one altered in storage are each refused with
// the kind that says why, and nothing of the first two is written.
func TestSnapshotRefusals(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	plain := w.record(t, "plain")
	other := w.record(t, "zstd")
	for name, tc := range map[string]struct {
		req  fetch.Request
		kind fetch.Kind
		is   error
	}{
		"pinned to other content": {fetch.Request{Name: "plain", SHA256: other.GetSha256()}, fetch.WrongBackup, fetch.ErrWrongBackup},
		"changed since looked up": {fetch.Request{Name: "plain", Record: other}, fetch.Changed, fetch.ErrChanged},
		"encrypted without a key": {fetch.Request{Name: "age"}, fetch.Identity, crypt.ErrIdentityRequired},
		"with the wrong key":      {fetch.Request{Name: "age", Identities: []age.Identity{agetest.NewKey(t).Identity}}, fetch.Identity, crypt.ErrNoMatchingIdentity},
	} {
		var out bytes.Buffer
		tc.req.Out = &out
		_, err := fetch.Snapshot(ctx, w.srv.Client, tc.req)
		if fetch.KindOf(err) != tc.kind || !errors.Is(err, tc.is) || out.Len() != 0 {
			t.Errorf("%s: %v (kind %d), %d bytes written; want kind %d, %v, nothing written", name, err, fetch.KindOf(err), out.Len(), tc.kind, tc.is)
		}
	}

	_, err := fetch.Snapshot(ctx, w.srv.Client, fetch.Request{Name: "missing", Path: filepath.Join(t.TempDir(), "x")})
	var fe *fetch.Error
	if !errors.As(err, &fe) || fe.Kind != fetch.Download || status.Code(fe.Err) != codes.NotFound {
		t.Errorf("a missing backup: %v, want its download's NotFound", err)
	}

	// One byte of the stored data changed: the stored SHA-256 says so,
	// as the corruption it is.
	stored := filepath.Join(w.srv.Dir, "backups", "plain.db")
	data, err := os.ReadFile(stored)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(stored, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, req := range []fetch.Request{{Name: "plain", Record: plain, Out: &bytes.Buffer{}}, {Name: "plain", Path: filepath.Join(t.TempDir(), "x")}} {
		_, err := fetch.Snapshot(ctx, w.srv.Client, req)
		if fetch.KindOf(err) != fetch.StoredCorrupt || !errors.Is(err, snapshot.ErrCorrupt) || !errors.Is(err, client.ErrCorrupt) {
			t.Errorf("altered in storage: %v, want StoredCorrupt", err)
		}
	}
}

// A resumable fetch continues from the stored bytes an interrupted one
// left (Path.stored.part), for every form: a damaged prefix fails the
// stored SHA-256 (it was used, not fetched again) and is removed, so the
// next run starts clean; a correct one yields the snapshot.
func TestSnapshotResumesFromAnEarlierRun(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ids := []age.Identity{w.key.Identity}
	for _, f := range forms {
		stored, err := os.ReadFile(filepath.Join(w.srv.Dir, "backups", f.name+".db"))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "snapshot.db")
		part := path + ".stored.part"
		half := append([]byte(nil), stored[:len(stored)/2]...)
		half[len(half)/2] ^= 1
		if err := os.WriteFile(part, half, 0o600); err != nil {
			t.Fatal(err)
		}
		req := fetch.Request{Name: f.name, Identities: ids, Path: path, Resume: true}
		if _, err := fetch.Snapshot(ctx, w.srv.Client, req); fetch.KindOf(err) != fetch.StoredCorrupt {
			t.Fatalf("%s from a damaged earlier run: %v, want StoredCorrupt", f.name, err)
		}
		if _, err := os.Stat(part); !os.IsNotExist(err) {
			t.Fatalf("%s: the damaged .part was kept: %v", f.name, err)
		}

		if err := os.WriteFile(part, stored[:len(stored)/2], 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := fetch.Snapshot(ctx, w.srv.Client, req)
		if err != nil {
			t.Fatalf("%s from an earlier run: %v", f.name, err)
		}
		plain, err := os.ReadFile(path)
		if err != nil || got.Plain.Size != int64(len(plain)) || got.Plain.SHA256 != w.record(t, f.name).GetRawSha256() && got.Plain.SHA256 != w.record(t, f.name).GetSha256() {
			t.Fatalf("%s: %v, %+v for %d bytes", f.name, err, got.Plain, len(plain))
		}
	}
}
