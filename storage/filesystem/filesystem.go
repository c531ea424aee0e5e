// Package filesystem is the storage location backed by a local directory
// (in a cluster, a PersistentVolumeClaim mounted into the server pod).
//
// Layout under the root directory:
//
//	backups/NAME.db    the backup's data
//	backups/NAME.json  its manifest, written last: its presence makes the backup exist
//	.tmp/              uploads in progress; emptied at every start
//	.publish.lock      locked (flock(2); LockFileEx on Windows) while names appear or disappear
//
// Data is written to .tmp, fsynced, and hard-linked into place (link(2)
// never replaces an existing name, so two uploads of one name cannot both
// win); the manifest follows the same way. Data without a manifest is what a
// crash between the two steps leaves; it is removed when the location opens.
// Publishing, deleting and that cleanup hold .publish.lock, so they exclude
// each other across processes too: the server's replicas on a shared
// (ReadWriteMany) volume (NewShared), where .tmp also holds the other
// replicas' uploads and is only swept of what nobody wrote for an hour.
//
// NewReadOnly opens a location without touching it (break-glass access to
// a directory a server owns): nothing is created, cleaned or written.
package filesystem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

const (
	dataSuffix     = ".db"
	manifestSuffix = ".json"
	lockName       = ".publish.lock"
	// staleUpload is how long a file in a shared location's .tmp may go
	// unwritten before another replica takes it for a crashed one's: an
	// upload that moves less than limits.minTransferRate for a minute is
	// ended, and a commit takes seconds.
	staleUpload = time.Hour
	// maxManifestBytes bounds what Stat reads of a manifest, as S3's
	// location bounds its manifest objects: one an upload writes takes a
	// few KB (its labels and fields are bounded), so a larger file is
	// not one, and must not cost its size in memory.
	maxManifestBytes = 1 << 20
)

// errNotRegular is a backup's file that is a symbolic link, a FIFO, a
// device or a directory: the location only ever writes regular files and
// hard links, and following anything else would read what the
// directory's writer points at (another file of the server's, a pipe
// that blocks) as a backup.
var errNotRegular = errors.New("not a regular file (a symbolic link, pipe, device or directory; this location writes none): refusing to read it")

// Location stores backups in a directory.
type Location struct {
	root       string
	backupsDir string
	tmpDir     string
	// readOnly refuses Create and Delete (NewReadOnly).
	readOnly bool

	// listed holds the manifests List read, by name, with the file each
	// was read from: a listing reads only the manifests that changed
	// since (listedFile). Not on a shared volume (NewShared): a network
	// file system may answer stat(2) from its attribute cache, where
	// opening the file revalidates it, so another replica's change would
	// list late.
	rereadAll bool
	listedMu  sync.Mutex
	listed    map[string]listedFile

	// publish, with .publish.lock across processes (lockPublish),
	// serialises the steps that make names appear and disappear, so that a
	// commit can tell an orphan left by a crash from a concurrent commit of
	// the same name.
	publish sync.Mutex
}

var (
	_ storage.Location           = (*Location)(nil)
	_ storage.Checker            = (*Location)(nil)
	_ storage.VerificationWriter = (*Location)(nil)
)

// New opens (creating if needed) the location rooted at dir, which this
// process alone writes, and removes what interrupted uploads and deletes
// left behind.
func New(dir string) (*Location, error) {
	return open(dir, false)
}

// NewShared opens the location rooted at dir as New does, for a directory
// other processes write at the same time (server replicas mounting one
// ReadWriteMany volume: `sharedVolume: true`): their uploads in .tmp are
// left alone, only files there that nobody wrote for staleUpload are
// removed.
func NewShared(dir string) (*Location, error) {
	return open(dir, true)
}

func open(dir string, shared bool) (*Location, error) {
	l, err := newLocation(dir)
	if err != nil {
		return nil, err
	}
	l.rereadAll = shared
	if !shared {
		if err := os.RemoveAll(l.tmpDir); err != nil {
			return nil, fmt.Errorf("clean interrupted uploads in %q: %w", l.tmpDir, err)
		}
	}
	for _, d := range []string{l.backupsDir, l.tmpDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("create storage directory: %w", err)
		}
	}
	if shared {
		if err := removeStale(l.tmpDir, time.Now().Add(-staleUpload)); err != nil {
			return nil, err
		}
	}
	cutoff := time.Now()
	if shared {
		// Locks on a shared volume are only as good as its file
		// system's: data another replica wrote lately may be a commit
		// in progress.
		cutoff = cutoff.Add(-staleUpload)
	}
	if err := l.removeOrphans(cutoff); err != nil {
		return nil, err
	}
	return l, nil
}

