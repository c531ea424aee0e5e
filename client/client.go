// Package client is the Go client of the etcdbackup.v1 API used by the
// kubectl plugin and the agents: verified streaming uploads, and downloads
// that resume from their offset when the connection breaks.
package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// ChunkBytes is the size of the chunks an upload sends: just under gRPC's
// 1 MiB pooled buffer size, and within the server's
// ServerLimits.max_chunk_bytes (1 MiB).
const ChunkBytes = 1<<20 - 64

// ErrCorrupt reports that downloaded bytes do not hash to the backup's
// recorded SHA-256.
var ErrCorrupt = errors.New("downloaded data does not match the backup's SHA-256")

// Client calls an etcdbackup server over one gRPC connection.
type Client struct {
	Backups ebv1.BackupServiceClient
	Info    ebv1.InfoServiceClient
	// Agents is what agents alone may call (the agent port).
	Agents ebv1.AgentServiceClient
	// Retry says how long Download and Upload retry when the connection
	// breaks; New sets DefaultRetryTimeout.
	Retry Retry
}

// New returns a Client on conn. conn should be dialled with Reconnect, so
// that it finds a server that comes back within seconds.
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{
		Backups: ebv1.NewBackupServiceClient(conn),
		Info:    ebv1.NewInfoServiceClient(conn),
		Agents:  ebv1.NewAgentServiceClient(conn),
		Retry:   Retry{Timeout: DefaultRetryTimeout},
	}
}

// Upload streams r to the server as a new backup described by h. It hashes
// while it sends and sends its size and SHA-256 in the trailer, so the
// server stores the backup only if exactly those bytes arrived. progress,
// if set, is called with the bytes sent so far.
func (c *Client) Upload(ctx context.Context, r io.Reader, h *ebv1.UploadHeader, progress func(sent int64)) (*ebv1.Backup, error) {
	return c.UploadWith(ctx, r, UploadRequest{Header: h, Progress: progress})
}

// UploadRequest describes an upload for UploadWith.
type UploadRequest struct {
	Header   *ebv1.UploadHeader
	Progress func(sent int64)
	// Raw, if set, is called once r is exhausted and returns the size and
	// SHA-256 of the data before compression, for the trailer: a
	// compressing sender knows them only at the end.
	Raw func() (size int64, sha256 string)
	// SHA256, if set, is called once r is exhausted and returns the hex
	// SHA-256 of all r returned, which the caller hashed already (as it
	// read, on its own goroutine): the upload then does not hash the same
	// bytes a second time. The server still checks it against what
	// arrived. With Rewind it must describe the data of the last attempt.
	SHA256 func() string
	// Etcd, if set, is called once r is exhausted and returns what the
	// sender read from the whole plain snapshot (revision, keys, hash:
	// snapshot_status set), for the trailer. An error aborts the upload:
	// the server stores nothing.
	Etcd func() (*ebv1.EtcdInfo, error)
	// Rewind, if set, returns the data again from its start, to retry
	// after the connection broke. Without it, an r that can seek is
	// seeked back, and any other r is not retried.
	Rewind func() (io.Reader, error)
}

