package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	tmtypes "github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager/types"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// errAborted is what the transfer manager reads from the pipe when the
// upload is aborted: it then aborts the multipart upload.
var errAborted = errors.New("upload aborted")

// testHookBeforeManifest, set by tests only, runs between the data and the
// manifest writes of a commit.
var testHookBeforeManifest func(name string)

// Create implements storage.Location. The upload runs until Commit or
// Abort, or until ctx is cancelled (which aborts it).
func (l *Location) Create(ctx context.Context, name string) (storage.Upload, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if l.cfg.ReadOnly {
		return nil, fmt.Errorf("create %q in %s: %w", name, l.where, storage.ErrReadOnly)
	}
	l.retryPendingAborts(ctx)
	if _, _, err := l.stat(ctx, name); err == nil {
		return nil, fmt.Errorf("%q: %w", name, storage.ErrAlreadyExists)
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	if err := l.checkDataFree(ctx, name); err != nil {
		return nil, err
	}

	uctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	u := &upload{loc: l, name: name, pw: pw, cancel: cancel, done: make(chan struct{})}
	// One retention for the data and the manifest: the backup is locked
	// until the earlier of the two ends, which is this. A location
	// check's probes are not locked (its object lock step locks one of
	// its own for seconds): they must go when the check ends.
	if !storage.IsProbe(name) {
		u.lockMode, u.lockedUntil = l.retention(time.Now())
	}
	l.mu.Lock()
	l.active[name]++
	l.mu.Unlock()
	// The goroutine is owned by the upload: Commit and Abort wait for it.
	go u.run(uctx, pr)
	return u, nil
}

// checkDataFree makes sure no data object sits where name's data goes (the
// completion of the data is conditional and would fail at Commit, after
// the whole transfer). Data without a manifest older than OrphanAge is a
// crash's leftover and is removed; younger, it may be another server's
// upload about to write its manifest.
func (l *Location) checkDataFree(ctx context.Context, name string) error {
	h, err := l.head(ctx, l.dataKey(name))
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check %q in %s: %w", name, l.where, err)
	}
	l.mu.Lock()
	busy := l.active[name] > 0
	l.mu.Unlock()
	if age := time.Since(aws.ToTime(h.LastModified)); busy || age < l.cfg.OrphanAge {
		return fmt.Errorf("%q: %w: another upload of it is being completed, or one was interrupted %s ago "+
			"(its data without a manifest is removed once %s old); use another name or retry later",
			name, storage.ErrAlreadyExists, age.Round(time.Second), l.cfg.OrphanAge)
	}
	removed, err := l.removeOrphan(ctx, name)
	if err != nil {
		return err
	}
	if !removed {
		return fmt.Errorf("%q: %w", name, storage.ErrAlreadyExists)
	}
	return nil
}

// removeOrphan deletes name's data if, under the name lock, it still has no
// manifest. It reports false when a manifest appeared.
func (l *Location) removeOrphan(ctx context.Context, name string) (bool, error) {
	unlock, err := l.lockName(ctx, name)
	if err != nil {
		return false, err
	}
	defer unlock()
	if _, err := l.head(ctx, l.manifestKey(name)); err == nil {
		return false, nil
	} else if !isNotFound(err) {
		return false, fmt.Errorf("check manifest of %q in %s: %w", name, l.where, err)
	}
	if err := l.deleteObject(ctx, l.dataKey(name)); err != nil {
		return false, fmt.Errorf("remove data of interrupted upload %q from %s: %w", name, l.where, err)
	}
	l.log.Info("s3 storage location: removed data of an interrupted upload", "s3", l.where, "backup", name)
	return true, nil
}

// upload streams written bytes through a pipe into the transfer manager,
// which cuts them into parts (at most Concurrency+1 part buffers).
type upload struct {
	loc    *Location
	name   string
	pw     *io.PipeWriter
	cancel context.CancelFunc

	done chan struct{} // closed when run returns
	out  *transfermanager.UploadObjectOutput
	err  error

	written  int64
	finished bool // Commit or Abort ran; the caller's goroutine only

	// lockMode and lockedUntil are the object lock retention every
	// object of the backup is written with (none without objectLock).
	lockMode    types.ObjectLockMode
	lockedUntil *time.Time
}

func (u *upload) run(ctx context.Context, pr *io.PipeReader) {
	defer close(u.done)
	l := u.loc
	in := &transfermanager.UploadObjectInput{
		Bucket:      aws.String(l.cfg.Bucket),
		Key:         aws.String(l.dataKey(u.name)),
		Body:        pr,
		ContentType: aws.String("application/octet-stream"),
	}
	if !l.cfg.NoConditionalWrites {
		in.IfNoneMatch = aws.String("*")
	}
	if u.lockedUntil != nil {
		in.ObjectLockMode, in.ObjectLockRetainUntilDate = tmtypes.ObjectLockMode(u.lockMode), u.lockedUntil
	}
	u.out, u.err = l.tm.UploadObject(ctx, in)
	// Unblock a writer: after a failure nobody reads the pipe any more.
	if u.err != nil {
		pr.CloseWithError(u.err)
	} else {
		pr.Close()
	}
}

