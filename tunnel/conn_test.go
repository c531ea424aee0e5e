package tunnel

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	streamhttp "k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// kubelet is the far end of a port-forward over real SPDY on loopback TCP,
// as the kubelet serves it: it echoes the data stream and, when told,
// writes a complaint on the error stream.
type kubelet struct {
	conn      streamhttp.Connection
	mu        sync.Mutex
	headers   []map[string]string
	errStream chan streamhttp.Stream
}

func startKubelet(t *testing.T) (*kubelet, streamhttp.Connection) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
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
	cc, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	k := &kubelet{errStream: make(chan streamhttp.Stream, 1)}
	k.conn, err = spdy.NewServerConnection(sc, func(s streamhttp.Stream, replySent <-chan struct{}) error {
		h := s.Headers()
		k.mu.Lock()
		k.headers = append(k.headers, map[string]string{
			"type": h.Get(corev1.StreamType), "port": h.Get(corev1.PortHeader), "id": h.Get(corev1.PortForwardRequestIDHeader),
		})
		k.mu.Unlock()
		go func() {
			<-replySent
			if h.Get(corev1.StreamType) == corev1.StreamTypeError {
				k.errStream <- s
				return
			}
			_, _ = io.Copy(s, s)
			s.Close()
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	client, err := spdy.NewClientConnection(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); k.conn.Close() })
	return k, client
}

func openTestConn(t *testing.T) (*kubelet, *Conn) {
	t.Helper()
	k, sc := startKubelet(t)
	d, _ := testDialer(t, Target{})
	c, err := d.openStreams(sc, &Endpoint{Pod: pod("server-1"), Port: 9443})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return k, c
}

// readErr reads until the tunnel fails, bounded so a hang is a failure.
func readErr(t *testing.T, c *Conn) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		if err == nil {
			err = io.EOF
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Read did not return after the tunnel failed")
		return nil
	}
}

func TestConnCarriesBytesBothWays(t *testing.T) {
	k, c := openTestConn(t)
	msg := strings.Repeat("etcd snapshot bytes ", 5000)
	go func() { _, _ = io.WriteString(c, msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != msg {
		t.Fatal("echoed bytes differ")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	// The two streams are created side by side (the kubelet pairs them by
	// request id, in either order).
	types := map[string]bool{}
	for _, h := range k.headers {
		types[h["type"]] = true
	}
	if len(k.headers) != 2 || !types["error"] || !types["data"] {
		t.Fatalf("streams %v, want one error stream and one data stream", k.headers)
	}
	for _, h := range k.headers {
		if h["port"] != "9443" || h["id"] != k.headers[0]["id"] || h["id"] == "" {
			t.Fatalf("stream headers %v: want port 9443 and one request id for both", k.headers)
		}
	}
	if c.RemoteAddr().String() != "pod eb-system/server-1 port 9443" || c.RemoteAddr().Network() != "portforward" {
		t.Fatalf("RemoteAddr %s/%s", c.RemoteAddr().Network(), c.RemoteAddr())
	}
}

// The kubelet's complaint on the error stream closes the tunnel and is
// what the next Read returns, so gRPC reports it and re-dials.
func TestConnFailsWithKubeletError(t *testing.T) {
	k, c := openTestConn(t)
	es := <-k.errStream
	if _, err := io.WriteString(es, "an error occurred forwarding 9443 -> 9443: connection refused\n"); err != nil {
		t.Fatal(err)
	}
	es.Close()
	err := readErr(t, c)
	if want := "port-forward to pod eb-system/server-1 port 9443: an error occurred forwarding 9443 -> 9443: connection refused"; err == nil || err.Error() != want {
		t.Fatalf("Read: %v, want %q", err, want)
	}
	if _, err := c.Write([]byte("x")); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Write after failure: %v", err)
	}
}

func TestConnFailsWhenAPIServerConnectionCloses(t *testing.T) {
	k, c := openTestConn(t)
	k.conn.Close()
	// The data stream may end (EOF) a moment before the close is noticed;
	// either way Read returns, and the tunnel is then closed with the cause.
	readErr(t, c)
	select {
	case <-c.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel is not closed 10s after its API server connection")
	}
	want := "port-forward to pod eb-system/server-1 port 9443: connection to the API server closed"
	if _, err := c.Write([]byte("x")); err == nil || err.Error() != want {
		t.Fatalf("Write after the API server connection closed: %v, want %q", err, want)
	}
}

func TestConnCloseIsIdempotent(t *testing.T) {
	_, c := openTestConn(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Close() }()
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}