// removeStale removes the files in dir last written before cutoff.
func removeStale(dir string, cutoff time.Time) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("scan %q: %w", dir, err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || fi.ModTime().After(cutoff) {
			continue // gone meanwhile, or another replica's upload
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clean interrupted upload %q: %w", e.Name(), err)
		}
	}
	return nil
}

// lockPublish takes the publish lock: the mutex, for this process, and an
// exclusive lock of .publish.lock (lockFile: flock(2), or LockFileEx on
// Windows), for every process writing the location. It is held for a few file operations, so it blocks.
func (l *Location) lockPublish() (unlock func(), err error) {
	l.publish.Lock()
	f, err := os.OpenFile(filepath.Join(l.root, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		l.publish.Unlock()
		return nil, fmt.Errorf("open the publish lock: %w", noSpace(err))
	}
	release, err := lockFile(f)
	if err != nil {
		f.Close()
		l.publish.Unlock()
		return nil, fmt.Errorf("take the publish lock %s: %w", f.Name(), err)
	}
	return func() {
		release()
		f.Close()
		l.publish.Unlock()
	}, nil
}

// newLocation lays the location out under dir, touching nothing.
func newLocation(dir string) (*Location, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("storage directory %q: %w", dir, err)
	}
	return &Location{
		root:       abs,
		backupsDir: filepath.Join(abs, "backups"),
		tmpDir:     filepath.Join(abs, ".tmp"),
	}, nil
}

// NewReadOnly opens the location rooted at dir without writing anything
// to it: no directory is created, no interrupted upload cleaned, and
// Create and Delete fail with storage.ErrReadOnly. It is how a location
// another process owns is read (the plugin's break-glass access), where
// a .tmp file may be that process's upload in progress. dir/backups must
// exist: a directory without it is not a location, most likely a wrong
// path, and reading it as an empty one would hide that.
func NewReadOnly(dir string) (*Location, error) {
	l, err := newLocation(dir)
	if err != nil {
		return nil, err
	}
	l.readOnly = true
	if err := l.Check(context.Background()); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Location) Type() string     { return "filesystem" }
func (l *Location) Describe() string { return l.root }

func (l *Location) dataPath(name string) string {
	return filepath.Join(l.backupsDir, name+dataSuffix)
}

func (l *Location) manifestPath(name string) string {
	return filepath.Join(l.backupsDir, name+manifestSuffix)
}

// checkName is a last line of defence: the request layer validates names
// properly, but this layer must never be able to write outside its root.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.ContainsRune(name, 0) {
		return fmt.Errorf("invalid backup name %q", name)
	}
	return nil
}

// removeOrphans removes backup data without a manifest (a crash between
// publishing the two, a delete that failed halfway) last written before
// cutoff.
func (l *Location) removeOrphans(cutoff time.Time) error {
	unlock, err := l.lockPublish()
	if err != nil {
		return err
	}
	defer unlock()
	entries, err := os.ReadDir(l.backupsDir)
	if err != nil {
		return fmt.Errorf("scan %q: %w", l.backupsDir, err)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), dataSuffix)
		if !ok {
			continue
		}
		if _, err := os.Stat(l.manifestPath(name)); errors.Is(err, fs.ErrNotExist) {
			if info, err := e.Info(); err != nil || info.ModTime().After(cutoff) {
				continue
			}
			if err := os.Remove(l.dataPath(name)); err != nil {
				return fmt.Errorf("remove incomplete backup data %q: %w", name, err)
			}
		}
	}
	return nil
}

// Create implements storage.Location.
func (l *Location) Create(ctx context.Context, name string) (storage.Upload, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if l.readOnly {
		return nil, fmt.Errorf("create %q in %s: %w", name, l.root, storage.ErrReadOnly)
	}
	if _, err := l.Stat(ctx, name); err == nil {
		return nil, fmt.Errorf("%q: %w", name, storage.ErrAlreadyExists)
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	// The temporary name does not contain the backup name: a long name plus
	// a random suffix could pass the file system's 255-byte limit.
	f, err := os.CreateTemp(l.tmpDir, "upload-*"+dataSuffix)
	if err != nil {
		return nil, fmt.Errorf("create temporary file for %q: %w", name, noSpace(err))
	}
	return &upload{loc: l, name: name, f: f}, nil
}

type upload struct {
	loc  *Location
	name string
	f    *os.File
	done bool
}

func (u *upload) Write(p []byte) (int, error) {
	n, err := u.f.Write(p)
	return n, noSpace(err)
}

// noSpace marks a full file system (or an exhausted quota) with
// storage.ErrNoSpace, so the client is told the location is full rather
// than that the server failed.
func noSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", storage.ErrNoSpace, err)
	}
	return err
}

