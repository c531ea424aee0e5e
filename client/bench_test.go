package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// benchDialOptions mirror plugin/connect.go's dialOptions (unexported
// there): plain-text gRPC with the plugin's keepalive and client.DialOptions.
var benchDialOptions = append([]grpc.DialOption{
	grpc.WithTransportCredentials(insecure.NewCredentials()),
	grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
}, client.DialOptions...)

// rawBufBytes is the buffer of the raw TCP baseline on both ends: the
// size of the chunks the client uploads and the server sends.
const rawBufBytes = client.ChunkBytes

// BenchmarkTransfer measures, in the same iteration and side by side on
// the same noisy machine, the plugin's gRPC data path (a real server.Server
// on a filesystem location, a real client over loopback TCP) against a raw
// TCP byte stream of the same size on loopback, and how much the data path
// allocates per MiB. The allocation per MiB must stay flat from 64 MiB to
// 1 GiB: a stream's memory is bounded by its chunk, never by the backup.
//
//	go test -run '^$' -bench Transfer -benchtime 1x ./client/
func BenchmarkTransfer(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int64
	}{
		{"64MiB", 64 << 20},
		{"1GiB", 1 << 30},
	} {
		b.Run(size.name, func(b *testing.B) { benchTransfer(b, size.bytes) })
	}
}

func benchTransfer(b *testing.B, size int64) {
	ctx := context.Background()
	c, stop := startBenchServer(b)
	defer stop()
	// Connect before timing anything.
	if _, err := c.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{}); err != nil {
		b.Fatalf("GetServerInfo: %v", err)
	}
	pattern := newPattern()
	upload := newTrailedPattern(pattern, size)
	stored := size + sha256.Size
	mib := float64(size) / (1 << 20)

	var rawDur, upDur, downDur time.Duration
	var upAlloc, downAlloc uint64
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("bench-%d", i)
		// The raw baseline alternates between first and last so that
		// neither path always runs on a warmer (or more fragmented)
		// machine.
		if i%2 == 0 {
			rawDur += rawTCP(b, pattern, size)
		}

		// Upload: the client reads a generated stream, hashes it and
		// sends 256 KiB chunks; the server hashes, writes to disk and
		// fsyncs before it commits, so disk speed is part of this number.
		alloc := totalAlloc()
		start := time.Now()
		bk, err := c.Upload(ctx, upload.Reader(), &ebv1.UploadHeader{Name: name}, nil)
		upDur += time.Since(start)
		upAlloc += totalAlloc() - alloc
		if err != nil {
			b.Fatalf("upload: %v", err)
		}
		if bk.GetSize() != stored {
			b.Fatalf("uploaded %d bytes, want %d", bk.GetSize(), stored)
		}

		// Download what was just uploaded, into io.Discard: the client
		// verifies the SHA-256 of the whole backup as the plugin does.
		alloc = totalAlloc()
		start = time.Now()
		cw := &countingWriter{}
		bk, err = c.Download(ctx, cw, client.DownloadRequest{Name: name})
		downDur += time.Since(start)
		downAlloc += totalAlloc() - alloc
		if err != nil {
			b.Fatalf("download: %v", err)
		}
		if cw.n != stored || bk.GetSize() != stored {
			b.Fatalf("downloaded %d bytes of %d, want %d", cw.n, bk.GetSize(), stored)
		}

		if i%2 == 1 {
			rawDur += rawTCP(b, pattern, size)
		}
		// Keep the disk use at one backup, whatever b.N.
		if _, err := c.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: name}); err != nil {
			b.Fatalf("delete: %v", err)
		}
		i++
	}

	n := float64(i)
	// By size: the upload's 32 bytes of etcd's trailer are not worth
	// counting.
	mbps := func(d time.Duration) float64 { return float64(size) * n / d.Seconds() / 1e6 }
	raw, up, down := mbps(rawDur), mbps(upDur), mbps(downDur)
	b.ReportMetric(raw, "raw-MB/s")
	b.ReportMetric(down, "download-MB/s")
	b.ReportMetric(up, "upload-MB/s")
	b.ReportMetric(down/raw, "download/raw")
	b.ReportMetric(up/raw, "upload/raw")
	// Bytes allocated (runtime TotalAlloc) per MiB transferred. The server
	// runs in this process, so this is client and server together: what
	// gRPC, protobuf, hashing and storage allocate for one stream.
	b.ReportMetric(float64(downAlloc)/n/mib, "download-alloc-B/MiB")
	b.ReportMetric(float64(upAlloc)/n/mib, "upload-alloc-B/MiB")
}

