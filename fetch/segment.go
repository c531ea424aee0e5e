package fetch

import (
	"context"
	"fmt"
	"io"
	"os"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Segment fetches delta segment req.Name, pinned to req.SHA256 (required),
// into req.Path in its plain form — decrypted with req.Identities and
// decompressed within its recorded raw size, as a backup is, without the
// snapshot's checks: a segment has no etcd trailer, and replay checks its
// own format as it reads. The stored bytes are kept in Path.stored until
// then, so a fetch run again resumes them. Errors are *Error with
// Segment set, but for a malformed pin.
func Segment(ctx context.Context, c *client.Client, req Request) error {
	if err := CheckSHA256(req.SHA256); err != nil {
		return fmt.Errorf("delta segment %q: %w", req.Name, err)
	}
	stored := req.Path + ".stored"
	b, err := c.DownloadFile(ctx, client.FileDownload{
		DownloadRequest: req.download(nil, true, nil),
		Path:            stored, Replace: true,
	})
	if err != nil {
		return req.downloadError(err, true)
	}
	if err := unpackSegment(ctx, stored, req.Path, snapshot.FormOf(b), req); err != nil {
		return req.plainError(err, true)
	}
	_ = os.Remove(stored)
	return nil
}

// unpackSegment undoes a stored segment's encryption and compression.
func unpackSegment(ctx context.Context, stored, plain string, f snapshot.Form, req Request) error {
	in, err := os.Open(stored)
	if err != nil {
		return err
	}
	defer in.Close()
	var r io.Reader = in
	if f.Encryption == ebv1.EncryptionAge {
		if r, err = crypt.Decrypt(in, req.Identities); err != nil {
			return err
		}
	}
	out, err := os.OpenFile(plain, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// A raw size recorded bounds the expansion; without one, the
	// default bound on backups applies.
	if _, err := snapshot.DecompressLimit(ctx, out, r, f.Compression, f.RawSize); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