// Check implements storage.Checker: the directories are there (read-only,
// backups/ only: .tmp is the writer's).
func (l *Location) Check(context.Context) error {
	if l.readOnly {
		fi, err := os.Stat(l.backupsDir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("no backups directory under %s: is this the location's path?", l.root)
		case err != nil:
			return fmt.Errorf("storage directory: %w", err)
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory: is %s the location's path?", l.backupsDir, l.root)
		}
		return nil
	}
	for _, d := range []string{l.backupsDir, l.tmpDir} {
		if _, err := os.Stat(d); err != nil {
			return fmt.Errorf("storage directory: %w", err)
		}
	}
	return nil
}

func (u *upload) Commit(ctx context.Context, m *storage.Manifest) error {
	if u.done {
		return errors.New("upload already finished")
	}
	if m.Name != u.name {
		return fmt.Errorf("manifest names %q, upload is %q", m.Name, u.name)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := u.f.Sync(); err != nil {
		return fmt.Errorf("sync data of %q: %w", u.name, noSpace(err))
	}
	if err := u.f.Close(); err != nil {
		return fmt.Errorf("close data of %q: %w", u.name, noSpace(err))
	}
	manifest, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest of %q: %w", u.name, err)
	}
	manifestTmp := u.f.Name() + manifestSuffix
	if err := writeFileSync(manifestTmp, manifest); err != nil {
		return fmt.Errorf("write manifest of %q: %w", u.name, noSpace(err))
	}
	defer os.Remove(manifestTmp)

	l := u.loc
	unlock, err := l.lockPublish()
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(l.manifestPath(u.name)); err == nil {
		return fmt.Errorf("%q: %w", u.name, storage.ErrAlreadyExists)
	}
	// Holding publish, data without a manifest can only be an orphan of a
	// crash or of a delete that failed halfway.
	if err := os.Remove(l.dataPath(u.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale data of %q: %w", u.name, err)
	}
	if err := os.Link(u.f.Name(), l.dataPath(u.name)); err != nil {
		return fmt.Errorf("publish data of %q: %w", u.name, err)
	}
	if err := syncDir(l.backupsDir); err != nil {
		return err
	}
	if err := os.Link(manifestTmp, l.manifestPath(u.name)); err != nil {
		_ = os.Remove(l.dataPath(u.name))
		return fmt.Errorf("publish manifest of %q: %w", u.name, err)
	}
	if err := syncDir(l.backupsDir); err != nil {
		return err
	}
	u.done = true
	_ = os.Remove(u.f.Name())
	return nil
}

func (u *upload) Abort() error {
	if u.done {
		return nil
	}
	u.done = true
	_ = u.f.Close()
	if err := os.Remove(u.f.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("discard upload of %q: %w", u.name, err)
	}
	return nil
}

// Open implements storage.Location.
func (l *Location) Open(ctx context.Context, name string, offset, length int64) (io.ReadCloser, *storage.Manifest, error) {
	m, err := l.Stat(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if offset < 0 || offset > m.Size || length < 0 {
		return nil, nil, fmt.Errorf("offset %d, length %d outside backup %q of %d bytes", offset, length, name, m.Size)
	}
	f, _, err := openRegular(l.dataPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		// Deleted between Stat and Open.
		return nil, nil, fmt.Errorf("%q: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open data of %q: %w", name, err)
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("seek data of %q to %d: %w", name, offset, err)
	}
	if length > 0 {
		return struct {
			io.Reader
			io.Closer
		}{io.LimitReader(f, length), f}, m, nil
	}
	return f, m, nil
}

// Stat implements storage.Location.
func (l *Location) Stat(_ context.Context, name string) (*storage.Manifest, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	b, err := readManifest(l.manifestPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%q: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest of %q: %w", name, err)
	}
	var m storage.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode manifest of %q: %w", name, err)
	}
	if err := storage.CheckManifest(&m, name); err != nil {
		return nil, err
	}
	return &m, nil
}

// readManifest reads the manifest at path: a regular file, not followed
// through a link, of at most maxManifestBytes.
func readManifest(path string) ([]byte, error) {
	f, info, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Sized by the file, so that neither a large one nor growing the
	// buffer as it is read costs more than the bound; the byte past it
	// tells a file over the bound, or one that grew since.
	b := make([]byte, min(max(info.Size(), 0), maxManifestBytes)+1)
	n, err := io.ReadFull(f, b)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		b = b[:n]
	case err != nil:
		return nil, err
	case n <= maxManifestBytes:
		rest, err := io.ReadAll(io.LimitReader(f, int64(maxManifestBytes+1-n)))
		if err != nil {
			return nil, err
		}
		b = append(b, rest...)
	}
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("%s is more than %d bytes, larger than any manifest this location writes: refusing to read it", filepath.Base(path), maxManifestBytes)
	}
	return b, nil
}

