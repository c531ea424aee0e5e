package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

func startServer(t *testing.T) string {
	return servertest.Start(t, "").Addr
}

// cuttingProxy forwards TCP connections to a backend and cuts every
// connection once cutAfter bytes went from the backend to the client, for
// the first cuts connections to carry that many: the real failure a
// dropped tunnel causes.
// A resetting one cuts at the next HTTP/2 DATA frame instead, sending the
// client a RST_STREAM (INTERNAL_ERROR) for that frame's stream first, as
// an HTTP/2 intermediary that lost its upstream does: gRPC's transport
// then fails the call with Internal, not Unavailable.
type cuttingProxy struct {
	lis      net.Listener
	backend  string
	cutAfter int64
	reset    bool
	cuts     atomic.Int32 // cuts left
	cutDone  atomic.Int32 // cuts made
	wg       sync.WaitGroup
}

func newCuttingProxy(t *testing.T, backend string, cutAfter int64, cuts int32) *cuttingProxy {
	return startCuttingProxy(t, &cuttingProxy{backend: backend, cutAfter: cutAfter}, cuts)
}

func newResettingProxy(t *testing.T, backend string, cutAfter int64, cuts int32) *cuttingProxy {
	return startCuttingProxy(t, &cuttingProxy{backend: backend, cutAfter: cutAfter, reset: true}, cuts)
}

func startCuttingProxy(t *testing.T, p *cuttingProxy, cuts int32) *cuttingProxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.lis = lis
	p.cuts.Store(cuts)
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { lis.Close(); p.wg.Wait() })
	return p
}

func (p *cuttingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(b, c); b.Close() }()
		go func() {
			defer p.wg.Done()
			p.forward(c, b)
			c.Close()
			b.Close()
		}()
	}
}

// forward copies from the backend to the client, cutting the connection
// once cutAfter bytes went by if cuts are left. The decision is taken at
// that point, not when the connection is accepted, so the cuts land on
// the first connections that carry enough bytes, whatever order the
// client happens to open them in, and cutDone counts only cuts made.
func (p *cuttingProxy) forward(client net.Conn, backend net.Conn) {
	take := func() bool { return p.cuts.Add(-1) >= 0 }
	if p.reset {
		if resetStreamAfter(client, backend, p.cutAfter, take) {
			p.cutDone.Add(1)
		}
		return
	}
	if n, err := io.CopyN(client, backend, p.cutAfter); err != nil || n < p.cutAfter {
		return
	}
	if take() {
		p.cutDone.Add(1)
		return
	}
	io.Copy(client, backend)
}

// HTTP/2 frame types and the error code resetStreamAfter sends (RFC 9113).
const (
	frameData       = 0x0
	frameRSTStream  = 0x3
	errCodeInternal = 0x2
)

// resetStreamAfter copies HTTP/2 frames from server to client (the
// server sends no preface of its own: frames from the first byte) until n
// bytes went by, then, in place of the next DATA frame, sends the client
// a RST_STREAM (INTERNAL_ERROR) for that frame's stream, if take allows;
// otherwise it forwards the rest unchanged. It reports whether it reset a
// stream before the server's side ended.
func resetStreamAfter(client io.Writer, server io.Reader, n int64, take func() bool) bool {
	var hdr [9]byte // length (24 bits), type, flags, stream
	var sent int64
	for {
		if _, err := io.ReadFull(server, hdr[:]); err != nil {
			return false
		}
		payload := make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
		if _, err := io.ReadFull(server, payload); err != nil {
			return false
		}
		stream := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
		if hdr[3] == frameData && stream != 0 && sent >= n {
			if !take() {
				if _, err := client.Write(append(hdr[:], payload...)); err != nil {
					return false
				}
				io.Copy(client, server)
				return false
			}
			rst := []byte{0, 0, 4, frameRSTStream, 0, 0, 0, 0, 0, 0, 0, 0, errCodeInternal}
			binary.BigEndian.PutUint32(rst[5:9], stream)
			_, err := client.Write(rst)
			return err == nil
		}
		if _, err := client.Write(append(hdr[:], payload...)); err != nil {
			return false
		}
		sent += int64(len(hdr) + len(payload))
	}
}

func dial(t *testing.T, addr string) *client.Client {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return client.New(conn)
}

