package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"

	agelib "filippo.io/age"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// fetchPlain writes backup b's plain etcd snapshot to w as it streams
// through conn (fetch.Snapshot: the stored SHA-256, decryption with ids,
// bounded decompression, etcd's trailer and the plain SHA-256, a broken
// stream re-opened from where it was), as download, inspect and extract
// do. b is the backup as looked up: another stored under its name
// meanwhile is refused.
func fetchPlain(ctx context.Context, conn *Connection, b *ebv1.Backup, w io.Writer, ids []agelib.Identity, progress func(int64)) (snapshot.Plain, error) {
	f, err := fetch.Snapshot(ctx, conn.Client, fetch.Request{
		Name: b.GetName(), Location: b.GetLocation(), Record: b, Identities: ids,
		Progress: progressOf(progress), Out: w,
	})
	return plainOf(f), explainFetch(conn, b, err)
}

// fetchToFile writes backup b's plain etcd snapshot, checked as
// fetchPlain checks it, to the new file path (through path.part, removed
// on failure), showing progress on errOut as doing (a verb) b.
func fetchToFile(ctx context.Context, conn *Connection, b *ebv1.Backup, path string, ids []agelib.Identity, errOut io.Writer, doing string) error {
	bar := newProgress(errOut, b.GetSize(), doing+" "+b.GetName())
	_, err := fetch.Snapshot(ctx, conn.Client, fetch.Request{
		Name: b.GetName(), Location: b.GetLocation(), Record: b, Identities: ids,
		Progress: progressOf(bar.Set), Path: path,
	})
	bar.Finish(err == nil)
	return explainFetch(conn, b, err)
}

// progressOf adapts a progress bar's Set to fetch's progress.
func progressOf(set func(int64)) func(done, total int64) {
	if set == nil {
		return nil
	}
	return func(done, _ int64) { set(done) }
}

// plainOf is what a fetch checked of the plain snapshot, zero when it
// did not get that far.
func plainOf(f *fetch.Fetched) snapshot.Plain {
	if f == nil {
		return snapshot.Plain{}
	}
	return f.Plain
}

// explainFetch words a failed fetch of backup b for the plugin's
// readers of backups (download, inspect, extract): what broke and what
// to do, with the kubectl etcdbackup command that tells more. A restore
// keeps fetch's own words (see RestoreOptions.restoreLocal).
func explainFetch(conn *Connection, b *ebv1.Backup, err error) error {
	var fe *fetch.Error
	if !errors.As(err, &fe) {
		return err
	}
	name := b.GetName()
	switch fe.Kind {
	case fetch.StoredCorrupt:
		return fmt.Errorf("%w; nothing was kept (if it fails again the stored backup is damaged: `kubectl etcdbackup verify %s`)", fe.Err, name)
	case fetch.Corrupt:
		return fmt.Errorf("backup %q: %w; do not restore it", name, fe.Err)
	case fetch.Identity:
		return identityError(name, b, fe.Err)
	case fetch.Download:
		// The transfer's own failure: the server's words.
		return conn.explain("download "+quote(name), fe.Err)
	}
	return conn.explain("download "+quote(name), fe)
}