// UploadWith is Upload with every option. r must return io.EOF only when
// all data was read correctly: any other error aborts the upload and the
// server stores nothing.
//
// When the connection breaks before the server committed the backup (the
// server discards what it got), the upload starts again from the
// beginning, for as long as c.Retry allows without an attempt getting
// further than the ones before; this needs req.Rewind or an r that can
// seek. If an attempt was committed but its answer lost, the next one is
// refused as AlreadyExists: the backup found under the name counts as
// this upload's when its size and SHA-256 are those an attempt sent.
func (c *Client) UploadWith(ctx context.Context, r io.Reader, req UploadRequest) (*ebv1.Backup, error) {
	rewind := req.Rewind
	if s, ok := r.(io.Seeker); ok && rewind == nil {
		if start, err := s.Seek(0, io.SeekCurrent); err == nil {
			rewind = func() (io.Reader, error) {
				_, err := s.Seek(start, io.SeekStart)
				return r, err
			}
		}
	}
	var trailers []*ebv1.UploadTrailer // sent by earlier attempts
	var furthest int64
	retry := c.NewRetrier(func() string { return fmt.Sprintf("upload %q", req.Header.GetName()) })
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			var rerr error
			if r, rerr = rewind(); rerr != nil {
				return nil, fmt.Errorf("upload %q: read the input again to retry: %w", req.Header.GetName(), rerr)
			}
		}
		b, trailer, sent, err := c.uploadOnce(ctx, readerChunks(r), req)
		if err == nil {
			return b, nil
		}
		if status.Code(err) == codes.AlreadyExists && attempt > 0 {
			b, held := c.earlierAttempt(ctx, req.Header, trailers)
			if b != nil {
				return b, nil
			}
			if !held {
				return nil, err
			}
			// The server has not yet noticed that the earlier attempt
			// broke: it still holds the name. Retry as for a break.
			err = status.Error(codes.Unavailable, status.Convert(err).Message())
		}
		if trailer != nil {
			trailers = append(trailers, trailer)
		}
		if rewind == nil {
			return nil, err
		}
		if sent > furthest {
			furthest = sent
			retry.Progress()
		}
		if err := retry.Wait(ctx, err); err != nil {
			return nil, err
		}
	}
}

// earlierAttempt explains an AlreadyExists refusal of a retry: it returns
// the backup named in h if one of the trailers describes it (an earlier
// attempt was stored though its answer was lost), or held true if no
// backup has the name yet (an earlier attempt still holds it on the
// server).
func (c *Client) earlierAttempt(ctx context.Context, h *ebv1.UploadHeader, trailers []*ebv1.UploadTrailer) (b *ebv1.Backup, held bool) {
	resp, err := c.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: h.GetName(), Location: h.GetLocation()})
	if status.Code(err) == codes.NotFound {
		return nil, true
	}
	if err != nil {
		return nil, false
	}
	for _, t := range trailers {
		if resp.GetBackup().GetSize() == t.GetSize() && resp.GetBackup().GetSha256() == t.GetSha256() {
			return resp.GetBackup(), false
		}
	}
	return nil, false
}

// UploadChunks is UploadWith for a sender whose bytes are already in
// gRPC buffers: next returns the upload's next chunk (at most ChunkBytes),
// then io.EOF after the last; any other error aborts the upload and the
// server stores nothing. The upload frees each chunk once gRPC has
// written it, without copying it first. The chunks cannot be produced
// twice, so a broken connection is not retried.
func (c *Client) UploadChunks(ctx context.Context, next func() (mem.BufferSlice, error), req UploadRequest) (*ebv1.Backup, error) {
	b, _, _, err := c.uploadOnce(ctx, next, req)
	return b, err
}

// readerChunks returns r's bytes in chunks of ChunkBytes, each read into a
// buffer of uploadBuffers that goes back to the pool once gRPC has
// written it: proto.Marshal would copy every chunk into a new buffer.
func readerChunks(r io.Reader) func() (mem.BufferSlice, error) {
	return func() (mem.BufferSlice, error) {
		bp := uploadBuffers.Get(ChunkBytes)
		n, err := io.ReadFull(r, *bp)
		if n == 0 || (err != nil && !errors.Is(err, io.ErrUnexpectedEOF)) {
			uploadBuffers.Put(bp)
			if err == nil {
				err = io.ErrNoProgress
			}
			return nil, err
		}
		*bp = (*bp)[:n]
		return mem.BufferSlice{mem.NewBuffer(bp, uploadBuffers)}, nil
	}
}

