// Package storagetest is the conformance suite every storage.Location
// backend runs, so that all of them keep the one promise of package
// storage: a backup is visible only once complete, an aborted upload
// leaves nothing listed, names are immutable, reads resume at any offset.
package storagetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Suite describes the backend under test.
type Suite struct {
	// New returns a new, empty location; it is called once per subtest.
	New func(t *testing.T) storage.Location
	// BigSize, when > 0, adds a round trip and resumed reads of a backup of
	// that many bytes (for S3: several multipart parts).
	BigSize int64
	// CheckClean, when set, is called after uploads were aborted and asserts
	// that the backend keeps nothing of them (temporary files, open
	// multipart uploads, ...).
	CheckClean func(t *testing.T, loc storage.Location)
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, s Suite) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Suite)
	}{
		{"Empty", testEmpty},
		{"RoundTrip", testRoundTrip},
		{"ManifestFields", testManifestFields},
		{"ResumeFromOffsets", testResume},
		{"OffsetOutOfRange", testOffsetOutOfRange},
		{"Ranges", testRanges},
		{"InvisibleUntilCommit", testInvisibleUntilCommit},
		{"AlreadyExists", testAlreadyExists},
		{"RacingCommits", testRacingCommits},
		{"Abort", testAbort},
		{"CommitWrongName", testCommitWrongName},
		{"Delete", testDelete},
		{"InvalidNames", testInvalidNames},
		{"ConcurrentUploads", testConcurrentUploads},
		{"Describe", testDescribe},
		{"Verification", testVerification},
	}
	if s.BigSize > 0 {
		tests = append(tests, struct {
			name string
			fn   func(t *testing.T, s Suite)
		}{"Big", testBig})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, s) })
	}
}

// Data is size deterministic pseudo-random bytes for seed, generated as
// read (nothing is held in memory).
func Data(seed uint64, size int64) io.Reader {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	return io.LimitReader(rand.NewChaCha8(key), size)
}

// Sum is the SHA-256 (hex) of r's bytes after skipping offset.
func Sum(t testing.TB, r io.Reader, offset int64) (string, int64) {
	t.Helper()
	if _, err := io.CopyN(io.Discard, r, offset); err != nil {
		t.Fatalf("skip %d bytes: %v", offset, err)
	}
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// Put uploads r under name in 64 KiB writes and commits it with a manifest
// of its size and SHA-256; it returns that manifest.
func Put(t testing.TB, loc storage.Location, name string, r io.Reader) *storage.Manifest {
	t.Helper()
	m, err := TryPut(context.Background(), loc, name, r)
	if err != nil {
		t.Fatalf("put %q: %v", name, err)
	}
	return m
}

// TryPut is Put returning the error; the upload is aborted on failure.
func TryPut(ctx context.Context, loc storage.Location, name string, r io.Reader) (*storage.Manifest, error) {
	up, err := loc.Create(ctx, name)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(up, h), r, make([]byte, 64<<10))
	if err != nil {
		return nil, errors.Join(err, up.Abort())
	}
	m := NewManifest(name, n, hex.EncodeToString(h.Sum(nil)))
	if err := up.Commit(ctx, m); err != nil {
		return nil, errors.Join(err, up.Abort())
	}
	return m, nil
}

// NewManifest is a manifest as the request layer writes one.
func NewManifest(name string, size int64, sha string) *storage.Manifest {
	return &storage.Manifest{
		Name:       name,
		Size:       size,
		SHA256:     sha,
		CreateTime: time.Now().UTC().Truncate(time.Millisecond),
		RawSize:    size,
		RawSHA256:  sha,
		Source:     storage.Source{Kind: "upload"},
	}
}

// ReadAt opens name at offset and returns the SHA-256 and length of what
// follows, checking the returned manifest is name's.
func ReadAt(t testing.TB, loc storage.Location, name string, offset int64) (string, int64) {
	t.Helper()
	return ReadRange(t, loc, name, offset, 0)
}

