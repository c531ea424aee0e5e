package client

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/grpcbuf"
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

// recvBuffers is the connection's pool for received frames: a frame is
// read in full into its buffer before anyone reads it, so the clearing of
// gRPC's default pool (a second pass over every byte, a tenth of the
// client's CPU on a download) only costs.
var recvBuffers = &grpcbuf.Pool{}

// uploadBuffers hold an upload's chunks from the read that fills them
// until gRPC has written them.
var uploadBuffers = &grpcbuf.Pool{}