func TestDownloadResumesAcrossBrokenConnections(t *testing.T) {
	addr := startServer(t)
	// The server stores only what ends in etcd's trailer: 24 MiB + 32.
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(24<<20))
	if _, err := dial(t, addr).Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "big"}, nil); err != nil {
		t.Fatal(err)
	}
	proxy := newCuttingProxy(t, addr, 5<<20, 2)
	c := dial(t, proxy.lis.Addr().String())
	var out bytes.Buffer
	var headers int
	b, err := c.Download(context.Background(), &out, client.DownloadRequest{
		Name:     "big",
		OnHeader: func(*ebv1.Backup) error { headers++; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if proxy.cutDone.Load() != 2 {
		t.Fatalf("the proxy cut %d connections, want 2: the test did not exercise resuming", proxy.cutDone.Load())
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("resumed download differs: %d bytes vs %d", out.Len(), len(data))
	}
	if sum := sha256.Sum256(out.Bytes()); b.GetSha256() != hexs(sum[:]) {
		t.Fatal("sha mismatch")
	}
	if headers != 1 {
		t.Fatalf("OnHeader called %d times, want once", headers)
	}
}

func TestDownloadGivesUpWithoutProgress(t *testing.T) {
	addr := startServer(t)
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1<<20))
	if _, err := dial(t, addr).Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "b"}, nil); err != nil {
		t.Fatal(err)
	}
	// Every connection is cut before any chunk arrives.
	proxy := newCuttingProxy(t, addr, 100, 1000)
	c := dial(t, proxy.lis.Addr().String())
	c.Retry.Timeout = time.Second
	_, err := c.Download(context.Background(), io.Discard, client.DownloadRequest{Name: "b"})
	var gave *client.GiveUpError
	if !errors.As(err, &gave) || proxy.cutDone.Load() < 2 {
		t.Fatalf("got %v after %d cuts, want a give-up error after several attempts", err, proxy.cutDone.Load())
	}
}

func TestCorruptPrefixIsDetected(t *testing.T) {
	addr := startServer(t)
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1))
	c := dial(t, addr)
	if _, err := c.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "b"}, nil); err != nil {
		t.Fatal(err)
	}
	wrong := append([]byte(nil), data[:3]...)
	wrong[0] ^= 1
	prefix := sha256.New()
	prefix.Write(wrong) // not what the backup starts with
	_, err := c.Download(context.Background(), io.Discard, client.DownloadRequest{Name: "b", Offset: 3, Prefix: prefix})
	if !errors.Is(err, client.ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
}

func hexs(b []byte) string { return hex.EncodeToString(b) }

func TestDownloadFileResumesAndRemovesCorruptPart(t *testing.T) {
	c := dial(t, startServer(t))
	// 3 MiB + 32 (etcd's trailer): like the 3 MiB + 9 it replaces, not a
	// whole number of chunks.
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(3<<20+9))
	if _, err := c.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "f"}, nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := dir + "/f.db"
	if err := os.WriteFile(path+".part", data[:1<<20], 0o600); err != nil {
		t.Fatal(err)
	}
	var resumedAt int64
	if _, err := c.DownloadFile(context.Background(), client.FileDownload{
		Path: path, DownloadRequest: client.DownloadRequest{Name: "f"},
		OnResume: func(_ string, off int64) { resumedAt = off },
	}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) || resumedAt != 1<<20 {
		t.Fatalf("resumed at %d, %d bytes equal=%v, err %v", resumedAt, len(got), bytes.Equal(got, data), err)
	}
	if _, err := os.Stat(path + ".part"); !os.IsNotExist(err) {
		t.Fatal(".part left behind")
	}
	// The destination exists now: refused without Replace, kept complete
	// in the .part.
	_, err = c.DownloadFile(context.Background(), client.FileDownload{Path: path, DownloadRequest: client.DownloadRequest{Name: "f"}})
	if !errors.Is(err, client.ErrExists) {
		t.Fatalf("got %v, want ErrExists", err)
	}
	os.Remove(path + ".part")
	// A .part that is not a prefix of the backup is removed.
	bad := append([]byte(nil), data[:1000]...)
	bad[7] ^= 1
	other := dir + "/g.db"
	if err := os.WriteFile(other+".part", bad, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = c.DownloadFile(context.Background(), client.FileDownload{Path: other, DownloadRequest: client.DownloadRequest{Name: "f"}})
	if !errors.Is(err, client.ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
	for _, p := range []string{other, other + ".part"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s exists after a corrupt download", p)
		}
	}
}