// ReadRange is ReadAt of at most length bytes (0: to the end).
func ReadRange(t testing.TB, loc storage.Location, name string, offset, length int64) (string, int64) {
	t.Helper()
	r, m, err := loc.Open(context.Background(), name, offset, length)
	if err != nil {
		t.Fatalf("open %q at %d for %d bytes: %v", name, offset, length, err)
	}
	defer r.Close()
	if m.Name != name {
		t.Fatalf("open %q returned the manifest of %q", name, m.Name)
	}
	return Sum(t, r, 0)
}

func names(t *testing.T, loc storage.Location) []string {
	t.Helper()
	ms, err := loc.List(context.Background())
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

func wantNames(t *testing.T, loc storage.Location, want ...string) {
	t.Helper()
	if got := names(t, loc); !slices.Equal(got, want) {
		t.Fatalf("List = %q, want %q", got, want)
	}
}

func wantNotFound(t *testing.T, loc storage.Location, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := loc.Stat(ctx, name); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Stat(%q) = %v, want ErrNotFound", name, err)
	}
	if r, _, err := loc.Open(ctx, name, 0, 0); !errors.Is(err, storage.ErrNotFound) {
		if err == nil {
			r.Close()
		}
		t.Errorf("Open(%q) = %v, want ErrNotFound", name, err)
	}
}

func testEmpty(t *testing.T, s Suite) {
	loc := s.New(t)
	wantNames(t, loc)
	wantNotFound(t, loc, "missing")
	if err := loc.Delete(context.Background(), "missing"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Delete(missing) = %v, want ErrNotFound", err)
	}
}

func testRoundTrip(t *testing.T, s Suite) {
	loc := s.New(t)
	sizes := map[string]int64{"empty": 0, "one": 1, "small": 100 << 10, "odd": 1<<20 + 7}
	for name, size := range sizes {
		m := Put(t, loc, name, Data(uint64(size), size))
		got, err := loc.Stat(context.Background(), name)
		if err != nil {
			t.Fatalf("stat %q: %v", name, err)
		}
		if got.Size != size || got.SHA256 != m.SHA256 {
			t.Errorf("stat %q = size %d sha %s, want %d %s", name, got.Size, got.SHA256, size, m.SHA256)
		}
		if sum, n := ReadAt(t, loc, name, 0); sum != m.SHA256 || n != size {
			t.Errorf("read %q: %d bytes sha %s, want %d %s", name, n, sum, size, m.SHA256)
		}
	}
	wantNames(t, loc, "empty", "odd", "one", "small")
}

func testManifestFields(t *testing.T, s Suite) {
	loc := s.New(t)
	ctx := context.Background()
	up, err := loc.Create(ctx, "full")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := up.Write([]byte("snapshot")); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("snapshot"))
	m := NewManifest("full", 8, hex.EncodeToString(sum[:]))
	m.Labels = map[string]string{"cluster": "prod", "etcdbackup.io/schedule": "nightly"}
	m.Compression = "zstd"
	m.RawSize = 1234
	m.RawSHA256 = hex.EncodeToString(make([]byte, 32))
	m.Source = storage.Source{Kind: "agent", Description: "nightly", Target: "https://etcd:2379",
		StartTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), EndTime: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)}
	m.Etcd = &storage.EtcdInfo{ClusterID: 1, MemberID: 2, MemberName: "etcd-0", Revision: 42, Version: "3.7.3", DBSize: 8}
	if err := up.Commit(ctx, m); err != nil {
		t.Fatal(err)
	}
	got, err := loc.Stat(ctx, "full")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(m)
	have, _ := json.Marshal(got)
	if !bytes.Equal(want, have) {
		t.Errorf("manifest changed:\n got %s\nwant %s", have, want)
	}
	ms, err := loc.List(ctx)
	if err != nil || len(ms) != 1 {
		t.Fatalf("list = %v, %v", ms, err)
	}
	if listed, _ := json.Marshal(ms[0]); !bytes.Equal(want, listed) {
		t.Errorf("listed manifest differs:\n got %s\nwant %s", listed, want)
	}
}

