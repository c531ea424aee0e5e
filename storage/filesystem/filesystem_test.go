package filesystem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Suite{
		New: func(t *testing.T) storage.Location {
			l, err := filesystem.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		BigSize: 16<<20 + 5,
		CheckClean: func(t *testing.T, loc storage.Location) {
			tmp := filepath.Join(loc.Describe(), ".tmp")
			entries, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) > 0 {
				t.Errorf("%s holds %d files after aborted uploads", tmp, len(entries))
			}
		},
	})
}

// TestFull fills a real 1 MiB tmpfs: the upload that does not fit fails
// with storage.ErrNoSpace, leaves nothing behind, and the backup stored
// before it is intact. Mounting needs root.
func TestFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	ctx := context.Background()
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	small := bytes.Repeat([]byte("a"), 100<<10)
	put := func(name string, data []byte) error {
		up, err := loc.Create(ctx, name)
		if err != nil {
			return err
		}
		if _, err := up.Write(data); err != nil {
			_ = up.Abort()
			return err
		}
		sum := sha256.Sum256(data)
		if err := up.Commit(ctx, &storage.Manifest{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}); err != nil {
			_ = up.Abort()
			return err
		}
		return nil
	}
	if err := put("before", small); err != nil {
		t.Fatal(err)
	}
	err = put("big", bytes.Repeat([]byte("b"), 2<<20))
	if !errors.Is(err, storage.ErrNoSpace) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("upload larger than the file system: %v, want storage.ErrNoSpace", err)
	}
	ms, err := loc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Name != "before" {
		t.Fatalf("listed after the refused upload: %v", ms)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, ".tmp")); len(entries) > 0 {
		t.Errorf(".tmp holds %d files after the refused upload", len(entries))
	}
	r, _, err := loc.Open(ctx, "before", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, small) {
		t.Fatalf("earlier backup after the refused upload: %d bytes, %v", len(got), err)
	}
	// The space is back: the next upload that fits succeeds.
	if err := put("after", small); err != nil {
		t.Fatalf("upload after the refused one: %v", err)
	}
}

// tree is every file and directory under dir: path → mode, modification
// time and content, to tell that nothing was written.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		entry := fmt.Sprintf("%v %s", fi.Mode(), fi.ModTime().Format(time.RFC3339Nano))
		if !d.IsDir() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			entry += " " + string(b)
		}
		out[path] = entry
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadOnly: a location opened read-only reads what the owner stored
// and changes nothing, not even what a read-write open cleans (an upload
// in progress in .tmp, data whose manifest is not written yet).
func TestReadOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	owner, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := storagetest.Put(t, owner, "kept", storagetest.Data(1, 100<<10))
	storagetest.Put(t, owner, "other", storagetest.Data(2, 1000))
	// The owner's upload in progress, and one between its two links.
	inProgress, err := owner.Create(ctx, "in-progress")
	if err != nil {
		t.Fatal(err)
	}
	defer inProgress.Abort()
	if _, err := inProgress.Write([]byte("half of a snapshot")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "backups", "linking.db"), []byte("data, manifest next"), 0o640); err != nil {
		t.Fatal(err)
	}
	before := tree(t, dir)

	loc, err := filesystem.NewReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := loc.Check(ctx); err != nil {
		t.Fatalf("check: %v", err)
	}
	ms, err := loc.List(ctx)
	if err != nil || len(ms) != 2 {
		t.Fatalf("list: %d manifests, %v; want kept and other", len(ms), err)
	}
	if got, err := loc.Stat(ctx, "kept"); err != nil || got.SHA256 != m.SHA256 {
		t.Fatalf("stat: %+v, %v", got, err)
	}
	if sum, n := storagetest.ReadAt(t, loc, "kept", 1000); n != m.Size-1000 || sum == "" {
		t.Fatalf("read from offset 1000: %d bytes", n)
	}
	if sum, _ := storagetest.ReadAt(t, loc, "kept", 0); sum != m.SHA256 {
		t.Fatalf("read: SHA-256 %s, want %s", sum, m.SHA256)
	}
	if _, err := loc.Create(ctx, "new"); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("create: %v, want storage.ErrReadOnly", err)
	}
	if err := loc.Delete(ctx, "kept"); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("delete: %v, want storage.ErrReadOnly", err)
	}
	after := tree(t, dir)
	for p, e := range before {
		if after[p] != e {
			t.Errorf("%s changed: %q, was %q", p, after[p], e)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s appeared", p)
		}
	}
}

