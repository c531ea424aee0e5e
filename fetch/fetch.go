// Package fetch yields a stored backup's plain etcd snapshot from the data
// server with every check, for every caller that needs one: the plugin's
// download, inspect and extract, a restore (the agent's and `restore
// --local`), a drill and a fold. The stored bytes come through the
// client's resuming download (a broken stream is re-opened from the byte
// it reached; a resumable fetch continues an earlier run's .part; a
// backup stored plain may come in parallel ranges), which verifies the
// stored SHA-256; age decryption, decompression bounded by the recorded
// raw size, etcd's SHA-256 trailer and the plain size and SHA-256 are
// checked as the bytes stream, in bounded memory, and optionally bolt's
// consistency. A delta segment is fetched the same way (Segment), without
// the snapshot's checks. Failures are *Error, whose Kind says which step
// failed; its message is a restore's, and a caller with other remedies
// words them from the Kind once.
package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"filippo.io/age"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Pin names a stored backup or delta segment and the stored SHA-256 it
// must have: the contract's Ref, as a restore Job's segment list and a
// fold Job's inputs carry it.
type Pin = agentjob.Ref

// CheckSHA256 says whether s is a SHA-256 as the API writes them:
// lowercase hex, 64 characters.
func CheckSHA256(s string) error {
	if b, err := hex.DecodeString(s); err != nil || len(b) != sha256.Size || strings.ToLower(s) != s {
		return fmt.Errorf("%q is not a SHA-256 in lowercase hex (64 characters)", s)
	}
	return nil
}

// Request says which backup to fetch, which content it must be, how to
// decrypt it and where its plain snapshot goes: to Out as it streams, or
// to the file Path.
type Request struct {
	Name, Location string
	// SHA256, when set, is the only stored SHA-256 accepted: another
	// backup stored under the name is refused at the stream's header,
	// before any byte is written (ErrWrongBackup).
	SHA256 string
	// Record, when set, is the backup as the caller looked it up: the
	// stream must carry its SHA-256 (ErrChanged otherwise), an encrypted
	// one without Identities is refused before anything is asked, and a
	// backup it says is stored plain may be fetched in Parallel ranges.
	Record *ebv1.Backup
	// Identities decrypt an age-encrypted backup. Without them an
	// encrypted one is refused before any byte is written
	// (crypt.ErrIdentityRequired).
	Identities []age.Identity
	// Progress, if set, is called with the stored bytes reached and the
	// backup's stored size.
	Progress func(done, total int64)

	// Out receives the plain snapshot as it streams: bytes reach it
	// before the end is verified, so on error the caller discards what
	// it wrote. Nothing is kept on disk. Exactly one of Out and Path.
	Out io.Writer
	// Path is the file the plain snapshot is written to, through
	// Path.part (with Resume, Path.stored for a backup stored compressed
	// or encrypted: the stored bytes are what resumes), renamed once every
	// check passed.
	Path string
	// Replace lets the fetch replace an existing Path (client.ErrExists
	// otherwise).
	Replace bool
	// Resume keeps an interrupted fetch's partial file for the next run
	// with the same Path, which continues it; without it a failed fetch
	// leaves nothing behind.
	Resume bool
	// Parallel and Connect fetch a backup Record says is stored plain in
	// that many ranges at once, each over a connection Connect opens
	// (client.FileDownload).
	Parallel int
	Connect  client.Connector
	// CheckDatabase runs bolt's consistency check of the file written
	// (with Path) and reports etcd's status of it.
	CheckDatabase bool
}

// Fetched is what a fetch checked.
type Fetched struct {
	// Backup is the server's record, as the stream's header carried it.
	Backup *ebv1.Backup
	// Plain is the plain snapshot's size and SHA-256.
	Plain snapshot.Plain
	// Status is etcd's status of the snapshot (with CheckDatabase).
	Status snapshot.Status
}

