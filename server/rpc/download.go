package rpc

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// DownloadBackup implements ebv1.BackupServiceServer: admit the request
// (its range, the caller's right to the backup, the backup stored),
// register the download so retention keeps the backup, open the range,
// then send a header and the range's chunks.
func (s *Service) DownloadBackup(req *ebv1.DownloadBackupRequest, stream ebv1.BackupService_DownloadBackupServer) (err error) {
	ctx := stream.Context()
	start := s.now()
	d, err := s.admitDownload(ctx, req)
	if err != nil {
		return err
	}
	done, err := s.inUse.Download(ctx, d.locName, req.GetName())
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
	r, m, err := d.loc.Open(ctx, req.GetName(), req.GetOffset(), req.GetLength())
	if err != nil {
		return storageStatus("download", d.locName, req.GetName(), err)
	}
	// The sending goroutine closes r once it has started (sendWatched).
	sending := false
	defer func() {
		if !sending {
			r.Close()
		}
	}()
	end := m.Size
	if req.GetLength() > 0 {
		end = min(m.Size, req.GetOffset()+req.GetLength())
	}
	// Checked on what Open returned: that is what is sent. The hashes
	// are not named: the agent logs the refusal.
	if a := d.agent; a != nil && m.SHA256 != d.sha256 {
		return status.Errorf(codes.PermissionDenied,
			"%s was started for %q with another SHA-256 than the stored one has (replaced under the same name?); start the restore again",
			a, req.GetName())
	}
	// Every backup holds every Secret of its cluster: say who read it.
	s.log.Info("backup download", "location", d.locName, "backup", req.GetName(), "offset", req.GetOffset(), "length", end-req.GetOffset(), "caller", caller(ctx))

	if err := stream.Send(&ebv1.DownloadBackupResponse{Msg: &ebv1.DownloadBackupResponse_Header{Header: &ebv1.DownloadHeader{
		Backup: backupFromManifest(d.locName, m),
		Offset: req.GetOffset(),
		Length: end - req.GetOffset(),
	}}}); err != nil {
		return err
	}
	sending = true
	return s.sendWatched(ctx, stream, d, req.GetOffset(), func(w *sendWatch) error {
		defer r.Close()
		return s.sendChunks(w, r, d, m.Size, req.GetOffset(), end)
	})
}

// download is an admitted download: where the backup is, and the agent
// asking for it, if an agent is.
type download struct {
	name    string
	locName string
	loc     storage.Location
	agent   *auth.Agent
	// sha256 is the content the agent may read under the name: its
	// backup's, or a delta segment's its Job lists.
	sha256 string
}

// admitDownload checks a download request: its name and range, its
// location, that an agent asks only for the backup it restores (or a
// delta segment its Job lists), and that
// the backup is stored (not still being taken, nor failed) and has the
// offset.
func (s *Service) admitDownload(ctx context.Context, req *ebv1.DownloadBackupRequest) (*download, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetOffset() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "offset %d is negative", req.GetOffset())
	}
	if req.GetLength() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "length %d is negative; 0 asks for everything from the offset to the end", req.GetLength())
	}
	d := &download{name: req.GetName()}
	var err error
	if d.locName, d.loc, err = s.location(req.GetLocation()); err != nil {
		return nil, err
	}
	if agent, ok := auth.AgentFrom(ctx); ok {
		if d.sha256, err = agent.MayDownload(req.GetName(), d.locName); err != nil {
			return nil, err
		}
		d.agent = agent
	}
	m, err := d.loc.Stat(ctx, req.GetName())
	if errors.Is(err, storage.ErrNotFound) {
		if b := s.run(ctx, d.locName, req.GetName()); b != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "backup %q is %s, not stored: %s", req.GetName(),
				map[bool]string{true: "still being taken", false: "failed"}[b.GetPhase() == ebv1.BackupPhase_BACKUP_PHASE_RUNNING], b.GetMessage())
		}
	}
	if err != nil {
		return nil, storageStatus("download", d.locName, req.GetName(), err)
	}
	if req.GetOffset() > m.Size {
		return nil, status.Errorf(codes.OutOfRange,
			"offset %d is past the end of backup %q (%d bytes); a partial download larger than the backup is not of this backup: delete it and download again",
			req.GetOffset(), req.GetName(), m.Size)
	}
	return d, nil
}

// sendChunks sends r's bytes from offset sent to end as chunks. Each is
// read into a pooled buffer and handed to the transport as it is
// (chunkCodec), which returns it to the pool once written; gRPC's
// per-stream write quota bounds how many are queued. Data ending before
// end is DataLoss: the stored data is shorter than the size its manifest
// records.
func (s *Service) sendChunks(stream interface{ SendMsg(any) error }, r io.Reader, d *download, size, sent, end int64) error {
	pool := chunkBuffers
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
					"backup %q in location %q is truncated: its manifest says %d bytes but the data ends at %d", d.name, d.locName, size, sent)
			}
			return storageStatus("download", d.locName, d.name, rerr)
		}
	}
	return nil
}