// startBenchServer serves a real server.Server over a filesystem location
// in a temporary directory on a loopback TCP port and returns a client
// dialled the way the plugin dials. stop ends both and waits for Serve.
func startBenchServer(b *testing.B) (*client.Client, func()) {
	c, _, stop := startBenchServerAddr(b)
	return c, stop
}

// startBenchServerAddr is startBenchServer that also returns the
// server's address, for more connections.
func startBenchServerAddr(b *testing.B) (*client.Client, string, func()) {
	b.Helper()
	loc, err := filesystem.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, server.Listeners{Users: lis}, 10*time.Second) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), benchDialOptions...)
	if err != nil {
		cancel()
		<-served
		b.Fatal(err)
	}
	return client.New(conn), lis.Addr().String(), func() {
		conn.Close()
		cancel()
		if err := <-served; err != nil {
			b.Errorf("Serve: %v", err)
		}
	}
}

// rawTCP sends size bytes of the pattern over a fresh loopback TCP
// connection, one goroutine writing and this one reading into io.Discard,
// both with 256 KiB buffers, and returns how long the bytes took to cross.
func rawTCP(b *testing.B, pattern []byte, size int64) time.Duration {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	rc, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	wc, ok := <-accepted
	if !ok {
		b.Fatal("raw baseline: accept failed")
	}

	start := time.Now()
	written := make(chan error, 1)
	go func() {
		defer wc.Close()
		r := &patternReader{pattern: pattern, remaining: size}
		buf := make([]byte, rawBufBytes)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if _, werr := wc.Write(buf[:n]); werr != nil {
					written <- werr
					return
				}
			}
			if errors.Is(err, io.EOF) {
				written <- nil
				return
			}
		}
	}()
	// Not io.Copy: io.Discard's ReadFrom would read 8 KiB at a time.
	buf := make([]byte, rawBufBytes)
	var got int64
	var rerr error
	for rerr == nil {
		var n int
		n, rerr = rc.Read(buf)
		got += int64(n)
		_, _ = io.Discard.Write(buf[:n])
	}
	d := time.Since(start)
	if werr := <-written; werr != nil {
		b.Fatalf("raw baseline: write: %v", werr)
	}
	if !errors.Is(rerr, io.EOF) || got != size {
		b.Fatalf("raw baseline: read %d of %d bytes: %v", got, size, rerr)
	}
	return d
}

// patternPeriod is odd so that the stream does not repeat in step with
// any power-of-two chunk or buffer size.
const patternPeriod = 1<<20 + 4093

// newPattern returns a deterministic pseudo-random block. Generating the
// whole stream with ChaCha8 runs at ~800 MB/s on this kind of machine,
// slower than the paths measured; repeating a block costs only a copy.
func newPattern() []byte {
	p := make([]byte, patternPeriod)
	_, _ = rand.NewChaCha8([32]byte{'e', 't', 'c', 'd'}).Read(p)
	return p
}

// patternReader yields remaining bytes of pattern, repeated: a backup of
// any size without holding it in memory.
type patternReader struct {
	pattern   []byte
	off       int
	remaining int64
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.remaining == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.remaining {
		p = p[:r.remaining]
	}
	n := 0
	for n < len(p) {
		k := copy(p[n:], r.pattern[r.off:])
		n += k
		r.off += k
		if r.off == len(r.pattern) {
			r.off = 0
		}
	}
	r.remaining -= int64(n)
	return n, nil
}

// trailedPattern is size bytes of a pattern (size a multiple of 512)
// followed by their SHA-256, as etcd ends a snapshot: the server stores a
// plain upload only if it passes that check. The trailer is worked out
// once, before anything is timed, so that uploading it costs no more than
// the pattern alone.
type trailedPattern struct {
	pattern []byte
	size    int64
	trailer []byte
}

