package client

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
)

// DialOptions are the gRPC options of a connection that downloads: the
// plugin's and the agents' connections both dial with them.
var DialOptions = []grpc.DialOption{
	experimental.WithBufferPool(recvBuffers),
	grpc.WithInitialWindowSize(WindowBytes),
	grpc.WithInitialConnWindowSize(WindowBytes),
}

// WindowBytes is the flow-control window of a connection and of each of
// its streams: how much the server may send before the client
// acknowledges. gRPC's default starts at 64 KiB and lets its BDP estimator
// grow it up to 16 MiB; starting there costs no more memory at worst (16
// MiB waiting when the destination stalls) and, through a 100 ms round
// trip, carried a third more (BenchmarkDownloadLatency).
const WindowBytes = 16 << 20

// recvBuffers is the connection's pool for received frames. gRPC's
// default pool clears every buffer it hands out, which for a download is
// a second pass over every byte (a tenth of the client's CPU); a frame is
// read in full into its buffer before anyone reads it, so clearing only
// costs.
var recvBuffers = &dirtyPool{}

// dirtyPoolMaxExp bounds the pooled sizes at 4 MiB, a message's size;
// larger buffers are allocated and left to the garbage collector.
const dirtyPoolMaxExp = 22

// dirtyPool is a mem.BufferPool of power-of-two tiers that does not clear
// the buffers it hands out.
type dirtyPool struct {
	tiers [dirtyPoolMaxExp + 1]sync.Pool
}

func (p *dirtyPool) Get(n int) *[]byte {
	e := 0
	if n > 1 {
		e = bits.Len(uint(n - 1))
	}
	if e > dirtyPoolMaxExp {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[e].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<e)
	return &b
}

func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	if c == 0 || c&(c-1) != 0 {
		return // not one of ours
	}
	if e := bits.Len(uint(c)) - 1; e <= dirtyPoolMaxExp {
		p.tiers[e].Put(b)
	}
}
