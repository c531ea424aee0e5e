package readpath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/stream"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// DownloadBackup implements ebv1.BackupServiceServer: admit the request
// (its range, the caller's right to the backup, the backup stored),
// register the download so retention keeps the backup, open the range,
// then send a header and the range's chunks.
func (s *Service) DownloadBackup(req *ebv1.DownloadBackupRequest, out ebv1.BackupService_DownloadBackupServer) (err error) {
	ctx := out.Context()
	start := s.now()
	d, err := s.admitDownload(ctx, req)
	if err != nil {
		return err
	}
	if sending := s.hooks.Sending; sending != nil {
		done, err := sending(ctx, d.locName, req.GetName())
		if err != nil {
			return err
		}
		defer done()
	}
	s.metrics.InFlight.WithLabelValues("download").Inc()
	defer s.metrics.InFlight.WithLabelValues("download").Dec()
	defer func() { s.metrics.ObserveTransfer("download", start, err) }()
	// The store cuts a length past the end (a parallel download's last
	// range asks for whatever is left); what is sent is measured on the
	// manifest Open returned, as everything below is.
	r, m, err := d.loc.Open(ctx, req.GetName(), req.GetOffset(), req.GetLength())
	if err != nil && d.copyOf == "" && readFromCopy(err) {
		// Listed, but its bytes are gone (or the store stopped answering
		// since): a copy of the same bytes serves as well.
		if cl, cm := s.fromCopy(ctx, d.locName, d.name, d.sha); cl != nil {
			s.log.Warn("backup download: reading a copy", "location", d.locName, "backup", d.name, "copy", cl.Name, "error", err)
			d.copyOf, d.locName, d.loc = d.locName, cl.Name, cl
			r, m, err = cl.Open(ctx, req.GetName(), req.GetOffset(), req.GetLength())
			if err == nil && m.SHA256 != cm.SHA256 {
				r.Close()
				err = fmt.Errorf("the copy of %q in location %q changed while it was opened", d.name, cl.Name)
			}
		}
	}
	if err != nil {
		return edge.StorageStatus("download", d.locName, req.GetName(), err)
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
	if p := d.pin; p != nil && m.SHA256 != p.SHA256 {
		return status.Errorf(codes.PermissionDenied,
			"%s was started for %q with another SHA-256 than the stored one has (replaced under the same name?); start the restore again",
			p.Who, req.GetName())
	}
	// Every backup holds every Secret of its cluster: say who read it.
	who := s.caller(ctx)
	s.log.Info("backup download", "location", d.locName, "backup", req.GetName(), "offset", req.GetOffset(), "length", end-req.GetOffset(), "caller", who, "copyOf", d.copyOf)
	if s.reads.first(who, d.locName, req.GetName(), m.SHA256, s.now()) {
		d.loc.Note(ctx, s.log, ledger.Entry{Action: s.readAction(), Backup: req.GetName(), SHA256: m.SHA256, Who: who,
			Detail: fmt.Sprintf("bytes %d-%d of %d", req.GetOffset(), end, m.Size)})
	}

	if err := out.Send(&ebv1.DownloadBackupResponse{Msg: &ebv1.DownloadBackupResponse_Header{Header: &ebv1.DownloadHeader{
		Backup: edge.Backup(d.locName, m),
		Offset: req.GetOffset(),
		Length: end - req.GetOffset(),
	}}}); err != nil {
		return err
	}
	sending = true
	return s.sendWatched(ctx, out, d, req.GetOffset(), func(w *sendWatch) error {
		defer r.Close()
		return s.sendChunks(w, r, d, m.Size, req.GetOffset(), end)
	})
}

// download is an admitted download: where the backup is, and the one
// content its caller may read, if it is pinned to one.
type download struct {
	name    string
	locName string
	loc     *domain.Location
	pin     *Pin
	// sha is the stored SHA-256 admitDownload found.
	sha string
	// copyOf is set when the backup is read from a copy: the location
	// asked for, which could not serve it.
	copyOf string
}

// readFromCopy says whether a read that failed with err may be served
// from a copy: the backup (or its bytes) is not in the location, or the
// location cannot be reached.
func readFromCopy(err error) bool {
	var ue *locations.UnavailableError
	return errors.Is(err, storage.ErrNotFound) || errors.As(err, &ue)
}

// admitDownload checks a download request: its name and range, its
// location, that its caller may read the backup (Hooks.MayDownload: an
// agent asks only for the backup it restores, or a delta segment its Job
// lists), and that the backup is stored (not still being taken, nor
// failed) and has the offset.
func (s *Service) admitDownload(ctx context.Context, req *ebv1.DownloadBackupRequest) (*download, error) {
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetOffset() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "offset %d is negative", req.GetOffset())
	}
	if req.GetLength() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "length %d is negative; 0 asks for everything from the offset to the end", req.GetLength())
	}
	d := &download{name: req.GetName()}
	l, err := s.locations.Get(req.GetLocation())
	var ue *locations.UnavailableError
	switch {
	case errors.As(err, &ue):
		// Its copies may serve it (below).
		l, _ = s.locations.Lookup(ue.Location)
	case err != nil:
		return nil, edge.Status("", err)
	}
	d.locName, d.loc = l.Name, l
	if may := s.hooks.MayDownload; may != nil {
		if d.pin, err = may(ctx, req.GetName(), d.locName); err != nil {
			return nil, err
		}
	}
	var m *storage.Manifest
	if ue == nil {
		m, err = d.loc.Stat(ctx, req.GetName())
	} else {
		err = ue
	}
	if errors.Is(err, storage.ErrNotFound) {
		if b := s.run(ctx, d.locName, req.GetName()); b != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "backup %q is %s, not stored: %s", req.GetName(),
				map[bool]string{true: "still being taken", false: "failed"}[b.GetPhase() == ebv1.BackupPhase_BACKUP_PHASE_RUNNING], b.GetMessage())
		}
	}
	if err != nil && readFromCopy(err) {
		var pinned string
		if d.pin != nil {
			pinned = d.pin.SHA256
		}
		if cl, cm := s.fromCopy(ctx, d.locName, req.GetName(), pinned); cl != nil {
			s.log.Warn("backup download: reading a copy", "location", d.locName, "backup", req.GetName(), "copy", cl.Name, "error", err)
			d.copyOf, d.locName, d.loc, m, err = d.locName, cl.Name, cl, cm, nil
		}
	}
	if err != nil {
		return nil, edge.StorageStatus("download", d.locName, req.GetName(), err)
	}
	d.sha = m.SHA256
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
func (s *Service) sendChunks(out interface{ SendMsg(any) error }, r io.Reader, d *download, size, sent, end int64) error {
	pool := stream.ChunkBuffers
	for sent < end {
		bp := pool.Get(int(min(stream.DownloadChunkBytes, end-sent)))
		n, rerr := io.ReadFull(r, *bp)
		if n > 0 {
			*bp = (*bp)[:n]
			chunk := mem.NewBuffer(bp, pool)
			err := out.SendMsg(&stream.ChunkOut{Data: chunk})
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
			return edge.StorageStatus("download", d.locName, d.name, rerr)
		}
	}
	return nil
}

