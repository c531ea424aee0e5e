package rpc

import (
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// DownloadBackup implements ebv1.BackupServiceServer.
func (s *Service) DownloadBackup(req *ebv1.DownloadBackupRequest, stream ebv1.BackupService_DownloadBackupServer) (err error) {
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
