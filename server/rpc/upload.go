package rpc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/stream"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// UploadBackup implements ebv1.BackupServiceServer in three steps: admit
// the upload (its header, the caller's right to it, its name and its
// slot in the location), receive its data into the location, hashing it
// on the way, and commit it if everything declared matches what arrived.
// Nothing is stored otherwise.
func (s *Service) UploadBackup(stream ebv1.BackupService_UploadBackupServer) (err error) {
	ctx := stream.Context()
	start := s.now()
	recv := s.receiver(stream)
	u, err := s.admitUpload(ctx, recv)
	if err != nil {
		return err
	}
	defer u.release()
	defer func() { s.metrics.ObserveTransfer("upload", start, err) }()
	s.metrics.InFlight.WithLabelValues("upload").Inc()
	defer s.metrics.InFlight.WithLabelValues("upload").Dec()

	up, err := u.loc.Create(ctx, u.name())
	if err != nil {
		return edge.StorageStatus("upload", u.locName, u.name(), err)
	}
	committed := false
	defer func() {
		if !committed {
			if aerr := up.Abort(); aerr != nil {
				s.log.Error("discarding failed upload", "location", u.locName, "backup", u.name(), "error", aerr)
			}
		}
	}()
	r, err := s.receiveUpload(ctx, u, recv, up)
	if err != nil {
		return err
	}
	m, err := s.commitUpload(ctx, u, r, up)
	if err != nil {
		return err
	}
	committed = true
	if m.Delta == nil {
		// A delta agent stores a segment every period (20 s by default):
		// an entry each would bury the others. The chain's full is
		// entered, and so is every read of a segment.
		s.record(ctx, u.locName, ledger.Entry{Action: ledger.ActionUpload, Backup: m.Name, SHA256: m.SHA256, Who: caller(ctx), Detail: uploadDetail(m)})
	}
	s.log.Info("backup stored", "location", u.locName, "backup", m.Name, "bytes", r.size, "sha256", r.digest, "caller", caller(ctx),
		"seconds", s.now().Sub(start).Seconds())
	return stream.SendAndClose(&ebv1.UploadBackupResponse{Backup: edge.Backup(u.locName, m)})
}

// upload is an admitted upload: its header, who sends it, and where it
// goes.
type upload struct {
	header *ebv1.UploadHeader
	// kind is the stored source kind: ebv1.SourceAgent only for an
	// authenticated agent.
	kind string
	// agent is the authenticated agent sending it, or nil.
	agent   *auth.Agent
	locName string
	loc     storage.Location
	// release frees the upload's name and its slot in the location (and
	// a delta segment's chain).
	release func()
	// unlockChain frees a delta segment's chain for its next segment.
	unlockChain func()
}

func (u *upload) name() string { return u.header.GetName() }

// admitUpload receives and checks the header, holds an agent to its own
// backup, and claims the name and a slot of limits.uploadsPerLocation.
func (s *Service) admitUpload(ctx context.Context, recv func() (*ebv1.UploadBackupRequest, error)) (*upload, error) {
	first, err := recv()
	if errors.Is(err, errIdle) {
		return nil, status.Errorf(codes.DeadlineExceeded, "upload: no header arrived within %s (limits.uploadIdleTimeout)", s.limits.UploadIdleTimeout.Duration)
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "upload: no header received: %v", err)
	}
	h := first.GetHeader()
	if h == nil {
		return nil, status.Error(codes.InvalidArgument, "upload: the first message must be the header naming the backup")
	}
	u := &upload{header: h}
	if u.kind, err = validateUploadHeader(h, s.limits); err != nil {
		return nil, err
	}
	if err := s.admitRawSize(h); err != nil {
		return nil, err
	}
	if u.locName, u.loc, err = s.location(h.GetLocation()); err != nil {
		return nil, err
	}
	if agent, ok := auth.AgentFrom(ctx); ok {
		switch {
		case agent.Kind == agentjob.Delta || h.GetDelta() != nil:
			if u.unlockChain, err = s.admitSegment(ctx, agent, h, u.locName, u.loc); err != nil {
				return nil, err
			}
		case agent.Kind == agentjob.Kit || h.GetKit() != nil:
			if err := s.admitKit(ctx, agent, h, u.locName, u.loc); err != nil {
				return nil, err
			}
		default:
			if err := agentMay(agent, uploaderKind(agent), "upload", h.GetName(), u.locName); err != nil {
				return nil, err
			}
		}
		u.agent = agent
	} else if h.GetDelta() != nil || u.kind == ebv1.SourceDelta {
		return nil, status.Error(codes.PermissionDenied, "upload: only a target's delta agent stores delta segments")
	} else if h.GetKit() != nil || u.kind == ebv1.SourceKit {
		return nil, status.Error(codes.PermissionDenied, "upload: only a backup's kit agent stores its recovery kit")
	} else if u.kind == ebv1.SourceAgent {
		// Only an authenticated agent's backup is an agent's: a user
		// cannot make an upload look like one.
		u.kind = ebv1.SourceUpload
	}
	if u.agent == nil {
		if err := s.reservedName("upload", h.GetName()); err != nil {
			return nil, err
		}
	}
	if u.release, err = s.claim(ctx, u.locName, h.GetName(), u.agent != nil); err != nil {
		if u.unlockChain != nil {
			u.unlockChain()
		}
		return nil, err
	}
	if unlock := u.unlockChain; unlock != nil {
		release := u.release
		u.release = func() { release(); unlock() }
	}
	return u, nil
}

