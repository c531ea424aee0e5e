package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/labels"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Pages of ListBackups.
const (
	DefaultPageSize = 500
	MaxPageSize     = 1000
	// maxPageBytes keeps a page well under the 4 MiB a gRPC client
	// receives by default, whatever the backups' labels.
	maxPageBytes = 2 << 20
)

// ListBackups implements ebv1.BackupServiceServer.
func (s *Server) ListBackups(ctx context.Context, req *ebv1.ListBackupsRequest) (*ebv1.ListBackupsResponse, error) {
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	sel, err := labels.Parse(req.GetLabelSelector())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "label selector %q: %v", req.GetLabelSelector(), err)
	}
	if req.GetPageSize() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "page size %d is negative", req.GetPageSize())
	}
	var after *pageToken
	if t := req.GetPageToken(); t != "" {
		if after, err = parsePageToken(t, locName, req.GetLabelSelector()); err != nil {
			return nil, err
		}
	}
	manifests, err := loc.List(ctx)
	if err != nil {
		return nil, s.metrics.StorageError("list", locName, "", err)
	}
	runs, err := s.runs(ctx, locName)
	if err != nil {
		return nil, err
	}
	resp := &ebv1.ListBackupsResponse{}
	for _, m := range manifests {
		delete(runs, m.Name)
		if sel.Matches(labels.Set(m.Labels)) {
			resp.Backups = append(resp.Backups, backupFromManifest(locName, m))
		}
	}
	for _, b := range runs {
		if sel.Matches(labels.Set(b.GetLabels())) {
			resp.Backups = append(resp.Backups, b)
		}
	}
	sort.Slice(resp.Backups, func(i, j int) bool { return listedBefore(resp.Backups[i], resp.Backups[j]) })
	return page(resp.Backups, after, locName, req)
}

// listedBefore is the order of a listing: newest first, then by name.
// Names are unique in a location, so it is total, and a page token (the
// last backup's create time and name) says where the next page starts
// even when backups were added or deleted in between.
func listedBefore(a, b *ebv1.Backup) bool {
	ta, tb := a.GetCreateTime().AsTime(), b.GetCreateTime().AsTime()
	if !ta.Equal(tb) {
		return ta.After(tb)
	}
	return a.GetName() < b.GetName()
}

// pageToken is where a page ended, and what it listed: a token is only
// good for the same listing.
type pageToken struct {
	Location string    `json:"l"`
	Selector string    `json:"s,omitempty"`
	Time     time.Time `json:"t"`
	Name     string    `json:"n"`
}

func parsePageToken(s, location, selector string) (*pageToken, error) {
	var t pageToken
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "page token is not one this server returned; list again without it")
	}
	if t.Location != location || t.Selector != selector {
		return nil, status.Errorf(codes.InvalidArgument,
			"page token is of a listing of location %q with selector %q, not of %q with %q; list again without it", t.Location, t.Selector, location, selector)
	}
	return &t, nil
}