func checkResume(t *testing.T, loc storage.Location, name string, seed uint64, size int64, offsets []int64) {
	t.Helper()
	for _, off := range offsets {
		want, wantN := Sum(t, Data(seed, size), off)
		got, n := ReadAt(t, loc, name, off)
		if got != want || n != wantN {
			t.Errorf("read %q from %d: %d bytes sha %s, want %d %s", name, off, n, got, wantN, want)
		}
	}
}

func testResume(t *testing.T, s Suite) {
	loc := s.New(t)
	const size = 300<<10 + 3
	Put(t, loc, "resume", Data(7, size))
	checkResume(t, loc, "resume", 7, size, []int64{0, 1, 4096, size / 2, size - 1, size})
}

func testOffsetOutOfRange(t *testing.T, s Suite) {
	loc := s.New(t)
	Put(t, loc, "short", Data(1, 10))
	for _, r := range [][2]int64{{-1, 0}, {11, 0}, {1 << 40, 0}, {0, -1}} {
		if rc, _, err := loc.Open(context.Background(), "short", r[0], r[1]); err == nil {
			rc.Close()
			t.Errorf("Open at offset %d, length %d of a 10-byte backup succeeded", r[0], r[1])
		}
	}
}

// A range is exactly the bytes [offset, offset+length), cut at the end of
// the backup.
func testRanges(t *testing.T, s Suite) {
	loc := s.New(t)
	const size = 300<<10 + 3
	Put(t, loc, "ranges", Data(5, size))
	data, err := io.ReadAll(Data(5, size))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]int64{{0, 1}, {0, 4096}, {1, 100 << 10}, {size / 2, size / 4}, {size - 1, 1}, {size - 10, 100}, {0, size}, {7, size}} {
		end := min(r[0]+r[1], size)
		sum := sha256.Sum256(data[r[0]:end])
		got, n := ReadRange(t, loc, "ranges", r[0], r[1])
		if got != hex.EncodeToString(sum[:]) || n != end-r[0] {
			t.Errorf("read %d bytes at %d: got %d bytes sha %s, want %d bytes sha %x", r[1], r[0], n, got, end-r[0], sum)
		}
	}
}

func testInvisibleUntilCommit(t *testing.T, s Suite) {
	loc := s.New(t)
	ctx := context.Background()
	up, err := loc.Create(ctx, "pending")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(up, Data(3, 200<<10)); err != nil {
		t.Fatal(err)
	}
	wantNames(t, loc)
	wantNotFound(t, loc, "pending")
	if err := up.Abort(); err != nil {
		t.Fatal(err)
	}
}

func testAlreadyExists(t *testing.T, s Suite) {
	loc := s.New(t)
	first := Put(t, loc, "taken", Data(1, 1000))
	if up, err := loc.Create(context.Background(), "taken"); !errors.Is(err, storage.ErrAlreadyExists) {
		if err == nil {
			_ = up.Abort()
		}
		t.Fatalf("Create of an existing name = %v, want ErrAlreadyExists", err)
	}
	if sum, _ := ReadAt(t, loc, "taken", 0); sum != first.SHA256 {
		t.Errorf("existing backup changed")
	}
}