func (u *upload) Write(p []byte) (int, error) {
	if u.finished {
		return 0, errors.New("upload already finished")
	}
	n, err := u.pw.Write(p)
	u.written += int64(n)
	if err != nil {
		return n, fmt.Errorf("upload %q to %s: %w", u.name, u.loc.where, err)
	}
	return n, nil
}

// Commit implements storage.Upload. A failure after the checks of its
// arguments aborts the upload (Abort is then a no-op).
func (u *upload) Commit(ctx context.Context, m *storage.Manifest) (err error) {
	if u.finished {
		return errors.New("upload already finished")
	}
	if m == nil || m.Name != u.name {
		return fmt.Errorf("manifest names %q, upload is %q", manifestName(m), u.name)
	}
	if m.Size != u.written {
		return fmt.Errorf("manifest of %q says %d bytes but %d were written", u.name, m.Size, u.written)
	}
	u.finished = true
	l := u.loc
	defer l.release(u.name)
	defer func() {
		if err != nil {
			if aerr := u.discard(errAborted); aerr != nil {
				err = fmt.Errorf("%w (and %w)", err, aerr)
			}
		}
	}()

	unlock, err := l.lockName(ctx, u.name)
	if err != nil {
		return err
	}
	defer unlock()
	if err := u.nameFree(ctx); err != nil {
		return err
	}
	etag, err := u.finishData(ctx)
	if err != nil {
		return err
	}
	if testHookBeforeManifest != nil {
		testHookBeforeManifest(u.name)
	}
	if err := u.writeManifest(ctx, m, etag); err != nil {
		return err
	}
	if err := u.dataStillThere(ctx, etag); err != nil {
		return err
	}
	u.out = nil
	return nil
}

// nameFree checks that no backup of the upload's name is published: its
// manifest does not exist.
func (u *upload) nameFree(ctx context.Context) error {
	l := u.loc
	if _, err := l.head(ctx, l.manifestKey(u.name)); err == nil {
		return fmt.Errorf("%q: %w", u.name, storage.ErrAlreadyExists)
	} else if !isNotFound(err) {
		return fmt.Errorf("check %q in %s: %w", u.name, l.where, err)
	}
	return nil
}

// finishData ends the data object: the transfer manager sends the last
// part and completes the upload. It returns the object's ETag ("" when
// the store gives none).
func (u *upload) finishData(ctx context.Context) (etag string, err error) {
	l := u.loc
	// EOF for the transfer manager: it sends the last part and completes.
	u.pw.Close()
	select {
	case <-u.done:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if u.err != nil {
		if isPreconditionFailed(u.err) {
			// If-None-Match: * on the data failed: something is there.
			if _, herr := l.head(ctx, l.manifestKey(u.name)); herr == nil {
				return "", fmt.Errorf("%q: %w", u.name, storage.ErrAlreadyExists)
			}
			return "", fmt.Errorf("%q: %w: data of another upload of this name is present without a manifest; use another name or retry later",
				u.name, storage.ErrAlreadyExists)
		}
		return "", fmt.Errorf("upload data of %q to %s: %w", u.name, l.where, u.err)
	}
	return aws.ToString(u.out.ETag), nil
}

// writeManifest publishes the backup: its manifest, which names the data
// object's etag, written only if no other writer published the name.
func (u *upload) writeManifest(ctx context.Context, m *storage.Manifest, etag string) error {
	l := u.loc
	if u.lockedUntil != nil {
		m.LockedUntil = *u.lockedUntil
	}
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest of %q: %w", u.name, err)
	}
	put := &s3sdk.PutObjectInput{
		Bucket:        aws.String(l.cfg.Bucket),
		Key:           aws.String(l.manifestKey(u.name)),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
	}
	if etag != "" {
		put.Metadata = map[string]string{dataETagMeta: etag}
	}
	if !l.cfg.NoConditionalWrites {
		put.IfNoneMatch = aws.String("*")
	}
	if u.lockedUntil != nil {
		put.ObjectLockMode, put.ObjectLockRetainUntilDate = u.lockMode, u.lockedUntil
	}
	if _, err := l.client.PutObject(ctx, put); err != nil {
		if isPreconditionFailed(err) {
			// Another writer published this name meanwhile: leave its
			// objects alone.
			u.out = nil
			return fmt.Errorf("%q: %w", u.name, storage.ErrAlreadyExists)
		}
		return fmt.Errorf("write manifest of %q to %s: %w", u.name, l.where, joinErrs(err, u.withdraw(etag)))
	}
	return nil
}

