package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/bench/floor/rawcodec"
)

// runAgent sends one snapshot of the etcd member at -endpoint to the floor
// server at -server and prints {"rawSize":N,"size":N,"stored":"SIZE SHA256"}.
func runAgent(ctx context.Context, args []string) error {
	fl := flag.NewFlagSet("agent", flag.ContinueOnError)
	server := fl.String("server", "", "the floor server, HOST:PORT")
	endpoint := fl.String("endpoint", "", "the etcd member's client URL")
	name := fl.String("name", "", "the name the server stores the snapshot under")
	compression := fl.String("compression", "", `"" or "zstd"`)
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *server == "" || *endpoint == "" || *name == "" {
		return errors.New("agent: -server, -endpoint and -name are required")
	}
	if *compression != "" && *compression != "zstd" {
		return fmt.Errorf("agent: compression %q: only zstd", *compression)
	}

	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{*endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{experimental.WithBufferPool(buffers)}})
	if err != nil {
		return fmt.Errorf("connect to etcd %s: %w", *endpoint, err)
	}
	defer etcd.Close()
	conn, err := grpc.NewClient("passthrough:///"+*server, grpc.WithTransportCredentials(insecure.NewCredentials()),
		experimental.WithBufferPool(buffers), grpc.WithInitialWindowSize(windowBytes), grpc.WithInitialConnWindowSize(windowBytes))
	if err != nil {
		return fmt.Errorf("floor server %s: %w", *server, err)
	}
	defer conn.Close()

	// etcd's stream and the upload end together, whichever fails first.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.NewStream(ctx, &rawcodec.Streams[0], rawcodec.UploadMethod, grpc.ForceCodecV2(rawcodec.Codec{}))
	if err != nil {
		return fmt.Errorf("open upload: %w", err)
	}
	if err := stream.SendMsg([]byte(*name)); err != nil {
		return fmt.Errorf("send the name: %w", err)
	}
	resp, err := etcd.SnapshotWithVersion(ctx)
	if err != nil {
		return fmt.Errorf("snapshot of %s: %w", *endpoint, err)
	}
	snap := resp.Snapshot
	defer snap.Close()

	check := &trailerCheck{sum: sha256.New()}
	out := &chunkSender{stream: stream}
	if *compression == "" {
		err = sendRaw(snap, check, out)
	} else {
		err = sendZstd(snap, check, out)
	}
	if err != nil {
		return err
	}
	if !check.ok() {
		return fmt.Errorf("snapshot of %s: etcd's SHA-256 trailer does not match its %d bytes", *endpoint, check.size)
	}
	if err := stream.CloseSend(); err != nil {
		return fmt.Errorf("end upload: %w", err)
	}
	var reply []byte
	if err := stream.RecvMsg(&reply); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	fmt.Printf("{\"rawSize\":%d,\"size\":%d,\"stored\":%q}\n", check.size, out.sent, reply)
	return nil
}

// sendRaw reads the snapshot straight into the buffers gRPC sends, hashing
// each once.
func sendRaw(snap io.Reader, check *trailerCheck, out *chunkSender) error {
	for {
		bp := buffers.Get(uploadChunkBytes)
		n, err := io.ReadFull(snap, *bp)
		if n > 0 {
			*bp = (*bp)[:n]
			check.Write(*bp)
			if serr := out.send(mem.NewBuffer(bp, buffers)); serr != nil {
				return serr
			}
		} else {
			buffers.Put(bp)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
	}
}

// sendZstd hashes the snapshot and compresses it as the product's agent
// does (klauspost's zstd, its default level, one encoder goroutine),
// sending what comes out in chunks.
func sendZstd(snap io.Reader, check *trailerCheck, out *chunkSender) error {
	enc, err := zstd.NewWriter(out, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("zstd: %w", err)
	}
	if _, err := io.Copy(enc, io.TeeReader(snap, check)); err != nil {
		enc.Close()
		return fmt.Errorf("compress snapshot: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("compress snapshot: %w", err)
	}
	return out.flush()
}

// chunkSender sends bytes on the upload stream in uploadChunkBytes
// messages: whole buffers as they are (send), or written bytes gathered
// into pooled buffers (Write, flush).
type chunkSender struct {
	stream grpc.ClientStream
	cur    *[]byte // the buffer Write fills, nil when none
	sent   int64
}

func (c *chunkSender) send(b mem.Buffer) error {
	n := b.Len()
	err := c.stream.SendMsg(mem.BufferSlice{b})
	b.Free()
	if err != nil {
		// The server's status, not the send's io.EOF, says why.
		var reply []byte
		if rerr := c.stream.RecvMsg(&reply); rerr != nil && !errors.Is(rerr, io.EOF) {
			err = rerr
		}
		return fmt.Errorf("send chunk: %w", err)
	}
	c.sent += int64(n)
	return nil
}

func (c *chunkSender) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if c.cur == nil {
			c.cur = buffers.Get(uploadChunkBytes)
			*c.cur = (*c.cur)[:0]
		}
		k := copy((*c.cur)[len(*c.cur):uploadChunkBytes], p)
		*c.cur = (*c.cur)[:len(*c.cur)+k]
		p, written = p[k:], written+k
		if len(*c.cur) == uploadChunkBytes {
			if err := c.flush(); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

// flush sends what Write gathered.
func (c *chunkSender) flush() error {
	if c.cur == nil {
		return nil
	}
	b := c.cur
	c.cur = nil
	return c.send(mem.NewBuffer(b, buffers))
}

// trailerCheck is the one SHA-256 pass over the snapshot: it hashes all
// but the last 32 bytes seen, which etcd's trailer must equal.
type trailerCheck struct {
	sum  hash.Hash
	tail []byte
	size int64
}

const trailerBytes = sha256.Size

func (c *trailerCheck) Write(p []byte) (int, error) {
	c.size += int64(len(p))
	if len(p) >= trailerBytes {
		c.sum.Write(c.tail)
		c.sum.Write(p[:len(p)-trailerBytes])
		c.tail = append(c.tail[:0], p[len(p)-trailerBytes:]...)
		return len(p), nil
	}
	c.tail = append(c.tail, p...)
	if over := len(c.tail) - trailerBytes; over > 0 {
		c.sum.Write(c.tail[:over])
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
	return len(p), nil
}

func (c *trailerCheck) ok() bool {
	return len(c.tail) == trailerBytes && bytes.Equal(c.sum.Sum(nil), c.tail)
}
