package client_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
)

// BenchmarkDownloadLatency downloads 256 MiB through a proxy that delays
// every byte by 10 ms and by 50 ms each way (a long, fat tunnel), with
// gRPC's default flow control (windows grown by its BDP estimator up to
// 16 MiB), with client.DialOptions (16 MiB from the start), and with
// 64 MiB windows.
//
//	go test -run '^$' -bench DownloadLatency -benchtime 1x ./client/
func BenchmarkDownloadLatency(b *testing.B) {
	const size = 256 << 20
	ctx := context.Background()
	c, addr, stop := startBenchServerAddr(b)
	defer stop()
	if _, err := c.Upload(ctx, newTrailedPattern(newPattern(), size).Reader(), &ebv1.UploadHeader{Name: "big"}, nil); err != nil {
		b.Fatal(err)
	}
	plain := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	for _, delay := range []time.Duration{10 * time.Millisecond, 50 * time.Millisecond} {
		proxy := startDelayProxy(b, addr, delay)
		for _, v := range []struct {
			name string
			opts []grpc.DialOption
		}{
			{"grpc-default", plain},
			{"client.DialOptions", append(plain, client.DialOptions...)},
			{"window64MiB", append(plain, grpc.WithInitialWindowSize(64<<20), grpc.WithInitialConnWindowSize(64<<20))},
		} {
			b.Run(fmt.Sprintf("rtt%s/%s", 2*delay, v.name), func(b *testing.B) {
				conn, err := grpc.NewClient("passthrough:///"+proxy, v.opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close()
				dc := client.New(conn)
				var d time.Duration
				n := 0
				for b.Loop() {
					start := time.Now()
					if _, err := dc.Download(ctx, io.Discard, client.DownloadRequest{Name: "big"}); err != nil {
						b.Fatal(err)
					}
					d += time.Since(start)
					n++
				}
				b.ReportMetric(float64(size)*float64(n)/d.Seconds()/1e6, "download-MB/s")
			})
		}
	}
}

// startDelayProxy forwards connections to backend, holding every read
// for delay before writing it on, in both directions.
func startDelayProxy(b *testing.B, backend string, delay time.Duration) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			go delayCopy(s, c, delay)
			go delayCopy(c, s, delay)
		}
	}()
	return lis.Addr().String()
}

func delayCopy(dst, src net.Conn, delay time.Duration) {
	type packet struct {
		at   time.Time
		data []byte
	}
	ch := make(chan packet, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- packet{time.Now().Add(delay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for p := range ch {
		// The delay is what is simulated (a benchmark's round trip), not
		// a wait for something to happen.
		time.Sleep(time.Until(p.at))
		if _, err := dst.Write(p.data); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}
