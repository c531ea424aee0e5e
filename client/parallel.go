package client

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// ParallelAbove is the size above which AutoParallel splits a download:
// below it, opening more streams costs more than it saves.
const ParallelAbove = 64 << 20

// AutoParallel is the number of streams a download of size bytes uses
// when the user did not choose: one for small backups, four above
// ParallelAbove (a single port-forward stream is limited by the API
// server and the kubelet; four fill what a laptop's link usually has).
func AutoParallel(size int64) int {
	if size <= ParallelAbove {
		return 1
	}
	return 4
}

// PieceBytes is the size of the ranges a parallel download fetches from a
// server that takes lengths: the streams take them in file order, one
// after the other, so the in-order hash of the whole file trails the
// slowest stream by at most a few pieces, where with one range per stream
// three quarters of the file would be left to hash after the last byte.
// Each piece costs one request (the server's lookup and open, a round
// trip); 32 MiB keeps that well under 1 % of a piece's time.
const PieceBytes = 32 << 20

// RangesSuffix is appended to the .part file's name for the file that
// records how far each range of an interrupted parallel download got.
const RangesSuffix = ".ranges"

// Connector opens another connection to the server, for one range of a
// parallel download (each over its own port-forward); close releases it.
type Connector func(ctx context.Context) (c *Client, close func(), err error)

// byteRange is one range of a parallel download: bytes [Start, Reached)
// are in the .part file, [Reached, End) are still to come.
type byteRange struct {
	Start, Reached, End int64
}

// rangesFile is the .part.ranges sidecar of an interrupted parallel
// download: which backup it is and how far each range got.
type rangesFile struct {
	Size   int64       `json:"size"`
	SHA256 string      `json:"sha256"`
	Ranges []byteRange `json:"ranges"`
}

// parallelDownload is the state shared by the ranges and the hasher.
type parallelDownload struct {
	f      *os.File
	backup *ebv1.Backup
	size   int64
	// side is the .part.ranges file that records the ranges.
	side string

	mu       sync.Mutex
	cond     *sync.Cond // signalled when a range advances or fails
	ranges   []byteRange
	next     int // the first range no stream has taken
	failed   bool
	progress func(int64)
}

// downloadParallel writes the backup into f (the .part file, have bytes
// of it already there) over d.Parallel streams, each fetching one range
// and writing it in place, and hashes the file in order as the ranges
// fill it. An interrupted download records its ranges in part+.ranges,
// which the next run continues from.
func (c *Client) downloadParallel(ctx context.Context, f *os.File, part string, have int64, d FileDownload) (*ebv1.Backup, error) {
	req := d.DownloadRequest
	side := part + RangesSuffix
	saved, err := readRangesFile(side, part)
	if err != nil {
		return nil, err
	}
	piece := d.PieceBytes
	if piece <= 0 {
		piece = PieceBytes
	}
	// The first stream starts where the first range to fetch has got to
	// and brings the backup's size and SHA-256; that range continues it.
	first, ask := saved.firstToFetch(have, piece)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b, carries, stream, err := c.openDownload(ctx, req, first, -1, ask)
	if err != nil {
		return b, err
	}
	if saved != nil && (saved.Size != b.GetSize() || saved.SHA256 != b.GetSha256()) {
		os.Remove(side)
		return b, changedError(req.Name, &ebv1.Backup{Size: saved.Size, Sha256: saved.SHA256}, b)
	}
	if req.OnHeader != nil {
		if err := req.OnHeader(b); err != nil {
			return b, err
		}
	}
	p := &parallelDownload{f: f, backup: b, size: b.GetSize(), side: side, progress: req.Progress}
	p.cond = sync.NewCond(&p.mu)
	switch {
	case saved != nil:
		p.ranges = saved.Ranges
		if d.OnResume != nil {
			d.OnResume(part, p.present())
		}
	case carries > 0:
		p.ranges = splitPieces(have, b.GetSize(), piece)
	default:
		// A server older than lengths sends every stream to the end: one
		// range per stream, each cancelled at its end.
		p.ranges = splitRanges(have, b.GetSize(), d.Parallel)
	}
	if err := p.record(); err != nil {
		return b, err
	}
	sum, err := c.fetchAll(ctx, cancel, p, first, stream, d)
	if err != nil {
		if rerr := p.record(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return b, err
	}
	if got := hex.EncodeToString(sum); got != b.GetSha256() {
		os.Remove(side)
		return b, fmt.Errorf("download %q: %w: got %s, want %s", req.Name, ErrCorrupt, got, b.GetSha256())
	}
	if err := os.Remove(side); err != nil {
		return b, err
	}
	return b, nil
}

// readRangesFile reads the record side of an interrupted parallel
// download of part; nil if there is none.
func readRangesFile(side, part string) (*rangesFile, error) {
	buf, err := os.ReadFile(side)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	saved := new(rangesFile)
	if err := json.Unmarshal(buf, saved); err != nil || !validRanges(saved) {
		return nil, fmt.Errorf("%s is not a record of ranges (%v); remove it and %s to download again", side, err, part)
	}
	return saved, nil
}

// firstToFetch is where the first stream of a download starts and how
// much it asks for: a piece after the have bytes present without a
// record (r nil), else what the first unfinished range of the record
// lacks. A server that sends only that takes lengths, and the rest is
// split into pieces.
func (r *rangesFile) firstToFetch(have, piece int64) (first, ask int64) {
	if r == nil {
		return have, piece
	}
	for _, br := range r.Ranges {
		if br.Reached < br.End {
			return br.Reached, br.End - br.Reached
		}
	}
	return r.Size, piece
}

// record writes how far each range got to p.side.
func (p *parallelDownload) record() error {
	p.mu.Lock()
	buf, err := json.Marshal(rangesFile{Size: p.backup.GetSize(), SHA256: p.backup.GetSha256(), Ranges: p.ranges})
	p.mu.Unlock()
	if err == nil {
		err = os.WriteFile(p.side, buf, 0o600)
	}
	if err != nil {
		return fmt.Errorf("record ranges in %s: %w", p.side, err)
	}
	return nil
}

// take hands out the next range still to fetch, in file order.
func (p *parallelDownload) take() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.next < len(p.ranges) && p.ranges[p.next].Reached == p.ranges[p.next].End {
		p.next++
	}
	if p.next == len(p.ranges) {
		return 0, false
	}
	p.next++
	return p.next - 1, true
}

