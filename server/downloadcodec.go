package server

import (
	"encoding/binary"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// chunkTag is the protobuf key of DownloadBackupResponse.chunk: field 2,
// wire type 2 (length-delimited).
const chunkTag = 2<<3 | 2

// chunkOut is a DownloadBackupResponse chunk already in a gRPC buffer:
// chunkCodec sends those bytes as they are, where proto.Marshal would
// copy each chunk into a new buffer first.
type chunkOut struct{ data mem.Buffer }

// chunkCodec is gRPC's proto codec plus chunkOut, forced on this
// package's gRPC servers (GRPCServerOptions) rather than registered
// globally: gRPC has no per-method codec, and the registry is every
// server's and client's in the process. Every other message is
// marshalled by the proto codec unchanged.
type chunkCodec struct{ encoding.CodecV2 }

// newChunkCodec wraps the proto codec registered when the server starts.
func newChunkCodec() chunkCodec { return chunkCodec{encoding.GetCodecV2(proto.Name)} }

func (c chunkCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*chunkOut)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	head := binary.AppendUvarint([]byte{chunkTag}, uint64(m.data.Len()))
	m.data.Ref() // gRPC frees the slice once the bytes are written
	return mem.BufferSlice{mem.SliceBuffer(head), m.data}, nil
}

// chunkBuffers holds the download chunks' buffers, which gRPC returns once
// it has written them. Unlike gRPC's default pool it does not clear them:
// each is filled by the read before it is sent.
var chunkBuffers = &chunkPool{sync.Pool{New: func() any { b := make([]byte, downloadChunkBytes); return &b }}}

type chunkPool struct{ sync.Pool }

// Get returns a buffer of n bytes, n at most downloadChunkBytes.
func (p *chunkPool) Get(n int) *[]byte {
	b := p.Pool.Get().(*[]byte)
	*b = (*b)[:n]
	return b
}

func (p *chunkPool) Put(b *[]byte) {
	if cap(*b) >= downloadChunkBytes {
		p.Pool.Put(b)
	}
}
