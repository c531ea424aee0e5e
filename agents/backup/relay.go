package backup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// relay reads etcd's snapshot stream without copying it: each
// Maintenance.Snapshot message stays in the gRPC buffers it arrived in.
// Stored as is, the upload chunks that carry its blob point into them
// (Next), and the message goes back to the pool once gRPC has written the
// last of them to the server; compressed or encrypted, the blob is copied
// once, into the compressor's buffer (Read). clientv3's Snapshot copies
// every byte three times on the way (into one buffer per message, into
// the message's blob, through an io.Pipe) before the upload copied it into
// its chunk: in the agent's profile, a quarter of its CPU and nearly all
// its garbage.
//
// Nothing is checked here: the server checks etcd's SHA-256 trailer of a
// snapshot stored as is, in the pass that hashes what it stores, and the
// agent's verifier that of one it transforms.
type relay struct {
	stream   grpc.ClientStream
	cancel   context.CancelFunc
	progress func(int64)
	// Version is the etcd version the first message names.
	Version string

	cur   *heldMessage // the message blob is in, nil when none
	blob  [][]byte     // what is left to send of cur's blob
	done  bool         // etcd ended the stream
	err   error        // what broke etcd's stream, if it broke
	read  int64        // blob bytes Next has returned
	chunk int          // the largest chunk Next returns
}