// testRacingCommits: two uploads of one name, both created before either
// commits. The first commit wins; the second fails with ErrAlreadyExists
// and changes nothing.
func testRacingCommits(t *testing.T, s Suite) {
	loc := s.New(t)
	ctx := context.Background()
	var ups [2]storage.Upload
	var ms [2]*storage.Manifest
	for i := range ups {
		up, err := loc.Create(ctx, "race")
		if err != nil {
			t.Fatalf("create upload %d: %v", i, err)
		}
		ups[i] = up
		data, _ := io.ReadAll(Data(uint64(100+i), 64<<10+int64(i)))
		if _, err := up.Write(data); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		ms[i] = NewManifest("race", int64(len(data)), hex.EncodeToString(sum[:]))
	}
	if err := ups[0].Commit(ctx, ms[0]); err != nil {
		t.Fatalf("first commit: %v", err)
	}
	if err := ups[1].Commit(ctx, ms[1]); !errors.Is(err, storage.ErrAlreadyExists) {
		t.Errorf("second commit = %v, want ErrAlreadyExists", err)
	}
	if err := ups[1].Abort(); err != nil {
		t.Errorf("abort after failed commit: %v", err)
	}
	if sum, n := ReadAt(t, loc, "race", 0); sum != ms[0].SHA256 || n != ms[0].Size {
		t.Errorf("after the race the data is not the winner's")
	}
	if m, err := loc.Stat(ctx, "race"); err != nil || m.SHA256 != ms[0].SHA256 {
		t.Errorf("after the race the manifest is not the winner's: %v", err)
	}
	wantNames(t, loc, "race")
	if s.CheckClean != nil {
		s.CheckClean(t, loc)
	}
}

func testAbort(t *testing.T, s Suite) {
	loc := s.New(t)
	ctx := context.Background()
	for _, size := range []int64{0, 10 << 10, 6 << 20} {
		up, err := loc.Create(ctx, "aborted")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(up, Data(5, size)); err != nil {
			t.Fatal(err)
		}
		if err := up.Abort(); err != nil {
			t.Fatalf("abort after %d bytes: %v", size, err)
		}
		if err := up.Abort(); err != nil {
			t.Errorf("second abort: %v", err)
		}
		wantNames(t, loc)
		wantNotFound(t, loc, "aborted")
		if s.CheckClean != nil {
			s.CheckClean(t, loc)
		}
	}
	// The name is free again.
	m := Put(t, loc, "aborted", Data(6, 1000))
	if sum, _ := ReadAt(t, loc, "aborted", 0); sum != m.SHA256 {
		t.Errorf("upload after abort reads back wrong")
	}
}

func testCommitWrongName(t *testing.T, s Suite) {
	loc := s.New(t)
	ctx := context.Background()
	up, err := loc.Create(ctx, "right")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := up.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("x"))
	if err := up.Commit(ctx, NewManifest("wrong", 1, hex.EncodeToString(sum[:]))); err == nil {
		t.Fatal("commit with another name in the manifest succeeded")
	}
	if err := up.Abort(); err != nil {
		t.Fatal(err)
	}
	wantNames(t, loc)
}

func testDelete(t *testing.T, s Suite) {
	loc := s.New(t)
	ctx := context.Background()
	Put(t, loc, "keep", Data(1, 100))
	Put(t, loc, "gone", Data(2, 100))
	if err := loc.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	wantNames(t, loc, "keep")
	wantNotFound(t, loc, "gone")
	if err := loc.Delete(ctx, "gone"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("second delete = %v, want ErrNotFound", err)
	}
	// The name can be used again, with other content.
	m := Put(t, loc, "gone", Data(3, 2000))
	if sum, n := ReadAt(t, loc, "gone", 0); sum != m.SHA256 || n != 2000 {
		t.Errorf("re-created backup reads back wrong")
	}
}

// A drill's verdict is recorded in the manifest, read back by Stat, List
// and Open, and changes nothing else; a deleted backup is not brought
// back by recording one.
func testVerification(t *testing.T, s Suite) {
	loc := s.New(t)
	w, ok := loc.(storage.VerificationWriter)
	if !ok {
		t.Fatalf("%T cannot record a drill's verdict (storage.VerificationWriter)", loc)
	}
	ctx := context.Background()
	m := Put(t, loc, "b1", Data(1, 1000))
	v := &storage.Verification{Time: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC), Result: storage.VerificationSucceeded,
		Revision: 42, Keys: 7, HashKV: 99, Duration: 3 * time.Second, Message: "as recorded", Job: "drill-b1"}
	if err := w.SetVerification(ctx, "b1", v); err != nil {
		t.Fatal(err)
	}
	m.Verification = v
	want, _ := json.Marshal(m)
	got, err := loc.Stat(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	if have, _ := json.Marshal(got); !bytes.Equal(want, have) {
		t.Errorf("manifest after recording a verification:\n got %s\nwant %s", have, want)
	}
	ms, err := loc.List(ctx)
	if err != nil || len(ms) != 1 {
		t.Fatalf("list = %v, %v", ms, err)
	}
	if listed, _ := json.Marshal(ms[0]); !bytes.Equal(want, listed) {
		t.Errorf("listed manifest:\n got %s\nwant %s", listed, want)
	}
	if sum, n := ReadAt(t, loc, "b1", 0); sum != m.SHA256 || n != 1000 {
		t.Errorf("data after recording a verification: %d bytes, sha %s, want %s", n, sum, m.SHA256)
	}
	if err := loc.Delete(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	if err := w.SetVerification(ctx, "b1", v); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("verification of a deleted backup = %v, want ErrNotFound", err)
	}
	wantNames(t, loc)
}

