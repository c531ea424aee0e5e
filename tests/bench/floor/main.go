// Command floor is the least work each stage of a backup cannot avoid,
// for BenchmarkFloors (tests/bench) to hold the product's CPU against:
//
//	floor agent -server ADDR -endpoint URL -name NAME [-compression zstd]
//	floor serve -dir DIR
//	floor serve -s3-bucket B -s3-endpoint URL -s3-ca FILE -s3-access-key-id-file FILE -s3-secret-access-key-file FILE
//
// agent reads etcd's snapshot with clientv3's Maintenance
// (SnapshotWithVersion), hashes it once with SHA-256 (checking etcd's
// trailer with it), compresses it if asked (zstd at the product agent's
// settings) and sends it on one gRPC client stream in the product's chunk
// size. serve takes such a stream, hashes what arrives once with SHA-256,
// and writes it to DIR/NAME.db, fsynced once at the end, or puts it as an
// object through the transfer manager at the product's default part size
// and concurrency; it serves the file or the object (one GET) back on a
// gRPC server stream, read in the product's download chunk size. serve
// prints the address it listens on as its first line and stops on SIGTERM
// or SIGINT.
//
// Both speak package rawcodec: no protobuf, only gRPC's framing. Neither
// does anything else the product does (no manifest, no retries, no
// authorization, no rate watch): the difference is what the product adds.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc/mem"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/grpcbuf"
)

const (
	// uploadChunkBytes is what the product's agent sends per message
	// (client.ChunkBytes).
	uploadChunkBytes = 1<<20 - 64
	// downloadChunkBytes is what the product's server sends per message
	// (server/rpc/internal/stream.DownloadChunkBytes).
	downloadChunkBytes = 1<<20 - 64
	// windowBytes is the flow-control window the product's clients ask
	// for (client.WindowBytes); its server keeps gRPC's default.
	windowBytes = 16 << 20
	// maxMessageBytes admits a chunk, as the product's server does.
	maxMessageBytes = 1<<20 + 64<<10
)

// buffers is where received frames and sent chunks live. Like the
// product's pools it does not clear a buffer before handing it out, as
// gRPC's default pool does: clearing is a pass over every byte that
// nothing needs, so a floor leaves it out.
var buffers mem.BufferPool = &grpcbuf.Pool{}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: floor agent|serve FLAGS")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "agent":
		err = runAgent(ctx, os.Args[2:])
	case "serve":
		err = runServe(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: agent or serve", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}
