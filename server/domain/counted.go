package domain

import (
	"context"
	"errors"
	"io"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// counted is a storage location whose failing calls are counted in
// etcdbackup_storage_errors_total{location, operation}: every call to a
// store passes here, the request layer's and the controller's alike, so
// no caller counts. Its operations are the store's: create, write,
// commit, abort, open, read, stat, list, delete, verification, check.
type counted struct {
	storage.Location
	name    string
	metrics *metrics.Metrics
}

var (
	_ storage.Location           = (*counted)(nil)
	_ storage.VerificationWriter = (*counted)(nil)
	_ storage.Checker            = (*counted)(nil)
	_ storage.Wrapper            = (*counted)(nil)
)

// count counts err against op when it is the storage's fault: not a
// backup that is missing or exists (the caller's), nor a caller that
// went away.
func (c *counted) count(op string, err error) error {
	if err != nil && !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrAlreadyExists) && !errors.Is(err, context.Canceled) {
		c.metrics.StorageErrors.WithLabelValues(c.name, op).Inc()
	}
	return err
}

func (c *counted) Create(ctx context.Context, name string) (storage.Upload, error) {
	up, err := c.Location.Create(ctx, name)
	if err != nil {
		return nil, c.count("create", err)
	}
	return &countedUpload{Upload: up, c: c}, nil
}

func (c *counted) Open(ctx context.Context, name string, offset, length int64) (io.ReadCloser, *storage.Manifest, error) {
	r, m, err := c.Location.Open(ctx, name, offset, length)
	if err != nil {
		return nil, nil, c.count("open", err)
	}
	return &countedReader{ReadCloser: r, c: c}, m, nil
}

func (c *counted) Stat(ctx context.Context, name string) (*storage.Manifest, error) {
	m, err := c.Location.Stat(ctx, name)
	return m, c.count("stat", err)
}

func (c *counted) List(ctx context.Context) ([]*storage.Manifest, error) {
	ms, err := c.Location.List(ctx)
	return ms, c.count("list", err)
}

func (c *counted) Delete(ctx context.Context, name string) error {
	return c.count("delete", c.Location.Delete(ctx, name))
}

// SetVerification implements storage.VerificationWriter for a store that
// can.
func (c *counted) SetVerification(ctx context.Context, name string, v *storage.Verification) error {
	w, ok := c.Location.(storage.VerificationWriter)
	if !ok {
		return errors.New("the location cannot record a drill's verdict")
	}
	return c.count("verification", w.SetVerification(ctx, name, v))
}

// Check implements storage.Checker; a store that cannot check answers.
func (c *counted) Check(ctx context.Context) error {
	ch, ok := c.Location.(storage.Checker)
	if !ok {
		return nil
	}
	return c.count("check", ch.Check(ctx))
}

// Unwrap implements storage.Wrapper: a location check's tries of the
// store's own features (storage.Prober) are not counted, since some are
// meant to be refused.
func (c *counted) Unwrap() storage.Location { return c.Location }

// countedUpload counts an upload's failed writes and commit.
type countedUpload struct {
	storage.Upload
	c *counted
}

func (u *countedUpload) Write(p []byte) (int, error) {
	n, err := u.Upload.Write(p)
	return n, u.c.count("write", err)
}

func (u *countedUpload) Commit(ctx context.Context, m *storage.Manifest) error {
	return u.c.count("commit", u.Upload.Commit(ctx, m))
}

func (u *countedUpload) Abort() error { return u.c.count("abort", u.Upload.Abort()) }

// countedReader counts a download's failed reads (not its end).
type countedReader struct {
	io.ReadCloser
	c *counted
}

func (r *countedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == io.EOF {
		return n, err
	}
	return n, r.c.count("read", err)
}
