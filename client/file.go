package client

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// ErrExists reports that a download's destination appeared while it ran
// and Replace was not set; the complete download is left in the .part.
var ErrExists = errors.New("the destination file exists")

// FileDownload is a download to a file, resumable across runs.
type FileDownload struct {
	// DownloadRequest says what to download; its Offset and Prefix are
	// filled in from the .part file.
	DownloadRequest
	// Path is the file to create; the data goes to Path.part until it is
	// complete and verified.
	Path string
	// Replace lets the download replace an existing Path.
	Replace bool
	// OnResume, if set, is called before downloading when an earlier
	// run's Path.part is resumed, with the bytes it holds.
	OnResume func(part string, offset int64)
	// Parallel is how many ranges are downloaded at once, each over a
	// stream of its own, written in place into Path.part; 0 or 1 is one
	// stream. An interrupted parallel download records its ranges in
	// Path.part.ranges, which a later run continues from with its own
	// Parallel streams (one for a single-stream run).
	Parallel int
	// PieceBytes is the size of the ranges the Parallel streams take in
	// turn from a server that takes lengths; 0 is PieceBytes.
	PieceBytes int64
	// Connect, if set, opens a connection for each range but the first
	// (each port-forward is a stream of its own); without it the ranges
	// share c's connection.
	Connect Connector
	// Verify, if set, checks the complete, verified and synced .part
	// before it is renamed; its error removes the .part.
	Verify func(f *os.File) error
	// Sum, if set, is the SHA-256 the download computes (a fresh
	// sha256.New() otherwise): it is written every byte of the file once,
	// in order, .part included, so a caller can wrap it to check more
	// from the same pass (Verify then reads Sum's findings, not the file).
	Sum hash.Hash
}

// DownloadFile writes the backup to d.Path.part, continuing an existing
// .part from its size (its bytes are hashed first) or from its .ranges
// record (see Parallel), then fsyncs it and renames it to d.Path. A .part proven corrupt by the final SHA-256 is
// removed (the error wraps ErrCorrupt); an interrupted one is kept for the
// next run, unless nothing was written to it.
func (c *Client) DownloadFile(ctx context.Context, d FileDownload) (*ebv1.Backup, error) {
	part := d.Path + ".part"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var b *ebv1.Backup
	_, rerr := os.Stat(part + RangesSuffix)
	if d.Parallel > 1 || rerr == nil {
		// The parallel download hashes the whole file, .part included,
		// as its ranges fill it.
		st, serr := f.Stat()
		if serr != nil {
			return nil, serr
		}
		if st.Size() > 0 && rerr != nil && d.OnResume != nil {
			d.OnResume(part, st.Size())
		}
		b, err = c.downloadParallel(ctx, f, part, st.Size(), d)
	} else {
		prefix := d.sum()
		var offset int64
		if offset, err = io.Copy(prefix, f); err != nil {
			return nil, fmt.Errorf("read %s: %w", part, err)
		}
		if offset > 0 && d.OnResume != nil {
			d.OnResume(part, offset)
		}
		req := d.DownloadRequest
		req.Offset, req.Prefix = offset, prefix
		b, err = c.Download(ctx, f, req)
	}
	if err != nil {
		// A .part proven wrong cannot help a later run; an empty one is
		// clutter.
		if st, serr := f.Stat(); errors.Is(err, ErrCorrupt) || (serr == nil && st.Size() == 0) {
			f.Close()
			os.Remove(part)
		}
		return b, err
	}
	if err := f.Sync(); err != nil {
		return b, fmt.Errorf("sync %s: %w", part, err)
	}
	if d.Verify != nil {
		if err := d.Verify(f); err != nil {
			f.Close()
			os.Remove(part)
			return b, err
		}
	}
	if err := f.Close(); err != nil {
		return b, fmt.Errorf("close %s: %w", part, err)
	}
	if !d.Replace {
		if _, err := os.Stat(d.Path); !errors.Is(err, fs.ErrNotExist) {
			return b, fmt.Errorf("%s: %w; the complete download is in %s", d.Path, ErrExists, part)
		}
	}
	if err := os.Rename(part, d.Path); err != nil {
		return b, err
	}
	return b, nil
}

func (d *FileDownload) sum() hash.Hash {
	if d.Sum != nil {
		return d.Sum
	}
	return sha256.New()
}