// uploaderKind is the kind of agent a's upload is held to: a fold
// agent stores its one new full backup as a backup agent stores its
// snapshot; any other agent is held to a backup agent's rule (and
// refused by it unless it is one).
func uploaderKind(a *auth.Agent) agentjob.Kind {
	if a.Kind == agentjob.Fold {
		return agentjob.Fold
	}
	return agentjob.Backup
}

// received is what arrived after an upload's header.
type received struct {
	size int64
	// digest is the data's SHA-256; digestErr says why there is none (a
	// plain upload that fails etcd's trailer check).
	digest    string
	digestErr error
	// head is the first bytes, to check that data declared encrypted is
	// an age file.
	head    []byte
	trailer *ebv1.UploadTrailer
}

// receiveUpload writes the chunks that follow the header to up, hashing
// them as they pass, until the client closes its side; it refuses
// messages out of order, oversized chunks and more data than declared.
func (s *Service) receiveUpload(ctx context.Context, u *upload, recv func() (*ebv1.UploadBackupRequest, error), up storage.Upload) (*received, error) {
	sum, digestOf := uploadHash(u.header)
	w := io.MultiWriter(up, sum)
	r := &received{head: make([]byte, 0, len(crypt.Magic))}
	for {
		msg, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, s.uploadBroken(ctx, u, r.size, err)
		}
		if err := r.take(msg, u.header); err != nil {
			return nil, err
		}
		if err := s.checkStoredSize(u.header, r.size); err != nil {
			return nil, err
		}
		if msg.GetTrailer() != nil {
			continue
		}
		chunk := msg.GetChunk()
		if _, err := w.Write(chunk); err != nil {
			return nil, edge.StorageStatus("upload", u.locName, u.name(), err)
		}
		s.metrics.BytesIn.Add(float64(len(chunk)))
		// Stored and hashed: nothing holds the bytes any more.
		stream.ReleaseUploadChunk(chunk)
	}
	r.digest, r.digestErr = digestOf()
	return r, nil
}

// uploadHash is what hashes an upload's data as it arrives. A snapshot
// stored as is carries etcd's own SHA-256 in its last 32 bytes: the
// server checks that, with the same single hash pass that gives what it
// stores, so an agent need not hash at all, what is stored is what etcd
// wrote, and no upload stores a file that is not a snapshot. Compressed
// or encrypted data is hashed plainly: its sender checked the trailer
// before transforming it.
func uploadHash(h *ebv1.UploadHeader) (sum io.Writer, digestOf func() (string, error)) {
	if h.GetCompression() == ebv1.CompressionNone && h.GetEncryption() == ebv1.EncryptionNone && h.GetDelta() == nil {
		check := snapshot.NewTrailerCheck()
		return check, check.Finish
	}
	plain := sha256.New()
	return plain, func() (string, error) { return hex.EncodeToString(plain.Sum(nil)), nil }
}

// uploadBroken is the error of an upload whose stream ended before the
// client closed it: idle too long, cancelled, or broken.
func (s *Service) uploadBroken(ctx context.Context, u *upload, size int64, err error) error {
	if errors.Is(err, errIdle) {
		s.log.Warn("upload aborted: the client sent nothing", "location", u.locName, "backup", u.name(), "received", size,
			"idle", s.limits.UploadIdleTimeout.Duration, "caller", caller(ctx))
		return status.Errorf(codes.DeadlineExceeded,
			"upload of %q: nothing arrived for %s (limits.uploadIdleTimeout) after %d bytes; the upload was aborted and nothing was stored",
			u.name(), s.limits.UploadIdleTimeout.Duration, size)
	}
	if errors.Is(err, stream.ErrTooSlow) {
		s.log.Warn("upload aborted: too slow", "location", u.locName, "backup", u.name(), "received", size,
			"minTransferRate", s.limits.MinTransferRate, "window", s.limits.MinTransferRateWindow.Duration, "caller", caller(ctx))
		return stream.TooSlow(fmt.Sprintf("upload of %q", u.name()), size, s.limits)
	}
	s.log.Warn("upload interrupted", "location", u.locName, "backup", u.name(), "received", size, "error", err)
	if ctx.Err() != nil {
		return status.Errorf(codes.Canceled, "upload of %q cancelled after %d bytes; nothing was stored", u.name(), size)
	}
	return err
}

