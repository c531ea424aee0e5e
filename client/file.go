package client

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
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
	// run's Path.part is resumed.
	OnResume func(part string, offset int64)
}

// DownloadFile writes the backup to d.Path.part, continuing an existing
// .part from its size (its bytes are hashed first), then fsyncs it and
// renames it to d.Path. A .part proven corrupt by the final SHA-256 is
// removed (the error wraps ErrCorrupt); an interrupted one is kept for the
// next run, unless nothing was written to it.
func (c *Client) DownloadFile(ctx context.Context, d FileDownload) (*ebv1.Backup, error) {
	part := d.Path + ".part"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	prefix := sha256.New()
	offset, err := io.Copy(prefix, f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", part, err)
	}
	if offset > 0 && d.OnResume != nil {
		d.OnResume(part, offset)
	}
	req := d.DownloadRequest
	req.Offset, req.Prefix = offset, prefix
	b, err := c.Download(ctx, f, req)
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