// uploadOnce makes one UploadBackup call of the chunks next returns. It
// returns the trailer if it got as far as sending it, and the bytes sent.
func (c *Client) uploadOnce(ctx context.Context, next func() (mem.BufferSlice, error), req UploadRequest) (*ebv1.Backup, *ebv1.UploadTrailer, int64, error) {
	h, progress := req.Header, req.Progress
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // on any error, cancelling tells the server to discard
	stream, err := c.Backups.UploadBackup(ctx, chunkCodecOption)
	if err != nil {
		return nil, nil, 0, err
	}
	if err := stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: h}}); err != nil {
		return nil, nil, 0, sendError(stream, err)
	}
	var sum hash.Hash = nopHash{}
	if req.SHA256 == nil {
		sum = sha256.New()
	}
	var sent int64
	for {
		chunk, rerr := next()
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return nil, nil, sent, fmt.Errorf("read input after %d bytes: %w", sent, rerr)
		}
		n := chunk.Len()
		for _, b := range chunk {
			sum.Write(b.ReadOnlyData())
		}
		err := stream.SendMsg(&uploadChunk{data: chunk})
		chunk.Free() // gRPC holds its own reference until the bytes are written
		if err != nil {
			return nil, nil, sent, sendError(stream, err)
		}
		sent += int64(n)
		if progress != nil {
			progress(sent)
		}
	}
	trailer := &ebv1.UploadTrailer{Size: sent}
	if req.SHA256 != nil {
		trailer.Sha256 = req.SHA256()
	} else {
		trailer.Sha256 = hex.EncodeToString(sum.Sum(nil))
	}
	if req.Raw != nil {
		trailer.RawSize, trailer.RawSha256 = req.Raw()
	}
	if req.Etcd != nil {
		if trailer.Etcd, err = req.Etcd(); err != nil {
			return nil, nil, sent, err
		}
	}
	if err := stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Trailer{Trailer: trailer}}); err != nil {
		return nil, trailer, sent, sendError(stream, err)
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, trailer, sent, err
	}
	return resp.GetBackup(), trailer, sent, nil
}

// nopHash stands in for the upload's hash when the caller supplies the sum.
type nopHash struct{ hash.Hash }

func (nopHash) Write(p []byte) (int, error) { return len(p), nil }

// sendError returns the server's status when a Send fails because the
// server ended the stream (Send then only says io.EOF).
func sendError(stream grpc.ClientStream, err error) error {
	if errors.Is(err, io.EOF) {
		if rerr := stream.RecvMsg(new(ebv1.UploadBackupResponse)); rerr != nil {
			return rerr
		}
	}
	return err
}

// DownloadRequest says what to download and from where.
type DownloadRequest struct {
	Name     string
	Location string
	// Offset is where to start: the size of a partial download already
	// written.
	Offset int64
	// Prefix holds the SHA-256 state of the Offset bytes already written
	// (nil when Offset is 0). The final digest covers prefix and new bytes.
	Prefix hash.Hash
	// OnHeader, if set, is called once with the backup's metadata before
	// any byte is written; an error stops the download.
	OnHeader func(b *ebv1.Backup) error
	// Progress, if set, is called with the offset reached so far.
	Progress func(offset int64)
}

