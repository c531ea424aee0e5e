package rpc

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// UploadBackup implements ebv1.BackupServiceServer.
func (s *Service) UploadBackup(stream ebv1.BackupService_UploadBackupServer) (err error) {
	ctx := stream.Context()
	start := s.now()
	recv := s.receiver(stream)
	first, err := recv()
	if errors.Is(err, errIdle) {
		return status.Errorf(codes.DeadlineExceeded, "upload: no header arrived within %s (limits.uploadIdleTimeout)", s.limits.UploadIdleTimeout.Duration)
	}
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "upload: no header received: %v", err)
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "upload: the first message must be the header naming the backup")
	}
	kind, err := validateUploadHeader(h, s.limits)
	if err != nil {
		return err
	}
	locName, loc, err := s.location(h.GetLocation())
	if err != nil {
		return err
	}
	agent, isAgent := auth.AgentFrom(ctx)
	if isAgent {
		if err := agentMay(agent, auth.AgentBackup, "upload", h.GetName(), locName); err != nil {
			return err
		}
	} else if kind == storage.SourceAgent {
		// Only an authenticated agent's backup is an agent's: a user
		// cannot make an upload look like one.
		kind = storage.SourceUpload
	}
	release, err := s.claim(locName, h.GetName())
	if err != nil {
		return err
	}
	defer release()
	defer func() { s.metrics.ObserveTransfer("upload", start, err) }()
	s.metrics.InFlight.WithLabelValues("upload").Inc()
	defer s.metrics.InFlight.WithLabelValues("upload").Dec()

	up, err := loc.Create(ctx, h.GetName())
	if err != nil {
		return s.metrics.StorageError("upload", locName, h.GetName(), err)
	}
	committed := false
	defer func() {
		if !committed {
			if aerr := up.Abort(); aerr != nil {
				s.log.Error("discarding failed upload", "location", locName, "backup", h.GetName(), "error", aerr)
			}
		}
	}()

	// A snapshot stored as is carries etcd's own SHA-256 in its last 32
	// bytes: the server checks that, with the same single hash pass that
	// gives what it stores, so an agent need not hash at all, what is
	// stored is what etcd wrote, and no upload stores a file that is not
	// a snapshot. Compressed or encrypted data is hashed plainly: its
	// sender checked the trailer before transforming it.
	var sum io.Writer
	var digestOf func() (string, error)
	if h.GetCompression() == ebv1.CompressionNone && h.GetEncryption() == ebv1.EncryptionNone {
		check := snapshot.NewTrailerCheck()
		sum, digestOf = check, check.Finish
	} else {
		plain := sha256.New()
		sum, digestOf = plain, func() (string, error) { return hex.EncodeToString(plain.Sum(nil)), nil }
	}
	w := io.MultiWriter(up, sum)
	var size int64
	// The first bytes, to check that data declared encrypted is an age file.
	head := make([]byte, 0, len(crypt.Magic))
	var trailer *ebv1.UploadTrailer
	for {
		msg, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, errIdle) {
			s.log.Warn("upload aborted: the client sent nothing", "location", locName, "backup", h.GetName(), "received", size,
				"idle", s.limits.UploadIdleTimeout.Duration, "caller", caller(ctx))
			return status.Errorf(codes.DeadlineExceeded,
				"upload of %q: nothing arrived for %s (limits.uploadIdleTimeout) after %d bytes; the upload was aborted and nothing was stored",
				h.GetName(), s.limits.UploadIdleTimeout.Duration, size)
		}
		if err != nil {
			s.log.Warn("upload interrupted", "location", locName, "backup", h.GetName(), "received", size, "error", err)
			if ctx.Err() != nil {
				return status.Errorf(codes.Canceled, "upload of %q cancelled after %d bytes; nothing was stored", h.GetName(), size)
			}
			return err
		}
		if trailer != nil {
			return status.Error(codes.InvalidArgument, "upload: a message arrived after the trailer; the trailer must be last")
		}
		if msg.GetHeader() != nil {
			return status.Error(codes.InvalidArgument, "upload: a second header arrived; only the first message is a header")
		}
		if t := msg.GetTrailer(); t != nil {
			if err := validateSHA256("trailer SHA-256", t.GetSha256()); err != nil {
				return err
			}
			if err := validateSHA256("trailer raw SHA-256", t.GetRawSha256()); err != nil {
				return err
			}
			if err := validateEtcdFacts("trailer", t.GetEtcd()); err != nil {
				return err
			}
			trailer = t
			continue
		}
		chunk := msg.GetChunk()
		if len(chunk) > MaxChunkBytes {
			return status.Errorf(codes.InvalidArgument, "upload: chunk of %d bytes exceeds the %d-byte limit", len(chunk), MaxChunkBytes)
		}
		size += int64(len(chunk))
		if len(head) < cap(head) {
			head = append(head, chunk[:min(len(chunk), cap(head)-len(head))]...)
		}
		if h.ExpectedSize != nil && size > h.GetExpectedSize() {
			return status.Errorf(codes.DataLoss,
				"upload of %q: more than the declared %d bytes arrived; nothing was stored", h.GetName(), h.GetExpectedSize())
		}
		if _, err := w.Write(chunk); err != nil {
			return s.metrics.StorageError("upload", locName, h.GetName(), err)
		}
		s.metrics.BytesIn.Add(float64(len(chunk)))
		// Stored and hashed: nothing holds the bytes any more.
		releaseUploadChunk(chunk)
	}

	digest, err := digestOf()
	if err != nil {
		s.log.Warn("snapshot refused", "location", locName, "backup", h.GetName(), "source", kind, "received", size, "error", err, "caller", caller(ctx))
		return status.Errorf(codes.DataLoss,
			"upload of %q: the data is not a whole etcd snapshot: it fails etcd's own check (%v); nothing was stored. Upload the file `etcdutl snapshot save` or `kubectl etcdbackup download` wrote", h.GetName(), err)
	}
	if h.ExpectedSize != nil && size != h.GetExpectedSize() {
		return status.Errorf(codes.DataLoss,
			"upload of %q: %d bytes arrived but %d were declared; nothing was stored, upload again", h.GetName(), size, h.GetExpectedSize())
	}
	if want := h.GetExpectedSha256(); want != "" && want != digest {
		return status.Errorf(codes.DataLoss,
			"upload of %q: the data that arrived has SHA-256 %s but %s was declared; nothing was stored, upload again", h.GetName(), digest, want)
	}
	if trailer != nil && (trailer.GetSize() != size || (trailer.GetSha256() != "" && trailer.GetSha256() != digest)) {
		return status.Errorf(codes.DataLoss,
			"upload of %q: the client sent %d bytes with SHA-256 %s but %d bytes with SHA-256 %s arrived; nothing was stored, upload again",
			h.GetName(), trailer.GetSize(), trailer.GetSha256(), size, digest)
	}
	if h.GetEncryption() == ebv1.EncryptionAge && !bytes.Equal(head, crypt.Magic) {
		return status.Errorf(codes.InvalidArgument,
			"upload of %q: declared age-encrypted, but the data does not start with an age header; nothing was stored", h.GetName())
	}
	m := manifestFromHeader(h, kind, size, digest, s.now().UTC())
	if isAgent {
		// The source is what the server knows, not what the agent says.
		m.Source.Kind, m.Source.Description, m.Source.Target = storage.SourceAgent, "job "+agent.JobNamespace+"/"+agent.JobName, agent.Target
	}
	if trailer.GetRawSha256() != "" && (m.Compression != "" || m.Encryption != "") {
		m.RawSize, m.RawSHA256 = trailer.GetRawSize(), trailer.GetRawSha256()
	}
	withSnapshotStatus(m, trailer.GetEtcd())
	if err := up.Commit(ctx, m); err != nil {
		return s.metrics.StorageError("upload", locName, h.GetName(), err)
	}
	committed = true
	s.log.Info("backup stored", "location", locName, "backup", m.Name, "bytes", size, "sha256", digest, "caller", caller(ctx),
		"seconds", s.now().Sub(start).Seconds())
	return stream.SendAndClose(&ebv1.UploadBackupResponse{Backup: backupFromManifest(locName, m)})
}