// Snapshot fetches the plain etcd snapshot of backup req.Name with every
// check: the stored SHA-256 (client.Download), age's decryption and
// authentication, decompression bounded by the recorded raw size, etcd's
// SHA-256 trailer and the recorded plain size and SHA-256, and with
// CheckDatabase bolt's check. A backup stored plain is hashed once: the
// SHA-256 the download computes carries etcd's trailer check. Errors are
// *Error, but for client.ErrExists (Path appeared meanwhile, without
// Replace), a cancelled ctx and a failure of Out, returned as they are.
func Snapshot(ctx context.Context, c *client.Client, req Request) (*Fetched, error) {
	if (req.Out == nil) == (req.Path == "") {
		return nil, errors.New("fetch: give the plain snapshot a writer or a file, one of them")
	}
	if req.Record != nil {
		if err := req.checkHeader(req.Record, false); err != nil {
			return nil, err
		}
	}
	var f *Fetched
	var err error
	switch {
	case req.Out != nil:
		f, err = req.stream(ctx, c, req.Out)
	case req.Record != nil && storedPlain(req.Record):
		f, err = req.toFile(ctx, c)
	case req.Resume:
		f, err = req.unpackToFile(ctx, c)
	default:
		f, err = req.streamToFile(ctx, c)
	}
	if err != nil || !req.CheckDatabase {
		return f, err
	}
	// The trailer was verified as the file was written: bolt's check is
	// what is left.
	if f.Status, err = snapshot.CheckDatabase(req.Path); err != nil {
		return f, &Error{Kind: Corrupt, Name: req.Name, Err: err}
	}
	return f, nil
}

// storedPlain says whether b's stored bytes are its etcd snapshot.
func storedPlain(b *ebv1.Backup) bool {
	return b.GetCompression() == ebv1.CompressionNone && b.GetEncryption() == ebv1.EncryptionNone
}

// checkHeader refuses a backup other than the one asked for, and an
// encrypted one without identities.
func (req *Request) checkHeader(b *ebv1.Backup, segment bool) error {
	switch {
	case req.SHA256 != "" && b.GetSha256() != req.SHA256:
		return &Error{Kind: WrongBackup, Name: req.Name, Segment: segment}
	case req.Record != nil && b.GetSha256() != req.Record.GetSha256():
		return &Error{Kind: Changed, Name: req.Name, Segment: segment}
	case b.GetEncryption() != ebv1.EncryptionNone && len(req.Identities) == 0:
		return &Error{Kind: Identity, Name: req.Name, Segment: segment, Err: crypt.ErrIdentityRequired}
	}
	return nil
}

// download is the client's request for req's stored bytes, the header
// checked and the progress reported; check, when set, is the SHA-256
// the download computes.
func (req *Request) download(check *snapshot.TrailerCheck, segment bool, onHeader func(*ebv1.Backup)) client.DownloadRequest {
	var total int64
	dr := client.DownloadRequest{
		Name: req.Name, Location: req.Location,
		OnHeader: func(b *ebv1.Backup) error {
			if err := req.checkHeader(b, segment); err != nil {
				return err
			}
			total = b.GetSize()
			if onHeader != nil {
				onHeader(b)
			}
			return nil
		},
		Progress: func(n int64) {
			if req.Progress != nil {
				req.Progress(n, total)
			}
		},
	}
	if check != nil {
		dr.Prefix = check.Hash()
	}
	return dr
}

// downloadError classifies an error of the stored bytes' download.
func (req *Request) downloadError(err error, segment bool) error {
	switch {
	case err == nil:
		return nil
	case KindOf(err) != 0, errors.Is(err, client.ErrExists):
		return err
	case errors.Is(err, client.ErrCorrupt):
		return &Error{Kind: StoredCorrupt, Name: req.Name, Segment: segment, Err: err}
	}
	return &Error{Kind: Download, Name: req.Name, Segment: segment, Err: err}
}

// plainError classifies an error of turning stored bytes into the plain
// snapshot.
func (req *Request) plainError(err error, segment bool) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, crypt.ErrIdentityRequired), errors.Is(err, crypt.ErrNoMatchingIdentity):
		return &Error{Kind: Identity, Name: req.Name, Segment: segment, Err: err}
	case errors.Is(err, snapshot.ErrCorrupt), errors.Is(err, crypt.ErrTampered):
		return &Error{Kind: Corrupt, Name: req.Name, Segment: segment, Err: err}
	}
	return &Error{Kind: Local, Name: req.Name, Segment: segment, Err: err}
}