// Download writes the backup's bytes from req.Offset to w, re-opening the
// stream from the offset it reached whenever the connection breaks, for
// as long as c.Retry allows without a byte arriving, and fails with
// ErrCorrupt unless the whole backup hashes to its SHA-256. Nothing is
// written twice, so w may be a stream (standard output).
//
// The chunks are written and hashed by a goroutine of their own, a few
// messages behind the one receiving them, so that the hash and the
// writes overlap the network reads.
func (c *Client) Download(ctx context.Context, w io.Writer, req DownloadRequest) (*ebv1.Backup, error) {
	sum := req.Prefix
	if sum == nil {
		if req.Offset != 0 {
			return nil, errors.New("download: an offset needs the SHA-256 state of the bytes before it")
		}
		sum = sha256.New()
	}
	offset := req.Offset
	s := startSink(w, sum, req.Offset, req.Progress)
	var backup *ebv1.Backup
	retry := c.NewRetrier(func() string { return fmt.Sprintf("download %q at byte %d", req.Name, offset) })
	for {
		before := offset
		b, err := c.downloadOnce(ctx, s, req, &offset, backup)
		if b != nil && backup == nil {
			backup = b
		}
		if err == nil {
			break
		}
		if offset > before {
			retry.Progress()
		}
		if werr := s.err(); werr != nil {
			err = werr
		}
		if err := retry.Wait(ctx, err); err != nil {
			s.close()
			return backup, err
		}
	}
	if err := s.close(); err != nil {
		return backup, err
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != backup.GetSha256() {
		return backup, fmt.Errorf("download %q: %w: got %s, want %s", req.Name, ErrCorrupt, got, backup.GetSha256())
	}
	return backup, nil
}

// downloadOnce runs one DownloadBackup stream from *offset, advancing it
// as chunks are handed to s. prev is the header of an earlier attempt:
// the backup must not have changed between attempts.
func (c *Client) downloadOnce(ctx context.Context, s *sink, req DownloadRequest, offset *int64, prev *ebv1.Backup) (*ebv1.Backup, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b, _, stream, err := c.openDownload(ctx, req, *offset, -1, 0)
	if err != nil {
		return b, err
	}
	if prev == nil {
		if req.OnHeader != nil {
			if err := req.OnHeader(b); err != nil {
				return b, err
			}
		}
	} else if prev.GetSha256() != b.GetSha256() || prev.GetSize() != b.GetSize() {
		return b, changedError(req.Name, prev, b)
	}
	for {
		m := new(chunkMessage)
		err := stream.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return b, err
		}
		*offset += int64(m.n)
		if err := s.write(m); err != nil {
			return b, err
		}
	}
	if *offset != b.GetSize() {
		return b, status.Errorf(codes.Unavailable, "download: stream ended at byte %d of %d", *offset, b.GetSize())
	}
	return b, nil
}

// openDownload starts a DownloadBackup stream at offset, asking for ask
// bytes (0: to the end), and reads its header. It returns how many bytes
// the stream carries: 0 from a server that does not know lengths and
// sends to the end whatever was asked. A need of 0 or more is checked
// against the header: the caller reads that many bytes and cancels the
// stream.
func (c *Client) openDownload(ctx context.Context, req DownloadRequest, offset, need, ask int64) (*ebv1.Backup, int64, grpc.ClientStream, error) {
	stream, err := c.Backups.DownloadBackup(ctx, &ebv1.DownloadBackupRequest{Name: req.Name, Location: req.Location, Offset: offset, Length: ask}, chunkCodecOption)
	if err != nil {
		return nil, 0, nil, err
	}
	var first chunkMessage
	if err := stream.RecvMsg(&first); err != nil {
		return nil, 0, nil, err
	}
	h := first.header()
	first.free()
	// An answer that breaks the protocol is the server's own fault, marked
	// so: asking again does not mend it, as it mends a torn stream.
	if h == nil || h.GetBackup() == nil {
		return nil, 0, nil, ebv1.ServerError(codes.Internal, "download: the server did not start with a header")
	}
	b := h.GetBackup()
	if h.GetOffset() != offset {
		return b, 0, nil, ebv1.ServerErrorf(codes.Internal, "download: asked for offset %d, the server starts at %d", offset, h.GetOffset())
	}
	if need >= 0 && offset+need > b.GetSize() {
		return b, 0, nil, fmt.Errorf("download %q: the backup is %d bytes, not the %d or more this download started with; download it again", req.Name, b.GetSize(), offset+need)
	}
	if carries := h.GetLength(); carries < 0 || offset+carries > b.GetSize() || (ask > 0 && carries > ask) {
		return b, 0, nil, ebv1.ServerErrorf(codes.Internal, "download: asked for %d bytes at %d of %d, the server says it sends %d", ask, offset, b.GetSize(), carries)
	}
	return b, h.GetLength(), stream, nil
}

func changedError(name string, prev, b *ebv1.Backup) error {
	return fmt.Errorf("download %q: the backup changed on the server while downloading (was %d bytes %s, now %d bytes %s); download it again",
		name, prev.GetSize(), prev.GetSha256(), b.GetSize(), b.GetSha256())
}