// fetchAll runs d.Parallel streams that take the ranges still to fetch in
// file order, each over a connection of its own; the first takes the
// range stream was opened for (at first). Meanwhile it hashes the file in
// order and returns the digest. The first range to fail says why and
// cancels the others, which then stop saying nothing.
func (c *Client) fetchAll(ctx context.Context, cancel context.CancelFunc, p *parallelDownload, first int64, stream grpc.ClientStream, d FileDownload) ([]byte, error) {
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for w := range max(1, d.Parallel) {
		i, ok := p.take()
		if !ok {
			break
		}
		var opened grpc.ClientStream
		if w == 0 && p.ranges[i].Reached == first {
			opened, stream = stream, nil
		}
		wg.Go(func() {
			if err := c.fetchRanges(ctx, p, i, d.DownloadRequest, d.Connect, opened); err != nil {
				errOnce.Do(func() { firstErr = err })
				p.fail()
				cancel()
			}
		})
	}
	sum, herr := p.hash(ctx, d.sum())
	if herr != nil {
		cancel()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return sum, herr
}

// validRanges says whether r's ranges are ordered, adjacent and cover
// the backup, with each Reached inside its range.
func validRanges(r *rangesFile) bool {
	var at int64
	for _, br := range r.Ranges {
		if br.Start != at || br.Reached < br.Start || br.Reached > br.End {
			return false
		}
		at = br.End
	}
	return len(r.Ranges) > 0 && at == r.Size
}

// splitRanges covers [0, size): [0, have) already present, the rest in
// n ranges of nearly equal size.
func splitRanges(have, size int64, n int) []byteRange {
	var rs []byteRange
	if have > 0 {
		rs = append(rs, byteRange{0, have, have})
	}
	rest := size - have
	n = int(max(1, min(int64(n), rest/(1<<20)))) // ranges of at least 1 MiB
	for i := range n {
		start := have + rest*int64(i)/int64(n)
		end := have + rest*int64(i+1)/int64(n)
		rs = append(rs, byteRange{start, start, end})
	}
	return rs
}

// splitPieces covers [0, size): [0, have) already present, the rest in
// ranges of piece bytes, the last one shorter.
func splitPieces(have, size, piece int64) []byteRange {
	var rs []byteRange
	if have > 0 {
		rs = append(rs, byteRange{0, have, have})
	}
	for start := have; start < size; start += piece {
		rs = append(rs, byteRange{start, start, min(start+piece, size)})
	}
	return rs
}

// present is how many bytes of the backup are in the file.
func (p *parallelDownload) present() int64 {
	var n int64
	for _, r := range p.ranges {
		n += r.Reached - r.Start
	}
	return n
}

func (p *parallelDownload) fail() {
	p.mu.Lock()
	p.failed = true
	p.mu.Unlock()
	p.cond.Broadcast()
}

// advance records that range i reached reached.
func (p *parallelDownload) advance(i int, reached int64) {
	p.mu.Lock()
	p.ranges[i].Reached = reached
	present := p.present()
	if p.progress != nil {
		p.progress(present)
	}
	p.mu.Unlock()
	p.cond.Broadcast()
}

// hash reads the file from its start as the ranges fill it, writes it to
// sum (a fresh SHA-256) and returns the digest. It stops when a range fails.
func (p *parallelDownload) hash(ctx context.Context, sum hash.Hash) ([]byte, error) {
	buf := make([]byte, ChunkBytes)
	var pos int64
	for i := 0; pos < p.size; {
		p.mu.Lock()
		for !p.failed && p.ranges[i].Reached <= pos && pos < p.ranges[i].End {
			p.cond.Wait()
		}
		failed, reached, end := p.failed, p.ranges[i].Reached, p.ranges[i].End
		p.mu.Unlock()
		if failed {
			return nil, ctx.Err()
		}
		if pos == end {
			i++
			continue
		}
		for pos < reached {
			n, err := p.f.ReadAt(buf[:min(int64(len(buf)), reached-pos)], pos)
			if err != nil && !(errors.Is(err, io.EOF) && n > 0) {
				p.fail()
				return nil, fmt.Errorf("read back byte %d of %s: %w", pos, p.f.Name(), err)
			}
			sum.Write(buf[:n])
			pos += int64(n)
		}
	}
	return sum.Sum(nil), nil
}

// fetchRanges is one stream of a parallel download: it fetches range i,
// then each range p.take hands it, until none is left, over a connection
// of its own when connect is set. The stream handed the first stream
// (opened, on c) continues it on c's connection.
func (c *Client) fetchRanges(ctx context.Context, p *parallelDownload, i int, req DownloadRequest, connect Connector, opened grpc.ClientStream) error {
	rc := c
	if connect != nil && opened == nil {
		other, closeConn, err := connect(ctx)
		if err != nil {
			return fmt.Errorf("connection for bytes %d-%d: %w", p.ranges[i].Start, p.ranges[i].End, err)
		}
		defer closeConn()
		rc = other
		rc.Retry = c.Retry
	}
	for ok := true; ok; i, ok = p.take() {
		if err := c.fetchRange(ctx, rc, p, i, req, p.backup, opened); err != nil {
			return err
		}
		opened = nil
	}
	return nil
}

// fetchRange downloads range i into the file over rc, re-opening its
// stream from where it got when the connection breaks, as Download does;
// opened, if set, is a stream already open at the range's start.
func (c *Client) fetchRange(ctx context.Context, rc *Client, p *parallelDownload, i int, req DownloadRequest, b *ebv1.Backup, opened grpc.ClientStream) error {
	p.mu.Lock()
	reached, end := p.ranges[i].Reached, p.ranges[i].End
	p.mu.Unlock()
	retry := c.NewRetrier(func() string { return fmt.Sprintf("download %q at byte %d", req.Name, reached) })
	for {
		before := reached
		err := rc.fetchRangeOnce(ctx, p, i, req, b, opened, &reached, end)
		opened = nil
		if err == nil {
			return nil
		}
		if reached > before {
			retry.Progress()
		}
		if err := retry.Wait(ctx, err); err != nil {
			return err
		}
	}
}

// fetchRangeOnce makes one stream's worth of progress on range i, on
// stream if one is given (its header already read).
func (c *Client) fetchRangeOnce(ctx context.Context, p *parallelDownload, i int, req DownloadRequest, prev *ebv1.Backup, stream grpc.ClientStream, reached *int64, end int64) error {
	if stream == nil {
		// Cancelled at the end of the range: the server may send on.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		b, _, s, err := c.openDownload(ctx, req, *reached, end-*reached, end-*reached)
		if err != nil {
			return err
		}
		if b.GetSha256() != prev.GetSha256() || b.GetSize() != prev.GetSize() {
			return changedError(req.Name, prev, b)
		}
		stream = s
	}
	for *reached < end {
		var m chunkMessage
		err := stream.RecvMsg(&m)
		if errors.Is(err, io.EOF) {
			return status.Errorf(codes.Unavailable, "download: stream ended at byte %d of %d", *reached, prev.GetSize())
		}
		if err != nil {
			return err
		}
		// The last message may run past the range: keep only the range.
		w := &limitedWriterAt{f: p.f, off: *reached, end: end}
		err = m.writeTo(w)
		m.free()
		if err != nil {
			return fmt.Errorf("write at byte %d: %w", w.off, err)
		}
		*reached = w.off
		p.advance(i, *reached)
	}
	return nil
}

// limitedWriterAt writes at off onwards and drops what goes past end.
type limitedWriterAt struct {
	f        io.WriterAt
	off, end int64
}

func (w *limitedWriterAt) Write(b []byte) (int, error) {
	n := len(b)
	b = b[:min(int64(len(b)), max(0, w.end-w.off))]
	k, err := w.f.WriteAt(b, w.off)
	w.off += int64(k)
	if err != nil {
		return k, err
	}
	return n, nil
}