// take checks a message after the header against the upload's rules —
// chunks, then at most one trailer, last; no second header; a chunk at
// most MaxChunkBytes and never more data than declared — and records
// it: a trailer, or a chunk's size and first bytes.
func (r *received) take(msg *ebv1.UploadBackupRequest, h *ebv1.UploadHeader) error {
	if r.trailer != nil {
		return status.Error(codes.InvalidArgument, "upload: a message arrived after the trailer; the trailer must be last")
	}
	if msg.GetHeader() != nil {
		return status.Error(codes.InvalidArgument, "upload: a second header arrived; only the first message is a header")
	}
	if t := msg.GetTrailer(); t != nil {
		if err := validateTrailer(t); err != nil {
			return err
		}
		r.trailer = t
		return nil
	}
	chunk := msg.GetChunk()
	if len(chunk) > MaxChunkBytes {
		return status.Errorf(codes.InvalidArgument, "upload: chunk of %d bytes exceeds the %d-byte limit", len(chunk), MaxChunkBytes)
	}
	r.size += int64(len(chunk))
	if len(r.head) < cap(r.head) {
		r.head = append(r.head, chunk[:min(len(chunk), cap(r.head)-len(r.head))]...)
	}
	if h.ExpectedSize != nil && r.size > h.GetExpectedSize() {
		return status.Errorf(codes.DataLoss,
			"upload of %q: more than the declared %d bytes arrived; nothing was stored", h.GetName(), h.GetExpectedSize())
	}
	return nil
}

// commitUpload checks what arrived against what was declared and
// commits the backup's manifest, which makes it exist.
func (s *Service) commitUpload(ctx context.Context, u *upload, r *received, up storage.Upload) (*storage.Manifest, error) {
	if err := s.checkReceived(ctx, u, r); err != nil {
		return nil, err
	}
	m := manifestFromHeader(u.header, u.kind, r.size, r.digest, s.now().UTC())
	if a := u.agent; a != nil {
		// The source is what the server knows, not what the agent says.
		m.Source.Kind, m.Source.Description, m.Source.Target, m.Source.ClaimedTarget = ebv1.SourceAgent, "job "+a.JobNamespace+"/"+a.JobName, a.Target, ""
		if d := u.header.GetDelta(); d != nil {
			m.Source.Kind, m.Delta = ebv1.SourceDelta, deltaFromHeader(d)
		}
		if k := u.header.GetKit(); k != nil {
			m.Source.Kind, m.Kit = ebv1.SourceKit, kitFromHeader(k, a.Backup)
		}
		if a.Scheduled {
			// A scheduled run: the server's signed Job says so, and its
			// name holds the time it was due. The labels are for `list
			// -l`; retention and the schedule read the source.
			m.Source.Scheduled = true
			m.Source.ScheduledTime, _ = schedule.TimeOf(a.Target, a.Backup)
			m.Labels = maps.Clone(m.Labels)
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels[retention.LabelScheduled], m.Labels[retention.LabelTarget] = "true", a.Target
		}
	}
	if err := s.recordRaw(u, r, m); err != nil {
		return nil, err
	}
	withSnapshotStatus(m, r.trailer.GetEtcd())
	if err := up.Commit(ctx, m); err != nil {
		return nil, edge.StorageStatus("upload", u.locName, u.name(), err)
	}
	if m.Delta != nil {
		s.segmentStored(u.locName, m)
	}
	return m, nil
}