// page returns the sorted backups after the token's, up to the request's
// page size and maxPageBytes, and a token for the rest.
func page(sorted []*ebv1.Backup, after *pageToken, location string, req *ebv1.ListBackupsRequest) (*ebv1.ListBackupsResponse, error) {
	if after != nil {
		last := &ebv1.Backup{Name: after.Name, CreateTime: timestamppb.New(after.Time)}
		sorted = sorted[sort.Search(len(sorted), func(i int) bool { return listedBefore(last, sorted[i]) }):]
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	resp := &ebv1.ListBackupsResponse{}
	total := 0
	for _, b := range sorted {
		n := proto.Size(b)
		if len(resp.Backups) == size || (len(resp.Backups) > 0 && total+n > maxPageBytes) {
			break
		}
		resp.Backups = append(resp.Backups, b)
		total += n
	}
	if len(resp.Backups) < len(sorted) {
		last := resp.Backups[len(resp.Backups)-1]
		b, err := json.Marshal(pageToken{Location: location, Selector: req.GetLabelSelector(), Time: last.GetCreateTime().AsTime(), Name: last.GetName()})
		if err != nil {
			return nil, status.Errorf(codes.Internal, "page token: %v", err)
		}
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString(b)
	}
	return resp, nil
}

// GetBackup implements ebv1.BackupServiceServer.
func (s *Server) GetBackup(ctx context.Context, req *ebv1.GetBackupRequest) (*ebv1.GetBackupResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	m, err := loc.Stat(ctx, req.GetName())
	if errors.Is(err, storage.ErrNotFound) {
		if b := s.run(ctx, locName, req.GetName()); b != nil {
			return &ebv1.GetBackupResponse{Backup: b}, nil
		}
	}
	if err != nil {
		return nil, s.metrics.StorageError("get", locName, req.GetName(), err)
	}
	return &ebv1.GetBackupResponse{Backup: backupFromManifest(locName, m)}, nil
}

// DeleteBackup implements ebv1.BackupServiceServer.
func (s *Server) DeleteBackup(ctx context.Context, req *ebv1.DeleteBackupRequest) (*ebv1.DeleteBackupResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	if err := s.checkNoRestoreReads(ctx, locName, req.GetName()); err != nil {
		return nil, err
	}
	if err := loc.Delete(ctx, req.GetName()); err != nil {
		return nil, s.metrics.StorageError("delete", locName, req.GetName(), err)
	}
	s.log.Info("backup deleted", "location", locName, "backup", req.GetName(), "caller", caller(ctx))
	return &ebv1.DeleteBackupResponse{}, nil
}

// UploadBackup implements ebv1.BackupServiceServer.
func (s *Server) UploadBackup(stream ebv1.BackupService_UploadBackupServer) (err error) {
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
func (s *Server) receiver(stream ebv1.BackupService_UploadBackupServer) func() (*ebv1.UploadBackupRequest, error) {
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

// agentMay holds an agent to the one backup its Job was created for.
func agentMay(a *auth.Agent, kind, verb, name, location string) error {
	if a.Kind != kind {
		return status.Errorf(codes.PermissionDenied, "%s may not %s: only %s agents may", a, verb, kind)
	}
	if a.Backup != name || a.Location != location {
		return status.Errorf(codes.PermissionDenied,
			"%s may %s only backup %q in location %q, not %q in location %q", a, verb, a.Backup, a.Location, name, location)
	}
	return nil
}

// checkNoRestoreReads refuses to delete a backup a running restore Job
// reads: its agent would find it gone, or, if it were uploaded again,
// not the content the restore was started for.
func (s *Server) checkNoRestoreReads(ctx context.Context, locName, name string) error {
	running, err := s.inUse.RestoresReading(ctx, locName, name, "deleting")
	if err != nil {
		return err
	}
	if len(running) > 0 {
		ns, job, _ := strings.Cut(running[0], "/")
		return status.Errorf(codes.FailedPrecondition,
			"backup %q in location %q is being restored by Job %s; wait for the restore to finish, or abandon it with `kubectl -n %s delete job %s`, then delete the backup",
			name, locName, strings.Join(running, ", "), ns, job)
	}
	return nil
}

// run returns the agent run of a backup that is not stored, or nil.
func (s *Server) run(ctx context.Context, locName, name string) *ebv1.Backup {
	runs, err := s.runs(ctx, locName)
	if err != nil {
		return nil
	}
	return runs[name]
}

func validateUploadHeader(h *ebv1.UploadHeader, lim config.Limits) (kind string, err error) {
	if err := validateName("backup", h.GetName()); err != nil {
		return "", err
	}
	if h.ExpectedSize != nil && h.GetExpectedSize() < 0 {
		return "", status.Errorf(codes.InvalidArgument, "expected size %d is negative", h.GetExpectedSize())
	}
	for _, err := range []error{
		validateSHA256("expected SHA-256", h.GetExpectedSha256()),
		validateSHA256("raw SHA-256", h.GetRawSha256()),
		validateLabels(h.GetLabels(), lim),
		validateCompression(h.GetCompression()),
		validateEncryption(h.GetEncryption(), h.GetAgeRecipients()),
		validateField("source description", h.GetSource().GetDescription(), lim),
		validateField("source target", h.GetSource().GetTarget(), lim),
		validateField("etcd member name", h.GetEtcd().GetMemberName(), lim),
		validateField("etcd version", h.GetEtcd().GetVersion(), lim),
		checkf(h.GetRawSize() >= 0, "raw size %d is negative", h.GetRawSize()),
		validateEtcdFacts("header", h.GetEtcd()),
	} {
		if err != nil {
			return "", err
		}
	}
	return validateSourceKind(h.GetSource().GetKind())
}

// DownloadBackup implements ebv1.BackupServiceServer.
func (s *Server) DownloadBackup(req *ebv1.DownloadBackupRequest, stream ebv1.BackupService_DownloadBackupServer) (err error) {
	ctx := stream.Context()
	start := s.now()
	if err := validateName("backup", req.GetName()); err != nil {
		return err
	}
	if req.GetOffset() < 0 {
		return status.Errorf(codes.InvalidArgument, "offset %d is negative", req.GetOffset())
	}
	if req.GetLength() < 0 {
		return status.Errorf(codes.InvalidArgument, "length %d is negative; 0 asks for everything from the offset to the end", req.GetLength())
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return err
	}
	agent, isAgent := auth.AgentFrom(ctx)
	if isAgent {
		if err := agentMay(agent, auth.AgentRestore, "download", req.GetName(), locName); err != nil {
			return err
		}
	}
	m, err := loc.Stat(ctx, req.GetName())
	if errors.Is(err, storage.ErrNotFound) {
		if b := s.run(ctx, locName, req.GetName()); b != nil {
			return status.Errorf(codes.FailedPrecondition, "backup %q is %s, not stored: %s", req.GetName(),
				map[bool]string{true: "still being taken", false: "failed"}[b.GetPhase() == ebv1.BackupPhase_BACKUP_PHASE_RUNNING], b.GetMessage())
		}
	}
	if err != nil {
		return s.metrics.StorageError("download", locName, req.GetName(), err)
	}
	if req.GetOffset() > m.Size {
		return status.Errorf(codes.OutOfRange,
			"offset %d is past the end of backup %q (%d bytes); a partial download larger than the backup is not of this backup: delete it and download again",
			req.GetOffset(), req.GetName(), m.Size)
	}
	done, err := s.inUse.Download(locName, req.GetName())
	if err != nil {
		return err
	}
	defer done()
	s.metrics.InFlight.WithLabelValues("download").Inc()
	defer s.metrics.InFlight.WithLabelValues("download").Dec()
	defer func() { s.metrics.ObserveTransfer("download", start, err) }()
	// The store cuts a length past the end (a parallel download's last
	// range asks for whatever is left); what is sent is measured on the
	// manifest Open returned, as everything below is.
	r, m, err := loc.Open(ctx, req.GetName(), req.GetOffset(), req.GetLength())
	if err != nil {
		return s.metrics.StorageError("download", locName, req.GetName(), err)
	}
	defer r.Close()
	end := m.Size
	if req.GetLength() > 0 {
		end = min(m.Size, req.GetOffset()+req.GetLength())
	}
	// Checked on what Open returned: that is what is sent.
	if isAgent && m.SHA256 != agent.SHA256 {
		return status.Errorf(codes.PermissionDenied,
			"%s was started for backup %q with SHA-256 %s, but the stored backup has SHA-256 %s (replaced under the same name?); start the restore again",
			agent, req.GetName(), agent.SHA256, m.SHA256)
	}
	// Every backup holds every Secret of its cluster: say who read it.
	s.log.Info("backup download", "location", locName, "backup", req.GetName(), "offset", req.GetOffset(), "length", end-req.GetOffset(), "caller", caller(ctx))

	if err := stream.Send(&ebv1.DownloadBackupResponse{Msg: &ebv1.DownloadBackupResponse_Header{Header: &ebv1.DownloadHeader{
		Backup: backupFromManifest(locName, m),
		Offset: req.GetOffset(),
		Length: end - req.GetOffset(),
	}}}); err != nil {
		return err
	}
	// Each chunk is read into a pooled buffer and handed to the transport
	// as it is (chunkCodec), which returns it to the pool once written;
	// gRPC's per-stream write quota bounds how many are queued.
	pool := chunkBuffers
	sent := req.GetOffset()
	for sent < end {
		bp := pool.Get(int(min(downloadChunkBytes, end-sent)))
		n, rerr := io.ReadFull(r, *bp)
		if n > 0 {
			*bp = (*bp)[:n]
			chunk := mem.NewBuffer(bp, pool)
			err := stream.SendMsg(&chunkOut{data: chunk})
			chunk.Free()
			if err != nil {
				return err
			}
			sent += int64(n)
			s.metrics.BytesOut.Add(float64(n))
		} else {
			pool.Put(bp)
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
				return status.Errorf(codes.DataLoss,
					"backup %q in location %q is truncated: its manifest says %d bytes but the data ends at %d", req.GetName(), locName, m.Size, sent)
			}
			return s.metrics.StorageError("download", locName, req.GetName(), rerr)
		}
	}
	return nil
}

func manifestFromHeader(h *ebv1.UploadHeader, kind string, size int64, digest string, now time.Time) *storage.Manifest {
	m := &storage.Manifest{
		Name:        h.GetName(),
		Size:        size,
		SHA256:      digest,
		CreateTime:  now,
		Labels:      h.GetLabels(),
		Compression: h.GetCompression(),
		RawSize:     h.GetRawSize(),
		RawSHA256:   h.GetRawSha256(),
		Encryption:  h.GetEncryption(),
		Source: storage.Source{
			Kind:        kind,
			Description: h.GetSource().GetDescription(),
			Target:      h.GetSource().GetTarget(),
		},
	}
	if m.Encryption != "" {
		m.AgeRecipients = h.GetAgeRecipients()
	}
	if m.Compression == "" && m.Encryption == "" {
		m.RawSize, m.RawSHA256 = size, digest
	}
	if t := h.GetSource().GetStartTime(); t != nil {
		m.Source.StartTime = t.AsTime()
	}
	if t := h.GetSource().GetEndTime(); t != nil {
		m.Source.EndTime = t.AsTime()
	}
	if e := h.GetEtcd(); e != nil {
		m.Etcd = &storage.EtcdInfo{
			ClusterID:      e.GetClusterId(),
			MemberID:       e.GetMemberId(),
			MemberName:     e.GetMemberName(),
			Revision:       e.GetRevision(),
			Version:        e.GetVersion(),
			DBSize:         e.GetDbSize(),
			TotalKeys:      e.GetTotalKeys(),
			Hash:           e.GetHash(),
			SnapshotStatus: e.GetSnapshotStatus(),
		}
	}
	return m
}

// withSnapshotStatus records in m what the sender read from the plain
// snapshot once it had all of it (the trailer's etcd facts), over the
// header's.
func withSnapshotStatus(m *storage.Manifest, e *ebv1.EtcdInfo) {
	if !e.GetSnapshotStatus() {
		return
	}
	if m.Etcd == nil {
		m.Etcd = &storage.EtcdInfo{}
	}
	m.Etcd.Revision, m.Etcd.TotalKeys, m.Etcd.Hash, m.Etcd.SnapshotStatus = e.GetRevision(), e.GetTotalKeys(), e.GetHash(), true
}

func backupFromManifest(loc string, m *storage.Manifest) *ebv1.Backup {
	b := &ebv1.Backup{
		Name:          m.Name,
		Location:      loc,
		Phase:         ebv1.BackupPhase_BACKUP_PHASE_COMPLETED,
		Size:          m.Size,
		Sha256:        m.SHA256,
		CreateTime:    timestamppb.New(m.CreateTime),
		Labels:        m.Labels,
		Compression:   m.Compression,
		RawSize:       m.RawSize,
		RawSha256:     m.RawSHA256,
		Encryption:    m.Encryption,
		AgeRecipients: m.AgeRecipients,
		Source: &ebv1.BackupSource{
			Kind:        m.Source.Kind,
			Description: m.Source.Description,
			Target:      m.Source.Target,
		},
	}
	if !m.Source.StartTime.IsZero() {
		b.Source.StartTime = timestamppb.New(m.Source.StartTime)
	}
	if !m.Source.EndTime.IsZero() {
		b.Source.EndTime = timestamppb.New(m.Source.EndTime)
	}
	if e := m.Etcd; e != nil {
		b.Etcd = &ebv1.EtcdInfo{
			ClusterId:      e.ClusterID,
			MemberId:       e.MemberID,
			MemberName:     e.MemberName,
			Revision:       e.Revision,
			Version:        e.Version,
			DbSize:         e.DBSize,
			TotalKeys:      e.TotalKeys,
			Hash:           e.Hash,
			SnapshotStatus: e.SnapshotStatus,
		}
	}
	return b
}