func testInvalidNames(t *testing.T, s Suite) {
	loc := s.New(t)
	ctx := context.Background()
	for _, name := range []string{"", ".", "..", "../escape", "a/b", `a\b`, "/abs", "nul\x00"} {
		if up, err := loc.Create(ctx, name); err == nil {
			_ = up.Abort()
			t.Errorf("Create(%q) succeeded", name)
		}
		if _, err := loc.Stat(ctx, name); err == nil {
			t.Errorf("Stat(%q) succeeded", name)
		}
		if err := loc.Delete(ctx, name); err == nil {
			t.Errorf("Delete(%q) succeeded", name)
		}
	}
	wantNames(t, loc)
}

func testConcurrentUploads(t *testing.T, s Suite) {
	loc := s.New(t)
	const n = 4
	var wg sync.WaitGroup
	sums := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			m, err := TryPut(context.Background(), loc, fmt.Sprintf("parallel-%d", i), Data(uint64(i), 256<<10))
			if err == nil {
				sums[i] = m.SHA256
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("upload %d: %v", i, errs[i])
		}
		if sum, _ := ReadAt(t, loc, fmt.Sprintf("parallel-%d", i), 0); sum != sums[i] {
			t.Errorf("backup %d reads back wrong", i)
		}
	}
	wantNames(t, loc, "parallel-0", "parallel-1", "parallel-2", "parallel-3")
}

func testDescribe(t *testing.T, s Suite) {
	loc := s.New(t)
	if loc.Describe() == "" || loc.Type() == "" {
		t.Errorf("Describe() = %q, Type() = %q: both must say something", loc.Describe(), loc.Type())
	}
}

func testBig(t *testing.T, s Suite) {
	loc := s.New(t)
	size := s.BigSize
	m := Put(t, loc, "big", Data(9, size))
	if m.Size != size {
		t.Fatalf("put %d bytes, manifest says %d", size, m.Size)
	}
	checkResume(t, loc, "big", 9, size, []int64{0, 1, 5<<20 - 1, 5 << 20, 5<<20 + 1, size / 2, size - 1, size})
}

// ListCounter counts the listings of the location it wraps, for tests of
// what lists a location how often. It writes verdicts through, as the
// location it wraps does.
type ListCounter struct {
	storage.Location
	Lists atomic.Int64
}

// List implements storage.Location.
func (c *ListCounter) List(ctx context.Context) ([]*storage.Manifest, error) {
	c.Lists.Add(1)
	return c.Location.List(ctx)
}

// SetVerification implements storage.VerificationWriter when the wrapped
// location does.
func (c *ListCounter) SetVerification(ctx context.Context, name string, v *storage.Verification) error {
	w, ok := c.Location.(storage.VerificationWriter)
	if !ok {
		return fmt.Errorf("set the verification of %q: %w", name, errors.ErrUnsupported)
	}
	return w.SetVerification(ctx, name, v)
}

// ListByName lists loc, by backup name.
func ListByName(t testing.TB, loc storage.Location) map[string]*storage.Manifest {
	t.Helper()
	ms, err := loc.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*storage.Manifest{}
	for _, m := range ms {
		out[m.Name] = m
	}
	return out
}