// TestReadOnlyWrongPath: a directory without backups/ is refused, not
// read as an empty location (nor created).
func TestReadOnlyWrongPath(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{dir, filepath.Join(dir, "missing")} {
		_, err := filesystem.NewReadOnly(path)
		if err == nil || !strings.Contains(err.Error(), "no backups directory under "+path+": is this the location's path?") {
			t.Errorf("NewReadOnly(%s): %v", path, err)
		}
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("%s holds %d entries after read-only opens (%v): nothing may be created", dir, len(entries), err)
	}
}

// TestSharedReplicaStarts: on a shared volume a second replica opening the
// location while the first uploads leaves that upload alone — it commits,
// bytes equal — and a file in .tmp nobody wrote for over an hour (a dead
// replica's) is swept.
func TestSharedReplicaStarts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	first, err := filesystem.NewShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(storagetest.Data(3, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	u, err := first.Create(ctx, "uploading")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Abort()
	if _, err := u.Write(data[:1000]); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(dir, ".tmp", "upload-dead.db")
	if err := os.WriteFile(dead, []byte("a dead replica's upload"), 0o640); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(dead, long, long); err != nil {
		t.Fatal(err)
	}

	if _, err := filesystem.NewShared(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a stale upload of a dead replica was kept: %v", err)
	}
	if _, err := u.Write(data[1000:]); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if err := u.Commit(ctx, storagetest.NewManifest("uploading", int64(len(data)), hex.EncodeToString(sum[:]))); err != nil {
		t.Fatalf("commit after another replica opened the location: %v", err)
	}
	if got, n := storagetest.ReadAt(t, first, "uploading", 0); got != hex.EncodeToString(sum[:]) || n != int64(len(data)) {
		t.Fatalf("read back %d bytes, sha256 %s", n, got)
	}
}

// A shared location's data without a manifest may be another replica's
// commit in progress (where the volume's locks are weaker than they
// should be): a replica that starts removes it only once nobody wrote it
// for staleUpload; a location of one process removes it at once.
func TestOrphanDataIsRemovedOnlyWhenOld(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			dir := t.TempDir()
			open := filesystem.New
			if shared {
				open = filesystem.NewShared
			}
			if _, err := open(dir); err != nil {
				t.Fatal(err)
			}
			recent, old := filepath.Join(dir, "backups", "recent.db"), filepath.Join(dir, "backups", "old.db")
			for _, p := range []string{recent, old} {
				if err := os.WriteFile(p, []byte("data without a manifest"), 0o640); err != nil {
					t.Fatal(err)
				}
			}
			long := time.Now().Add(-2 * time.Hour)
			if err := os.Chtimes(old, long, long); err != nil {
				t.Fatal(err)
			}
			if _, err := open(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(old); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("orphan data unwritten for 2h was kept: %v", err)
			}
			if _, err := os.Stat(recent); shared != (err == nil) {
				t.Errorf("orphan data written just now: stat %v; want it kept only in a shared location", err)
			}
		})
	}
}

