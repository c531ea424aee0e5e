package backup

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// dirtyPool is a gRPC buffer pool that hands buffers out as they were
// left. gRPC's default pool clears each buffer it hands out, and a
// snapshot's every byte passes through one: in the agent's profile that
// clearing cost as much CPU as the SHA-256. gRPC overwrites every byte of
// the length it asks for (a frame, a message) before it reads one, so the
// clearing buys nothing here. The transport's frames come from it
// (experimental.WithBufferPool) and so do messages gathered from several
// frames (snapshotCodec).
type dirtyPool struct {
	tiers [maxTier + 1]sync.Pool // tier i holds buffers of capacity 1<<i
}

// maxTier is the largest pooled buffer, 4 MiB; larger ones are allocated
// and left to the garbage collector.
const maxTier = 22

var _ mem.BufferPool = (*dirtyPool)(nil)

func tier(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// Get implements mem.BufferPool.
func (p *dirtyPool) Get(length int) *[]byte {
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

// Put implements mem.BufferPool.
func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	t := tier(c)
	if t > maxTier || c != 1<<t {
		return // not one of ours
	}
	p.tiers[t].Put(b)
}

// snapshotCodec is gRPC's proto codec, but it gathers a message spread
// over several frames into a buffer of dirtyPool: the standard codec takes
// that buffer from gRPC's default pool, which clears it first.
type snapshotCodec struct {
	encoding.CodecV2 // gRPC's own "proto" codec, for Marshal and Name
	pool             mem.BufferPool
}

// Unmarshal implements encoding.CodecV2.
func (c snapshotCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("failed to unmarshal, message is %T, want proto.Message", v)
	}
	buf := data.MaterializeToBuffer(c.pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// etcdDialOptions take the agent's etcd connections' buffers from
// snapshotBuffers.
func etcdDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		experimental.WithBufferPool(snapshotBuffers),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(snapshotCodec{CodecV2: encoding.GetCodecV2(grpcproto.Name), pool: snapshotBuffers})),
	}
}
