// Package stream is how the request layer's streams move a backup's
// bytes: the chunk codec and its buffer pools, and the minimum transfer
// rate both directions are held to. server/rpc (uploads) and
// server/rpc/readpath (downloads) share it.
package stream

import (
	"encoding/binary"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/grpcbuf"
)

const (
	// MaxChunkBytes is the largest chunk accepted or sent on a stream. It
	// bounds the memory a stream holds, whatever the backup's size.
	MaxChunkBytes = 1 << 20
	// DownloadChunkBytes is what the server sends per message: just
	// under gRPC's 1 MiB pooled buffer size, so each message takes one
	// buffer (a 256 KiB message would take, and zero, a 1 MiB buffer
	// anyway).
	DownloadChunkBytes = 1<<20 - 64
)

// ServerOptions are the options of a gRPC server the request layer's
// streams need: the message size a chunk takes, the codec that moves chunks
// without copies, and the pool received frames come from.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		// A chunk plus framing must fit in a message.
		grpc.MaxRecvMsgSize(MaxChunkBytes + 64<<10),
		// Download chunks go out from pooled buffers without a copy;
		// upload chunks are copied once, into buffers the handler
		// returns.
		grpc.ForceServerCodecV2(newChunkCodec()),
		// Received frames are not cleared before they are filled.
		experimental.BufferPool(recvBuffers),
	}
}

// ChunkOut is a DownloadBackupResponse chunk already in a gRPC buffer:
// chunkCodec sends those bytes as they are, where proto.Marshal would
// copy each chunk into a new buffer first.
type ChunkOut struct{ Data mem.Buffer }

// chunkCodec is gRPC's proto codec plus the two messages that carry a
// backup's bytes, forced on the gRPC servers of the request layer
// (ServerOptions) rather than registered globally: gRPC has no
// per-method codec, and the registry is every server's and client's in
// the process. Every other message is marshalled by the proto codec
// unchanged.
//
//   - ChunkOut (a download chunk) goes out as the buffer it was read into.
//   - An upload chunk is copied once, from the frames it arrived in, into
//     a buffer of uploadBuffers that the handler returns once it has
//     stored the bytes (ReleaseUploadChunk). The proto codec copies twice
//     (gathering the frames into a buffer of gRPC's default pool, which
//     clears it first, then into a new slice for every chunk, which the
//     garbage collector must clear and collect): on an upload, a third of
//     the server's CPU and most of its heap.
type chunkCodec struct{ encoding.CodecV2 }

// newChunkCodec wraps the proto codec registered when the server starts.
func newChunkCodec() chunkCodec { return chunkCodec{encoding.GetCodecV2(proto.Name)} }

func (c chunkCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*ChunkOut)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	return grpcbuf.ChunkMessage(mem.BufferSlice{m.Data}), nil
}

func (c chunkCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*ebv1.UploadBackupRequest); ok {
		if chunk, ok := uploadChunk(data); ok {
			m.Reset()
			m.Msg = &ebv1.UploadBackupRequest_Chunk{Chunk: chunk}
			return nil
		}
	}
	return c.CodecV2.Unmarshal(data, v)
}

// uploadChunk copies the bytes of an UploadBackupRequest that is a chunk
// and nothing else into a buffer of uploadBuffers. ok is false for any
// other message (a header, a trailer, a chunk beside unknown fields, one
// over MaxChunkBytes): the proto codec decodes those, and the handler
// judges them.
func uploadChunk(data mem.BufferSlice) (chunk []byte, ok bool) {
	var head [1 + binary.MaxVarintLen64]byte
	n := copyFrom(head[:], data, 0)
	if n == 0 || head[0] != grpcbuf.ChunkKey {
		return nil, false
	}
	size, w := binary.Uvarint(head[1:n])
	if w <= 0 || size > MaxChunkBytes || uint64(data.Len()) != uint64(1+w)+size {
		return nil, false
	}
	b := (*uploadBuffers.Get(int(size)))[:size]
	copyFrom(b, data, 1+w)
	return b, true
}

// copyFrom copies data's bytes from offset into dst and returns how many.
func copyFrom(dst []byte, data mem.BufferSlice, offset int) int {
	n := 0
	for _, buf := range data {
		b := buf.ReadOnlyData()
		if offset >= len(b) {
			offset -= len(b)
			continue
		}
		n += copy(dst[n:], b[offset:])
		offset = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// uploadBuffers hold upload chunks from the codec to the handler; recvBuffers
// the frames they arrive in. Neither is cleared: each is filled before it
// is read.
var (
	uploadBuffers = &grpcbuf.Pool{}
	recvBuffers   = &grpcbuf.Pool{}
)

// ReleaseUploadChunk returns a chunk's buffer once the handler has stored
// its bytes. A chunk the proto codec decoded is the handler's alone as
// well, so whatever its size, putting it back is safe.
func ReleaseUploadChunk(chunk []byte) {
	b := chunk[:cap(chunk)]
	uploadBuffers.Put(&b)
}

// ChunkBuffers holds the download chunks' buffers, which gRPC returns once
// it has written them. Unlike gRPC's default pool it does not clear them:
// each is filled by the read before it is sent.
var ChunkBuffers = &chunkPool{sync.Pool{New: func() any { b := make([]byte, DownloadChunkBytes); return &b }}}

type chunkPool struct{ sync.Pool }

// Get returns a buffer of n bytes, n at most DownloadChunkBytes.
func (p *chunkPool) Get(n int) *[]byte {
	b := p.Pool.Get().(*[]byte)
	*b = (*b)[:n]
	return b
}

func (p *chunkPool) Put(b *[]byte) {
	if cap(*b) >= DownloadChunkBytes {
		p.Pool.Put(b)
	}
}