// checkReceived holds what arrived to what was declared: a whole etcd
// snapshot when stored as is (etcd's trailer), the header's size and
// SHA-256, the trailer's size and SHA-256, and an age header when
// declared encrypted. Each mismatch is DataLoss (InvalidArgument for the
// age header).
func (s *Service) checkReceived(ctx context.Context, u *upload, r *received) error {
	h, name := u.header, u.name()
	if r.digestErr != nil {
		s.log.Warn("snapshot refused", "location", u.locName, "backup", name, "source", u.kind, "received", r.size, "error", r.digestErr, "caller", caller(ctx))
		return status.Errorf(codes.DataLoss,
			"upload of %q: the data is not a whole etcd snapshot: it fails etcd's own check (%v); nothing was stored. Upload the file `etcdutl snapshot save` or `kubectl etcdbackup download` wrote", name, r.digestErr)
	}
	if h.ExpectedSize != nil && r.size != h.GetExpectedSize() {
		return status.Errorf(codes.DataLoss,
			"upload of %q: %d bytes arrived but %d were declared; nothing was stored, upload again", name, r.size, h.GetExpectedSize())
	}
	if want := h.GetExpectedSha256(); want != "" && want != r.digest {
		return status.Errorf(codes.DataLoss,
			"upload of %q: the data that arrived has SHA-256 %s but %s was declared; nothing was stored, upload again", name, r.digest, want)
	}
	if t := r.trailer; t != nil && (t.GetSize() != r.size || (t.GetSha256() != "" && t.GetSha256() != r.digest)) {
		return status.Errorf(codes.DataLoss,
			"upload of %q: the client sent %d bytes with SHA-256 %s but %d bytes with SHA-256 %s arrived; nothing was stored, upload again",
			name, t.GetSize(), t.GetSha256(), r.size, r.digest)
	}
	if h.GetEncryption() == ebv1.EncryptionAge && !bytes.Equal(r.head, crypt.Magic) {
		return status.Errorf(codes.InvalidArgument,
			"upload of %q: declared age-encrypted, but the data does not start with an age header; nothing was stored", name)
	}
	return nil
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
// a slow storage write never counts as the client's idleness. After the
// header, the same waits are held to limits.minTransferRate
// (stream.RateWatch): an upload that keeps sending, but too little, ends
// with stream.ErrTooSlow.
//
// It receives one message ahead: the next chunk is decoded while the
// handler hashes and stores this one. After an error or io.EOF nothing
// more is received, so SendAndClose never runs beside a Recv.
func (s *Service) receiver(in ebv1.BackupService_UploadBackupServer) func() (*ebv1.UploadBackupRequest, error) {
	type result struct {
		msg *ebv1.UploadBackupRequest
		err error
	}
	start := func() chan result {
		c := make(chan result, 1)
		go func() {
			m, err := in.Recv()
			c <- result{m, err}
		}()
		return c
	}
	var next chan result
	// After the header, the chunks are held to limits.minTransferRate.
	var watch *stream.RateWatch
	return func() (*ebv1.UploadBackupRequest, error) {
		if next == nil {
			next = start()
		}
		t := time.NewTimer(s.limits.UploadIdleTimeout.Duration)
		defer t.Stop()
		var slow <-chan time.Time
		if watch != nil {
			watch.Wait()
			st := time.NewTimer(watch.Left())
			defer st.Stop()
			slow = st.C
		}
		for {
			select {
			case r := <-next:
				next = nil
				if r.err == nil {
					next = start()
				}
				if watch == nil {
					watch = stream.NewRateWatch(s.limits, s.now)
				} else if r.err == nil {
					if err := watch.Moved(len(r.msg.GetChunk())); err != nil {
						return nil, err
					}
				}
				return r.msg, r.err
			case <-t.C:
				return nil, errIdle
			case <-slow:
				if err := watch.Lapsed(); err != nil {
					return nil, err
				}
				slow = time.After(watch.Left())
			}
		}
	}
}

// claims are the upload slots in use: each location takes at most
// limits.uploadsPerLocation users' uploads and, in a pool of their own,
// limits.agentUploadsPerLocation agents' uploads. They bound what one
// replica holds (buffers, connections to the store), so each replica
// counts its own.
type claims struct {
	mu          sync.Mutex
	perLocation map[string]int // users' uploads, or "agent:location" for agents'
}

// claim marks an upload of name in loc as in progress, on every replica
// (Service.coord), so a second upload of the same name is refused at once
// instead of after its data arrived, and counts it against
// limits.uploadsPerLocation, or limits.agentUploadsPerLocation for an
// agent: users' uploads, however slow, never take the slot of a scheduled
// backup.
func (s *Service) claim(ctx context.Context, loc, name string, agent bool) (release func(), err error) {
	c := &s.uploads
	pool, most, whose, limit := loc, s.limits.UploadsPerLocation, "", "limits.uploadsPerLocation"
	if agent {
		pool, most, whose, limit = "agent:"+loc, s.limits.AgentUploadsPerLocation, "backup agents' ", "limits.agentUploadsPerLocation"
	}
	unclaim, err := s.coord.ClaimUpload(ctx, loc, name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.perLocation[pool]; n >= most {
		unclaim()
		return nil, status.Errorf(codes.ResourceExhausted,
			"%d %suploads to location %q are in progress, the most this server allows (%s); try again when one has finished", n, whose, loc, limit)
	}
	c.perLocation[pool]++
	return func() {
		c.mu.Lock()
		if c.perLocation[pool]--; c.perLocation[pool] == 0 {
			delete(c.perLocation, pool)
		}
		c.mu.Unlock()
		unclaim()
	}, nil
}
