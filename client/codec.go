package client

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/grpcbuf"
)

// chunkCodec is gRPC's proto codec, except for the two messages that
// carry a backup's bytes, which it passes through without copying them:
//
//   - A DownloadBackupResponse received into a *chunkMessage keeps the
//     chunk's bytes in the buffers gRPC read them into instead of copying
//     them twice (into one contiguous buffer, then into a new []byte per
//     chunk, which also costs a zeroed 1 MiB allocation per message).
//   - An *uploadChunk goes out as the buffers it is in, behind its key and
//     length, where proto.Marshal would copy it into a new buffer.
//
// It names itself "proto", so every call is an ordinary
// application/grpc+proto call any server answers.
type chunkCodec struct{ proto encoding.CodecV2 }

var chunkCodecOption = grpc.ForceCodecV2(chunkCodec{proto: encoding.GetCodecV2(proto.Name)})

func (c chunkCodec) Name() string { return proto.Name }

func (c chunkCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*uploadChunk)
	if !ok {
		return c.proto.Marshal(v)
	}
	return grpcbuf.ChunkMessage(m.data), nil
}

// uploadChunk is an UploadBackupRequest that is a chunk, its bytes in
// gRPC buffers.
type uploadChunk struct{ data mem.BufferSlice }

func (c chunkCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*chunkMessage)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	m.reset()
	if skip, ok := chunkPayload(data); ok {
		data.Ref() // gRPC frees data when Unmarshal returns
		m.data, m.skip, m.n = data, skip, data.Len()-skip
		return nil
	}
	// The header, or a chunk encoded in some other (valid) way.
	m.msg = new(ebv1.DownloadBackupResponse)
	if err := c.proto.Unmarshal(data, m.msg); err != nil {
		return err
	}
	m.n = len(m.msg.GetChunk())
	return nil
}

// chunkPayload returns where the chunk's bytes start if data is exactly
// one chunk field, as the server sends it: the key, the length, then
// length bytes that end the message.
func chunkPayload(data mem.BufferSlice) (int, bool) {
	var head [1 + binary.MaxVarintLen64]byte
	n := 0
	for _, b := range data {
		n += copy(head[n:], b.ReadOnlyData())
		if n == len(head) {
			break
		}
	}
	if n < 2 || head[0] != grpcbuf.ChunkKey {
		return 0, false
	}
	size, k := binary.Uvarint(head[1:n])
	if k <= 0 {
		return 0, false
	}
	skip := 1 + k
	if uint64(data.Len()-skip) != size {
		return 0, false
	}
	return skip, true
}

// chunkMessage is one received DownloadBackupResponse: either a chunk
// still in gRPC's receive buffers (data, from byte skip on), or a decoded
// message (the header, or a chunk the fast path did not take).
type chunkMessage struct {
	data mem.BufferSlice
	skip int
	n    int // chunk bytes
	msg  *ebv1.DownloadBackupResponse
}

func (m *chunkMessage) reset() { *m = chunkMessage{} }

// header returns the message's header, nil for a chunk.
func (m *chunkMessage) header() *ebv1.DownloadHeader { return m.msg.GetHeader() }

// writeTo writes the chunk's bytes to each of ws, in order, without
// copying them, and stops at the first error.
func (m *chunkMessage) writeTo(ws ...interface{ Write([]byte) (int, error) }) error {
	if m.data == nil {
		for _, w := range ws {
			if _, err := w.Write(m.msg.GetChunk()); err != nil {
				return err
			}
		}
		return nil
	}
	skip := m.skip
	for _, b := range m.data {
		p := b.ReadOnlyData()
		if skip >= len(p) {
			skip -= len(p)
			continue
		}
		p, skip = p[skip:], 0
		for _, w := range ws {
			if _, err := w.Write(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// free returns the buffers to gRPC's pool; m must not be used after.
func (m *chunkMessage) free() {
	if m.data != nil {
		m.data.Free()
	}
	m.reset()
}

func (m *chunkMessage) String() string { return fmt.Sprintf("chunk of %d bytes", m.n) }
