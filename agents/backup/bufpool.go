package backup

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// dirtyPool is a gRPC buffer pool that hands buffers out as they were
// left. gRPC's default pool clears each buffer it hands out, and a
// snapshot's every byte passes through one: in the agent's profile that
// clearing cost as much CPU as the SHA-256. gRPC overwrites every byte of
// the length it asks for (a frame, a message) before it reads one, so the
// clearing buys nothing here.
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