// checkStoredPlain says whether the bytes check hashed — a backup stored
// plain, whose stored SHA-256 the download verified — are a whole etcd
// snapshot as b records it: etcd's trailer, and the plain size and
// SHA-256 recorded when it was stored (those of the stored bytes).
func (req *Request) checkStoredPlain(b *ebv1.Backup, check *snapshot.TrailerCheck) (snapshot.Plain, error) {
	p := snapshot.Plain{Size: b.GetSize(), SHA256: b.GetSha256()}
	_, err := check.Finish()
	if err == nil && (b.GetRawSize() != 0 && b.GetRawSize() != p.Size || b.GetRawSha256() != "" && b.GetRawSha256() != p.SHA256) {
		err = fmt.Errorf("%w: the snapshot is %d bytes with SHA-256 %s, but %d bytes with SHA-256 %s were recorded when it was stored",
			snapshot.ErrCorrupt, p.Size, p.SHA256, b.GetRawSize(), b.GetRawSha256())
	}
	if err != nil {
		return p, &Error{Kind: Corrupt, Name: req.Name, Err: err}
	}
	return p, nil
}

// errPlainStopped ends the download when the plain side stopped.
var errPlainStopped = errors.New("the plain snapshot stopped being written")

// switchWriter is the download's destination, chosen when the header
// says how the backup is stored (before any byte is written).
type switchWriter struct{ w io.Writer }