func newTrailedPattern(pattern []byte, size int64) *trailedPattern {
	if size%512 != 0 {
		panic(fmt.Sprintf("trailedPattern of %d bytes: etcd's snapshots are whole 512-byte pages", size))
	}
	h := sha256.New()
	if _, err := io.Copy(h, &patternReader{pattern: pattern, remaining: size}); err != nil {
		panic(err)
	}
	return &trailedPattern{pattern: pattern, size: size, trailer: h.Sum(nil)}
}

// Reader returns the whole stream, size+32 bytes, from its start.
func (p *trailedPattern) Reader() io.Reader {
	return io.MultiReader(&patternReader{pattern: p.pattern, remaining: p.size}, bytes.NewReader(p.trailer))
}

// countingWriter is io.Discard that counts.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

func totalAlloc() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// BenchmarkDownload measures downloads alone, side by side with the raw
// TCP baseline in the same iteration: one stream into io.Discard (what
// `download -o -` does), and DownloadFile into a file in one stream and
// in four ranges over connections of their own (`download --parallel`).
// The file variants include writing 1 GiB to the temporary directory and,
// for the parallel one, reading it back to hash it.
//
//	go test -run '^$' -bench Download -benchtime 1x ./client/
//
// With ETCDBACKUP_BENCH_CPUPROFILE=DIR each variant writes DIR/NAME.cpu, a
// CPU profile of its downloads alone (client and server: one process).
func BenchmarkDownload(b *testing.B) {
	const size = 1 << 30
	ctx := context.Background()
	c, addr, stop := startBenchServerAddr(b)
	defer stop()
	pattern := newPattern()
	if _, err := c.Upload(ctx, newTrailedPattern(pattern, size).Reader(), &ebv1.UploadHeader{Name: "big"}, nil); err != nil {
		b.Fatalf("upload: %v", err)
	}
	connect := func(context.Context) (*client.Client, func(), error) {
		conn, err := grpc.NewClient("passthrough:///"+addr, benchDialOptions...)
		if err != nil {
			return nil, nil, err
		}
		return client.New(conn), func() { conn.Close() }, nil
	}
	dir := b.TempDir()
	for _, v := range []struct {
		name     string
		parallel int // 0: to io.Discard
	}{{"stream", 0}, {"file", 1}, {"file-parallel4", 4}} {
		b.Run(v.name, func(b *testing.B) {
			var rawDur, dlDur time.Duration
			var alloc uint64
			i := 0
			if dir := os.Getenv("ETCDBACKUP_BENCH_CPUPROFILE"); dir != "" {
				f, err := os.Create(filepath.Join(dir, v.name+".cpu"))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					b.Fatal(err)
				}
				defer pprof.StopCPUProfile()
			}
			for b.Loop() {
				if i%2 == 0 {
					rawDur += labelledRaw(b, pattern, size)
				}
				runtime.GC() // the upload's garbage is no part of the download
				a := totalAlloc()
				start := time.Now()
				var err error
				if v.parallel == 0 {
					_, err = c.Download(ctx, io.Discard, client.DownloadRequest{Name: "big"})
				} else {
					path := filepath.Join(dir, "big")
					_, err = c.DownloadFile(ctx, client.FileDownload{Path: path, Replace: true, Parallel: v.parallel, Connect: connect,
						DownloadRequest: client.DownloadRequest{Name: "big"}})
					os.Remove(path)
				}
				dlDur += time.Since(start)
				alloc += totalAlloc() - a
				if err != nil {
					b.Fatalf("download: %v", err)
				}
				if i%2 == 1 {
					rawDur += labelledRaw(b, pattern, size)
				}
				i++
			}
			n := float64(i)
			mbps := func(d time.Duration) float64 { return float64(size) * n / d.Seconds() / 1e6 }
			b.ReportMetric(mbps(rawDur), "raw-MB/s")
			b.ReportMetric(mbps(dlDur), "download-MB/s")
			b.ReportMetric(mbps(dlDur)/mbps(rawDur), "download/raw")
			b.ReportMetric(float64(alloc)/n/(size>>20), "alloc-B/MiB")
		})
	}
}

// labelledRaw is rawTCP with its samples labelled path=raw in CPU
// profiles, so that -tagignore path=raw leaves the downloads alone.
func labelledRaw(b *testing.B, pattern []byte, size int64) (d time.Duration) {
	pprof.Do(context.Background(), pprof.Labels("path", "raw"), func(context.Context) { d = rawTCP(b, pattern, size) })
	return d
}