// TestSharedCommitsOfOneName: replicas (two Locations, each its own
// lock file descriptor, as two processes) commit one name at the same
// moment, over and over: exactly one wins each time, and the stored data
// is the winner's — a replica never takes another's data for a crash's
// orphan.
func TestSharedCommitsOfOneName(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var locs [2]*filesystem.Location
	for i := range locs {
		l, err := filesystem.NewShared(dir)
		if err != nil {
			t.Fatal(err)
		}
		locs[i] = l
	}
	for round := range 50 {
		name := fmt.Sprintf("race-%d", round)
		var sums [2]string
		var ups [2]storage.Upload
		var sizes [2]int64
		// Both uploads are open before either commits: Create itself
		// refuses a name already committed, so only then do the two
		// commits race.
		for i, l := range locs {
			data := []byte(strings.Repeat(fmt.Sprintf("replica %d round %d\n", i, round), 1000))
			sum := sha256.Sum256(data)
			sums[i], sizes[i] = hex.EncodeToString(sum[:]), int64(len(data))
			u, err := l.Create(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := u.Write(data); err != nil {
				t.Fatal(err)
			}
			ups[i] = u
		}
		errs := make(chan error, 2)
		for i, u := range ups {
			go func() {
				err := u.Commit(ctx, storagetest.NewManifest(name, sizes[i], sums[i]))
				if err != nil {
					_ = u.Abort()
				}
				errs <- err
			}()
		}
		won := 0
		for range 2 {
			switch err := <-errs; {
			case err == nil:
				won++
			case !errors.Is(err, storage.ErrAlreadyExists):
				t.Fatalf("round %d: commit: %v, want success or ErrAlreadyExists", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d commits won", round, won)
		}
		m, err := locs[0].Stat(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := storagetest.ReadAt(t, locs[1], name, 0); got != m.SHA256 || (got != sums[0] && got != sums[1]) {
			t.Fatalf("round %d: stored data sha256 %s, its manifest says %s", round, got, m.SHA256)
		}
	}
}

// List reads again what changed since the last listing, and only that is
// read: a manifest replaced (a drill's verdict), one rewritten in place by
// hand, one deleted and one added are listed as they are now, and the
// manifest returned is the caller's to change.
func TestListSeesChangedManifests(t *testing.T) {
	dir := t.TempDir()
	l, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		storagetest.Put(t, l, name, strings.NewReader("data of "+name))
	}
	first := storagetest.ListByName(t, l)
	first["a"].Labels = map[string]string{"changed": "by the caller"}

	if err := l.SetVerification(ctx, "a", &storage.Verification{Time: time.Now().UTC(), Result: storage.VerificationSucceeded}); err != nil {
		t.Fatal(err)
	}
	// By hand, in place: the same file, other bytes.
	path := filepath.Join(dir, "backups", "b.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte(`"name": "b"`), []byte(`"name": "b", "labels": {"edited": "by hand"}`), 1)
	if err := os.WriteFile(path, raw, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := l.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	storagetest.Put(t, l, "d", strings.NewReader("data of d"))

	got := storagetest.ListByName(t, l)
	if len(got) != 3 || got["c"] != nil || got["d"] == nil {
		t.Fatalf("listed %v; want a, b and d", got)
	}
	if v := got["a"].Verification; v == nil || v.Result != storage.VerificationSucceeded {
		t.Errorf("a's verdict, written since the last listing, is %+v", v)
	}
	if got["a"].Labels["changed"] != "" {
		t.Error("a change the caller made to a listed manifest came back in the next listing")
	}
	if got["b"].Labels["edited"] != "by hand" {
		t.Errorf("b, edited in place since the last listing, lists with labels %v", got["b"].Labels)
	}
}

// A location on a shared volume reads every manifest at every listing: a
// network file system may answer stat(2) from its cache, and another
// replica's change would list late. A manifest rewritten in place with
// the same size and modification time is listed as it is now.
func TestSharedListRereadsEveryManifest(t *testing.T) {
	dir := t.TempDir()
	l, err := filesystem.NewShared(dir)
	if err != nil {
		t.Fatal(err)
	}
	storagetest.Put(t, l, "a", strings.NewReader("data of a"))
	storagetest.ListByName(t, l)
	path := filepath.Join(dir, "backups", "a.json")
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// One hex digit of the SHA-256 changed: the same size.
	at := bytes.Index(raw, []byte(`"sha256": "`)) + len(`"sha256": "`)
	digit := byte('0')
	if raw[at] == '0' {
		digit = '1'
	}
	raw[at] = digit
	if err := os.WriteFile(path, raw, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	got := storagetest.ListByName(t, l)["a"]
	if got == nil || got.SHA256[0] != digit {
		t.Fatalf("a, rewritten in place with its size and time kept, lists as %+v; want it read again", got)
	}
}