// startRelay opens etcd's snapshot stream and reads its first message (to
// learn the version). Close must be called.
func startRelay(ctx context.Context, etcd *clientv3.Client, chunk int, progress func(int64)) (*relay, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := etcd.ActiveConnection().NewStream(ctx, &pb.Maintenance_ServiceDesc.Streams[0], pb.Maintenance_Snapshot_FullMethodName,
		grpc.ForceCodecV2(relayCodec{encoding.GetCodecV2(grpcproto.Name)}))
	if err == nil {
		err = stream.SendMsg(&pb.SnapshotRequest{})
	}
	if err == nil {
		err = stream.CloseSend()
	}
	r := &relay{stream: stream, cancel: cancel, progress: progress, chunk: chunk}
	if err == nil {
		err = r.recv()
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// recv takes etcd's next message as cur.
func (r *relay) recv() error {
	var m snapshotMessage
	if err := r.stream.RecvMsg(&m); err != nil {
		return err
	}
	r.cur, r.blob = m.held, m.blob
	if r.Version == "" {
		r.Version = m.version
	}
	return nil
}

// fill makes sure some of a blob is left to take, receiving etcd's next
// messages as needed. It returns io.EOF once etcd ended the stream, and
// remembers any other error in r.err.
func (r *relay) fill() error {
	for len(r.blob) == 0 {
		r.drop()
		if r.done {
			return io.EOF
		}
		if err := r.recv(); errors.Is(err, io.EOF) {
			r.done = true
			return io.EOF
		} else if err != nil {
			r.err = err
			return err
		}
	}
	return nil
}

// drop lets go of cur: its buffers return to the pool once gRPC has
// written every chunk that points into them.
func (r *relay) drop() {
	if r.cur != nil {
		r.cur.release()
		r.cur, r.blob = nil, nil
	}
}

// Next returns the next upload chunk, up to r.chunk bytes of snapshot in
// the buffers etcd's messages arrived in, and io.EOF after the last. The
// caller frees each chunk.
func (r *relay) Next() (mem.BufferSlice, error) {
	var out mem.BufferSlice
	size := 0
	for size < r.chunk {
		if err := r.fill(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			out.Free()
			return nil, err
		}
		w := r.blob[0]
		if len(w) > r.chunk-size {
			w = w[:r.chunk-size]
			r.blob[0] = r.blob[0][len(w):]
		} else {
			r.blob = r.blob[1:]
		}
		out = append(out, r.cur.share(w))
		size += len(w)
	}
	if size == 0 {
		return nil, io.EOF
	}
	r.read += int64(size)
	if r.progress != nil {
		r.progress(r.read)
	}
	return out, nil
}

// Read implements io.Reader, for a snapshot the agent compresses or
// encrypts: it copies the blob out of etcd's buffers once, into p.
// Progress is not reported here (the verifier reading it does).
func (r *relay) Read(p []byte) (int, error) {
	if err := r.fill(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) && len(r.blob) > 0 {
		c := copy(p[n:], r.blob[0])
		n += c
		if c == len(r.blob[0]) {
			r.blob = r.blob[1:]
		} else {
			r.blob[0] = r.blob[0][c:]
		}
	}
	return n, nil
}

// Close ends etcd's stream and lets go of the message being sent.
func (r *relay) Close() {
	r.cancel()
	r.drop()
}

// heldMessage is one of etcd's messages kept in its gRPC buffers. Each
// chunk buffer that points into it holds a reference, and so does the
// relay until it has taken the whole blob; the last to let go frees it.
type heldMessage struct {
	data mem.BufferSlice
	refs atomic.Int32
}

// share returns w, a window of the message, as a gRPC buffer that holds a
// reference to the message until it is freed. A window too small for gRPC
// to pool (it would not report freeing it) is copied.
func (h *heldMessage) share(w []byte) mem.Buffer {
	if mem.IsBelowBufferPoolingThreshold(len(w)) {
		return mem.SliceBuffer(bytes.Clone(w))
	}
	h.refs.Add(1)
	w = w[:len(w):len(w)]
	return mem.NewBuffer(&w, h)
}

func (h *heldMessage) release() {
	if h.refs.Add(-1) == 0 {
		h.data.Free()
	}
}

// Get implements mem.BufferPool; a heldMessage hands out no buffers.
func (h *heldMessage) Get(int) *[]byte { panic("backup: heldMessage is not a buffer pool") }

// Put implements mem.BufferPool: gRPC freed a buffer share returned.
func (h *heldMessage) Put(*[]byte) { h.release() }

// snapshotMessage is a SnapshotResponse whose blob was left in the
// buffers it arrived in.
type snapshotMessage struct {
	held    *heldMessage
	blob    [][]byte // windows of held's buffers, in order
	version string
}

// SnapshotResponse's fields (etcd's api/etcdserverpb/rpc.proto).
const (
	snapshotBlobField    = 3
	snapshotVersionField = 4
)

// parseSnapshotResponse decodes a SnapshotResponse spread over data's
// buffers: the blob as windows of them, the version as a string. Other
// fields (the header, remaining_bytes, any unknown to this build) are
// skipped. As in protobuf, the last of a repeated scalar field wins.
func parseSnapshotResponse(data mem.BufferSlice) (blob [][]byte, version string, err error) {
	c := cursor{bufs: make([][]byte, 0, len(data))}
	for _, b := range data {
		if p := b.ReadOnlyData(); len(p) > 0 {
			c.bufs = append(c.bufs, p)
		}
		c.left += b.Len()
	}
	for c.left > 0 {
		tag, err := c.varint()
		if err != nil {
			return nil, "", err
		}
		num, typ := protowire.DecodeTag(tag)
		if !num.IsValid() {
			return nil, "", fmt.Errorf("snapshot message: invalid field number %d", num)
		}
		switch typ {
		case protowire.VarintType:
			_, err = c.varint()
		case protowire.Fixed32Type:
			_, err = c.take(4)
		case protowire.Fixed64Type:
			_, err = c.take(8)
		case protowire.BytesType:
			var n uint64
			if n, err = c.varint(); err != nil {
				break
			}
			if n > uint64(c.left) {
				return nil, "", fmt.Errorf("snapshot message: field %d of %d bytes, %d left", num, n, c.left)
			}
			var w [][]byte
			if w, err = c.take(int(n)); err != nil {
				break
			}
			switch num {
			case snapshotBlobField:
				blob = w
			case snapshotVersionField:
				version = string(bytes.Join(w, nil))
			}
		default:
			return nil, "", fmt.Errorf("snapshot message: field %d has wire type %d, which etcd does not send", num, typ)
		}
		if err != nil {
			return nil, "", err
		}
	}
	return blob, version, nil
}

// cursor reads a message spread over several buffers.
type cursor struct {
	bufs [][]byte // what is left, the first partly read
	left int
}

var errTruncated = errors.New("snapshot message: truncated")

// varint reads a protobuf varint.
func (c *cursor) varint() (uint64, error) {
	var b [binary.MaxVarintLen64]byte
	n := 0
	for _, p := range c.bufs {
		n += copy(b[n:], p)
		if n == len(b) {
			break
		}
	}
	v, k := protowire.ConsumeVarint(b[:n])
	if k < 0 {
		return 0, fmt.Errorf("snapshot message: %w", protowire.ParseError(k))
	}
	_, err := c.take(k)
	return v, err
}

// take returns the next n bytes as windows of the buffers.
func (c *cursor) take(n int) ([][]byte, error) {
	if n > c.left {
		return nil, errTruncated
	}
	c.left -= n
	var w [][]byte
	for n > 0 {
		p := c.bufs[0]
		if len(p) > n {
			w = append(w, p[:n])
			c.bufs[0] = p[n:]
			break
		}
		w = append(w, p)
		c.bufs = c.bufs[1:]
		n -= len(p)
	}
	return w, nil
}