// sendWatch is a download stream whose sends are held to
// limits.minTransferRate: the time each SendMsg waits is the client's
// (gRPC's flow control blocks it while the client does not read).
type sendWatch struct {
	out     interface{ SendMsg(any) error }
	mu      sync.Mutex
	watch   *stream.RateWatch
	waiting bool
	sent    int64
	// kick tells sendWatched that a wait started or ended.
	kick chan struct{}
}

// SendMsg sends m, timing the wait.
func (w *sendWatch) SendMsg(m any) error {
	n := 0
	if c, ok := m.(*stream.ChunkOut); ok {
		n = c.Data.Len()
	}
	w.mu.Lock()
	w.waiting = true
	w.watch.Wait()
	w.mu.Unlock()
	w.poke()
	err := w.out.SendMsg(m)
	w.mu.Lock()
	w.waiting = false
	if err == nil {
		w.sent += int64(n)
		if werr := w.watch.Moved(n); werr != nil {
			err = werr
		}
	}
	w.mu.Unlock()
	w.poke()
	return err
}

func (w *sendWatch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// sendWatched runs send, a download's sending of its chunks, on a
// goroutine of its own and ends the download with ResourceExhausted when
// its client reads slower than limits.minTransferRate. A send blocked on
// a client that reads nothing can only be ended by the stream's end:
// this handler returns, and gRPC cancels the stream, which ends the
// blocked send and the goroutine with it.
func (s *Service) sendWatched(ctx context.Context, out interface{ SendMsg(any) error }, d *download, offset int64, send func(*sendWatch) error) error {
	w := &sendWatch{out: out, watch: stream.NewRateWatch(s.limits, s.now), kick: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- send(w) }()
	slow := func() error {
		w.mu.Lock()
		sent := w.sent
		w.mu.Unlock()
		s.log.Warn("download aborted: too slow", "location", d.locName, "backup", d.name, "offset", offset, "sent", sent,
			"minTransferRate", s.limits.MinTransferRate, "window", s.limits.MinTransferRateWindow.Duration, "caller", s.caller(ctx))
		return stream.TooSlow(fmt.Sprintf("download of %q from byte %d", d.name, offset), sent, s.limits)
	}
	for {
		w.mu.Lock()
		var timeout <-chan time.Time
		var t *time.Timer
		if w.waiting {
			t = time.NewTimer(w.watch.Left())
			timeout = t.C
		}
		w.mu.Unlock()
		select {
		case err := <-done:
			if t != nil {
				t.Stop()
			}
			if errors.Is(err, stream.ErrTooSlow) {
				return slow()
			}
			return err
		case <-w.kick:
		case <-s.handoff:
			w.mu.Lock()
			sent := w.sent
			w.mu.Unlock()
			s.log.Info("download handed off: this replica is shutting down, the client resumes on another",
				"location", d.locName, "backup", d.name, "offset", offset, "sent", sent, "caller", s.caller(ctx))
			return ebv1.ServerErrorf(codes.Unavailable,
				"this server replica is shutting down after %d bytes of %q from byte %d; resume the download on another replica", sent, d.name, offset)
		case <-timeout:
			w.mu.Lock()
			var err error
			if w.waiting {
				err = w.watch.Lapsed()
			}
			w.mu.Unlock()
			if err != nil {
				return slow()
			}
		}
		if t != nil {
			t.Stop()
		}
	}
}

// readWindow is how long a caller's reads of one backup count as one
// read in the ledger: a parallel download is many ranged calls (one per
// 32 MiB piece), a resumed one more; an entry each would bury the
// ledger's other entries.
const readWindow = 10 * time.Minute

// recentReads remembers, per caller and backup, when a read was last
// recorded, so that the ledger has an entry per read, not per call.
type recentReads struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// first says whether a read of backup (its content sha256) in location
// by who at now is the first in readWindow, and remembers it.
func (r *recentReads) first(who, location, backup, sha256 string, now time.Time) bool {
	key := who + "\x00" + location + "\x00" + backup + "\x00" + sha256
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	if t, ok := r.last[key]; ok && now.Sub(t) < readWindow {
		return false
	}
	if len(r.last) >= 4096 {
		for k, t := range r.last {
			if now.Sub(t) >= readWindow {
				delete(r.last, k)
			}
		}
	}
	r.last[key] = now
	return true
}