// errIdle is what a receiver returns when the client sent nothing for
// limits.uploadIdleTimeout.
var errIdle = errors.New("upload idle")

// receiver returns stream.Recv bounded by limits.uploadIdleTimeout, so an
// upload that stops sending does not keep its name claimed, its slot of
// limits.uploadsPerLocation and its buffers forever. Each Recv runs on a
// goroutine owned by the handler that called it; when that gives up
// waiting and returns, gRPC cancels the stream, which ends the Recv, and
// the goroutine with it. The timer runs only while the handler waits, so
// a slow storage write never counts as the client's idleness.
//
// It receives one message ahead: the next chunk is decoded while the
// handler hashes and stores this one. After an error or io.EOF nothing
// more is received, so SendAndClose never runs beside a Recv.
func (s *Service) receiver(stream ebv1.BackupService_UploadBackupServer) func() (*ebv1.UploadBackupRequest, error) {
	type result struct {
		msg *ebv1.UploadBackupRequest
		err error
	}
	start := func() chan result {
		c := make(chan result, 1)
		go func() {
			m, err := stream.Recv()
			c <- result{m, err}
		}()
		return c
	}
	var next chan result
	return func() (*ebv1.UploadBackupRequest, error) {
		if next == nil {
			next = start()
		}
		t := time.NewTimer(s.limits.UploadIdleTimeout.Duration)
		defer t.Stop()
		select {
		case r := <-next:
			next = nil
			if r.err == nil {
				next = start()
			}
			return r.msg, r.err
		case <-t.C:
			return nil, errIdle
		}
	}
}

// claims are the uploads in progress: a second upload of one name is
// refused at once, instead of after its data arrived, and each location
// takes at most limits.uploadsPerLocation.
type claims struct {
	mu          sync.Mutex
	inflight    map[string]bool // "location/name"
	perLocation map[string]int
}

// claim marks an upload of name in loc as in progress, so a second upload
// of the same name is refused at once instead of after its data arrived,
// and counts it against limits.uploadsPerLocation.
func (s *Service) claim(loc, name string) (release func(), err error) {
	c := &s.uploads
	key := loc + "/" + name
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[key] {
		return nil, status.Errorf(codes.AlreadyExists,
			"an upload of backup %q to location %q is already in progress; backups are immutable, choose another name", name, loc)
	}
	if n := c.perLocation[loc]; n >= s.limits.UploadsPerLocation {
		return nil, status.Errorf(codes.ResourceExhausted,
			"%d uploads to location %q are in progress, the most this server allows (limits.uploadsPerLocation); try again when one has finished", n, loc)
	}
	c.inflight[key] = true
	c.perLocation[loc]++
	return func() {
		c.mu.Lock()
		delete(c.inflight, key)
		if c.perLocation[loc]--; c.perLocation[loc] == 0 {
			delete(c.perLocation, loc)
		}
		c.mu.Unlock()
	}, nil
}