// dataStillThere checks, after the manifest is written, that the data
// object is still this upload's: a cleanup elsewhere may have taken it
// for an orphan in the instant between the two writes. Then the manifest
// is withdrawn.
func (u *upload) dataStillThere(ctx context.Context, etag string) error {
	if etag == "" {
		return nil
	}
	l := u.loc
	if _, err := l.client.HeadObject(ctx, &s3sdk.HeadObjectInput{
		Bucket: aws.String(l.cfg.Bucket), Key: aws.String(l.dataKey(u.name)), IfMatch: aws.String(etag),
	}); isNotFound(err) || isPreconditionFailed(err) {
		u.out = nil // not ours any more
		derr := u.removeManifest()
		return fmt.Errorf("data of %q vanished from %s while its manifest was written; upload again: %w", u.name, l.where, joinErrs(err, derr))
	}
	return nil
}

// withdraw undoes a manifest write that failed, maybe only in appearance
// (the store wrote it but the answer was lost): the manifest goes if it is
// this upload's, then the data. If the store cannot say, both stay: a
// complete backup, or data without a manifest that is never listed and
// that CleanOrphans removes, but never a manifest without its data.
func (u *upload) withdraw(etag string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	l := u.loc
	h, err := l.head(ctx, l.manifestKey(u.name))
	switch {
	case isNotFound(err):
	case err != nil:
		u.out = nil // keep the data
		return fmt.Errorf("check whether the manifest of %q was written: %w", u.name, err)
	case etag == "" || h.Metadata[dataETagMeta] != etag:
		u.out = nil // another writer's manifest: keep its data
		return nil
	default:
		if err := u.removeManifest(); err != nil {
			u.out = nil
			return err
		}
	}
	return u.removeData(etag)
}

func manifestName(m *storage.Manifest) string {
	if m == nil {
		return ""
	}
	return m.Name
}

// Abort implements storage.Upload: it stops the transfer and aborts the
// multipart upload. A no-op after Commit (successful or not).
func (u *upload) Abort() error {
	if u.finished {
		return nil
	}
	u.finished = true
	defer u.loc.release(u.name)
	return u.discard(errAborted)
}

// discard stops the transfer if it runs, waits for it, and makes sure no
// multipart upload and no completed data of this upload remain.
func (u *upload) discard(cause error) error {
	u.pw.CloseWithError(cause)
	u.cancel()
	<-u.done
	if u.err == nil && u.out != nil {
		// The data was completed but is not published.
		return u.removeData(aws.ToString(u.out.ETag))
	}
	var withID interface{ UploadID() string }
	if !errors.As(u.err, &withID) || withID.UploadID() == "" {
		return nil // no multipart upload was started, or a single PUT failed
	}
	// The transfer manager aborts on failure, but that abort may itself
	// have failed; aborting again is harmless (NoSuchUpload).
	return u.loc.abortUpload(withID.UploadID(), u.loc.dataKey(u.name))
}

// removeData deletes this upload's completed data object (only if its
// ETag is still ours).
func (u *upload) removeData(etag string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	in := &s3sdk.DeleteObjectInput{Bucket: aws.String(u.loc.cfg.Bucket), Key: aws.String(u.loc.dataKey(u.name))}
	if _, err := u.loc.client.DeleteObject(ctx, in); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove unpublished data of %q (CleanOrphans removes it later): %w", u.name, err)
	}
	u.out = nil
	return nil
}

func (u *upload) removeManifest() error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := u.loc.deleteObject(ctx, u.loc.manifestKey(u.name)); err != nil {
		return fmt.Errorf("withdraw manifest of %q: %w", u.name, err)
	}
	return nil
}

// release ends the bookkeeping of an upload of name.
func (l *Location) release(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[name]--; l.active[name] <= 0 {
		delete(l.active, name)
	}
}

// abortUpload aborts a multipart upload of this process; when the store
// cannot be reached it is remembered and retried later.
func (l *Location) abortUpload(id, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, err := l.client.AbortMultipartUpload(ctx, &s3sdk.AbortMultipartUploadInput{
		Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key), UploadId: aws.String(id),
	})
	if err == nil || isNoSuchUpload(err) {
		l.mu.Lock()
		delete(l.pendingAborts, id)
		l.mu.Unlock()
		return nil
	}
	l.mu.Lock()
	l.pendingAborts[id] = key
	l.mu.Unlock()
	return fmt.Errorf("abort multipart upload of %s in %s (retried by later uploads and the next cleanup): %w", key, l.where, err)
}

// retryPendingAborts retries the aborts that failed, quietly: failures
// stay pending.
func (l *Location) retryPendingAborts(ctx context.Context) (aborted int) {
	l.mu.Lock()
	pending := make(map[string]string, len(l.pendingAborts))
	for id, key := range l.pendingAborts {
		pending[id] = key
	}
	l.mu.Unlock()
	for id, key := range pending {
		if ctx.Err() != nil {
			return aborted
		}
		if l.abortUpload(id, key) == nil {
			aborted++
		}
	}
	return aborted
}
