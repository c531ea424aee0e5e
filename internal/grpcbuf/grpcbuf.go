// Package grpcbuf is how a backup's bytes pass through gRPC without being
// copied or cleared: a buffer pool (mem.BufferPool) that hands buffers out
// as they were left, and the encoding of a chunk message straight from the
// buffers that hold the chunk (ChunkMessage).
//
// gRPC's default pool clears each buffer it hands out. Every byte of a
// backup passes through one — a received frame, a message gathered from
// several frames — so that clearing is a second pass over every byte: in
// the agent's profile it cost as much CPU as the SHA-256, and the server
// and the plugin paid the same on every upload and download. gRPC
// overwrites every byte of the length it asks for before it reads one, so
// the clearing buys nothing for the transfers this project makes.
package grpcbuf

import (
	"encoding/binary"
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// MaxPooled is the largest pooled buffer, 4 MiB (a message's size here);
// larger ones are allocated and left to the garbage collector.
const MaxPooled = 1 << maxTier

const maxTier = 22

// Pool is a mem.BufferPool of power-of-two tiers that does not clear the
// buffers it hands out. The zero value is ready to use.
type Pool struct {
	tiers [maxTier + 1]sync.Pool // tier i holds buffers of capacity 1<<i
}

var _ mem.BufferPool = (*Pool)(nil)

func tier(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// Get implements mem.BufferPool: a buffer of length bytes whose contents
// are whatever its last user left.
func (p *Pool) Get(length int) *[]byte {
	t := tier(length)
	if t > maxTier {
		b := make([]byte, length)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:length]
		return b
	}
	b := make([]byte, length, 1<<t)
	return &b
}

// Put implements mem.BufferPool. A buffer the pool did not hand out (its
// capacity not a pooled power of two) is left to the garbage collector.
func (p *Pool) Put(b *[]byte) {
	c := cap(*b)
	t := tier(c)
	if c == 0 || t > maxTier || c != 1<<t {
		return
	}
	p.tiers[t].Put(b)
}

// ChunkKey is the protobuf key of the chunk of DownloadBackupResponse and
// of UploadBackupRequest: field 2, wire type 2 (length-delimited).
const ChunkKey = 2<<3 | 2

// ChunkMessage is, for a codec's Marshal, the encoding of a message whose
// one field is a chunk of data: the key and the length, then data's
// buffers themselves, where proto.Marshal would copy them. Each buffer is
// referenced once more for gRPC, which frees what Marshal returns once it
// has written it.
func ChunkMessage(data mem.BufferSlice) mem.BufferSlice {
	head := binary.AppendUvarint([]byte{ChunkKey}, uint64(data.Len()))
	data.Ref()
	return append(mem.BufferSlice{mem.SliceBuffer(head)}, data...)
}