func (s *switchWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

// stream writes the plain snapshot to out. A backup stored plain goes
// straight to out, its trailer checked from the download's own SHA-256:
// no pipe, no decoder, no second hash of every byte. Otherwise the
// stored bytes pass through a pipe to snapshot.WritePlain. Nothing is
// buffered beyond the pipe and the decoders' windows.
func (req *Request) stream(ctx context.Context, c *client.Client, out io.Writer) (*Fetched, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	check := snapshot.NewTrailerCheck()
	dst := &switchWriter{}
	var pr *io.PipeReader
	var pw *io.PipeWriter
	type plainResult struct {
		p   snapshot.Plain
		err error
	}
	done := make(chan plainResult, 1)
	b, dlErr := c.Download(ctx, dst, req.download(check, false, func(b *ebv1.Backup) {
		if storedPlain(b) {
			dst.w = out
			return
		}
		pr, pw = io.Pipe()
		dst.w = pw
		go func() {
			p, err := snapshot.WritePlain(ctx, out, pr, snapshot.FormOf(b), req.Identities, nil)
			switch {
			case err == nil:
				// The decoders may stop before the last stored byte; the
				// stored SHA-256 covers them all.
				_, err = io.Copy(io.Discard, pr)
			case errors.Is(err, snapshot.ErrCorrupt):
				// Read the rest: a stored SHA-256 that does not match
				// either says more precisely what broke (storage or
				// transfer, not the content).
				_, _ = io.Copy(io.Discard, pr)
			}
			pr.CloseWithError(errPlainStopped)
			done <- plainResult{p, err}
		}()
	}))
	if pw == nil {
		if dlErr != nil {
			return &Fetched{Backup: b}, req.downloadError(dlErr, false)
		}
		p, err := req.checkStoredPlain(b, check)
		return &Fetched{Backup: b, Plain: p}, err
	}
	pw.CloseWithError(dlErr) // nil: io.EOF for the decoders
	res := <-done
	f := &Fetched{Backup: b, Plain: res.p}
	switch err := res.err; {
	case errors.Is(dlErr, client.ErrCorrupt):
		return f, req.downloadError(dlErr, false)
	case dlErr != nil && !errors.Is(dlErr, errPlainStopped) && !errors.Is(dlErr, io.ErrClosedPipe):
		// The transfer's own failure explains the rest.
		return f, req.downloadError(dlErr, false)
	case errors.Is(err, snapshot.ErrCorrupt), errors.Is(err, crypt.ErrIdentityRequired), errors.Is(err, crypt.ErrNoMatchingIdentity):
		return f, req.plainError(err, false)
	case err != nil:
		return f, err // out's own, or ctx's
	}
	return f, nil
}

// toFile downloads a backup stored plain straight into req.Path, in
// req.Parallel ranges, its trailer checked from the one pass that
// hashes the file.
func (req *Request) toFile(ctx context.Context, c *client.Client) (*Fetched, error) {
	check := snapshot.NewTrailerCheck()
	f := &Fetched{}
	dr := req.download(nil, false, nil)
	b, err := c.DownloadFile(ctx, client.FileDownload{
		DownloadRequest: dr, Sum: check.Hash(),
		Path: req.Path, Replace: req.Replace, Parallel: req.Parallel, Connect: req.Connect,
		// The stored SHA-256 matched, from check's pass over the file.
		Verify: func(*os.File) error {
			var err error
			f.Plain, err = req.checkStoredPlain(req.Record, check)
			return err
		},
	})
	f.Backup = b
	if err != nil {
		req.discard(req.Path)
		return f, req.downloadError(err, false)
	}
	return f, nil
}

// unpackToFile downloads the stored bytes into Path.stored, then writes
// the plain snapshot to Path: a backup stored plain is checked and
// renamed, one compressed or encrypted decoded (snapshot.WritePlainFile).
// The header decides, so a caller that did not look the backup up (an
// agent may only download it) needs nothing else.
func (req *Request) unpackToFile(ctx context.Context, c *client.Client) (*Fetched, error) {
	stored := req.Path + ".stored"
	check := snapshot.NewTrailerCheck()
	b, err := c.DownloadFile(ctx, client.FileDownload{
		DownloadRequest: req.download(nil, false, nil), Sum: check.Hash(),
		Path: stored, Replace: true,
	})
	f := &Fetched{Backup: b}
	if err != nil {
		req.discard(stored)
		return f, req.downloadError(err, false)
	}
	if !req.Replace {
		if _, err := os.Stat(req.Path); err == nil {
			os.Remove(stored)
			return f, fmt.Errorf("%s: %w", req.Path, client.ErrExists)
		}
	}
	if storedPlain(b) {
		if f.Plain, err = req.checkStoredPlain(b, check); err != nil {
			os.Remove(stored)
			return f, err
		}
		if err := os.Rename(stored, req.Path); err != nil {
			return f, &Error{Kind: Local, Name: req.Name, Err: err}
		}
		return f, nil
	}
	in, err := os.Open(stored)
	if err != nil {
		return f, &Error{Kind: Local, Name: req.Name, Err: err}
	}
	f.Plain, err = snapshot.WritePlainFile(ctx, req.Path, in, snapshot.FormOf(b), req.Identities, nil)
	in.Close()
	if err != nil {
		if ctx.Err() != nil {
			return f, ctx.Err()
		}
		return f, req.plainError(err, false)
	}
	os.Remove(stored)
	return f, nil
}

// streamToFile streams the plain snapshot into Path.part (which must not
// exist), fsyncs it and renames it to Path; a failed fetch removes it.
func (req *Request) streamToFile(ctx context.Context, c *client.Client) (*Fetched, error) {
	part := req.Path + ".part"
	out, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, &Error{Kind: Local, Name: req.Name, Err: err}
	}
	keep := false
	defer func() {
		if !keep {
			out.Close()
			os.Remove(part)
		}
	}()
	f, err := req.stream(ctx, c, out)
	if err != nil {
		return f, err
	}
	if err := out.Sync(); err != nil {
		return f, &Error{Kind: Local, Name: req.Name, Err: fmt.Errorf("sync %s: %w", part, err)}
	}
	if err := out.Close(); err != nil {
		return f, &Error{Kind: Local, Name: req.Name, Err: fmt.Errorf("close %s: %w", part, err)}
	}
	if !req.Replace {
		if _, err := os.Stat(req.Path); err == nil {
			return f, fmt.Errorf("%s: %w", req.Path, client.ErrExists)
		}
	}
	if err := os.Rename(part, req.Path); err != nil {
		return f, &Error{Kind: Local, Name: req.Name, Err: err}
	}
	keep = true
	return f, nil
}

// discard removes what a failed fetch left of path unless it resumes.
func (req *Request) discard(path string) {
	if req.Resume {
		return
	}
	os.Remove(path + ".part")
	os.Remove(path + ".part" + client.RangesSuffix)
}