// openRegular opens path for reading if it is a regular file, without
// following a symbolic link in its last element (openNoFollow) and
// without blocking on a FIFO.
func openRegular(path string) (*os.File, fs.FileInfo, error) {
	f, err := openNoFollow(path)
	if err != nil {
		return nil, nil, err
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !info.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s is %w", filepath.Base(path), errNotRegular)
	}
	return f, info, nil
}

// listedFile is a manifest as List read it, and the file it read: a
// manifest is never rewritten in place (a new one is linked or renamed
// over it), so a file of the same device, inode, size and modification
// time holds the same manifest.
type listedFile struct {
	dev, ino uint64
	size     int64
	mod      time.Time
	m        *storage.Manifest
}

// fileOf is the identity of the regular file info describes, without its
// manifest; false where there is none to trust (not a regular file, or a
// platform without inodes).
func fileOf(info fs.FileInfo) (listedFile, bool) {
	dev, ino, ok := fileID(info)
	if !ok || !info.Mode().IsRegular() {
		return listedFile{}, false
	}
	return listedFile{dev: dev, ino: ino, size: info.Size(), mod: info.ModTime()}, true
}

// sameFile says whether f and o are one file, unchanged.
func (f listedFile) sameFile(o listedFile) bool {
	return f.dev == o.dev && f.ino == o.ino && f.size == o.size && f.mod.Equal(o.mod)
}

// List implements storage.Location. It reads the manifests that are new
// or replaced since the last listing; the others cost a stat(2) each.
func (l *Location) List(ctx context.Context) ([]*storage.Manifest, error) {
	entries, err := os.ReadDir(l.backupsDir)
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", l.backupsDir, err)
	}
	l.listedMu.Lock()
	known := l.listed
	l.listedMu.Unlock()
	listed := make(map[string]listedFile, len(known))
	var out []*storage.Manifest
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), manifestSuffix)
		if !ok || e.IsDir() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var file listedFile
		idOK := false
		if !l.rereadAll {
			// Before the read: a file replaced in between is read again
			// next time, as its identity is not the one kept.
			info, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted while listing
			}
			if err != nil {
				return nil, fmt.Errorf("list %q: %w", l.backupsDir, err)
			}
			file, idOK = fileOf(info)
			if c, ok := known[name]; ok && idOK && c.sameFile(file) {
				listed[name] = c
				out = append(out, c.m.Clone())
				continue
			}
		}
		m, err := l.Stat(ctx, name)
		if errors.Is(err, storage.ErrNotFound) {
			continue // deleted while listing
		}
		if err != nil {
			return nil, err
		}
		if idOK {
			file.m = m.Clone()
			listed[name] = file
		}
		out = append(out, m)
	}
	l.listedMu.Lock()
	l.listed = listed
	l.listedMu.Unlock()
	return out, nil
}

// Delete implements storage.Location.
func (l *Location) Delete(_ context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if l.readOnly {
		return fmt.Errorf("delete %q from %s: %w", name, l.root, storage.ErrReadOnly)
	}
	unlock, err := l.lockPublish()
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(l.manifestPath(name)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%q: %w", name, storage.ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("delete manifest of %q: %w", name, err)
	}
	if err := syncDir(l.backupsDir); err != nil {
		return err
	}
	if err := os.Remove(l.dataPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete data of %q: %w", name, err)
	}
	return nil
}

// SetVerification implements storage.VerificationWriter: the new manifest
// is written beside the old one and renamed over it, under the lock that
// orders publishing and deleting, so a deleted backup stays deleted.
func (l *Location) SetVerification(ctx context.Context, name string, v *storage.Verification) error {
	if err := checkName(name); err != nil {
		return err
	}
	if l.readOnly {
		return fmt.Errorf("record the verification of %q in %s: %w", name, l.root, storage.ErrReadOnly)
	}
	unlock, err := l.lockPublish()
	if err != nil {
		return err
	}
	defer unlock()
	m, err := l.Stat(ctx, name)
	if err != nil {
		return err
	}
	m.Verification = v
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest of %q: %w", name, err)
	}
	tmp := filepath.Join(l.tmpDir, name+".verification"+manifestSuffix)
	_ = os.Remove(tmp)
	if err := writeFileSync(tmp, b); err != nil {
		return fmt.Errorf("write manifest of %q: %w", name, noSpace(err))
	}
	if err := os.Rename(tmp, l.manifestPath(name)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("replace manifest of %q: %w", name, err)
	}
	return syncDir(l.backupsDir)
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncDir makes a rename or link in dir durable.
func syncDir(dir string) error {
	// etcd's OpenDir: os.Open on Unix; on Windows a handle with write
	// access, without which FlushFileBuffers refuses a directory.
	d, err := fileutil.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("open directory %q: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %q: %w", dir, err)
	}
	return nil
}
