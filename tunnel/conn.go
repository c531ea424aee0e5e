package tunnel

import (
	"net"
	"sync"
	"time"

	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// Conn is one forwarded stream as a net.Conn.
type Conn struct {
	sc       streamhttp.Connection
	data     streamhttp.Stream
	endpoint *Endpoint

	// broke, when set, is told the first time the tunnel breaks (not when
	// it is closed).
	broke func()

	once   sync.Once
	closed chan struct{}
	mu     sync.Mutex
	err    error
}

var _ net.Conn = (*Conn)(nil)

// Endpoint returns the pod and port this connection leads to.
func (c *Conn) Endpoint() *Endpoint { return c.endpoint }

func (c *Conn) Read(p []byte) (int, error) {
	if err := c.closedErr(); err != nil {
		return 0, err
	}
	n, err := c.data.Read(p)
	if err != nil {
		if cause := c.cause(); cause != nil {
			return n, cause
		}
	}
	return n, err
}

// Write fails once the tunnel is closed: a reset SPDY stream would accept
// the bytes and drop them.
func (c *Conn) Write(p []byte) (int, error) {
	if err := c.closedErr(); err != nil {
		return 0, err
	}
	n, err := c.data.Write(p)
	if err != nil {
		if cause := c.cause(); cause != nil {
			return n, cause
		}
	}
	return n, err
}

// closedErr is why the tunnel is closed, nil while it is open.
func (c *Conn) closedErr() error {
	select {
	case <-c.closed:
		if cause := c.cause(); cause != nil {
			return cause
		}
		return net.ErrClosed
	default:
		return nil
	}
}

func (c *Conn) cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail records why the tunnel broke, for the next Read or Write to
// return, and closes it. After Close the tunnel did not break: tearing it
// down is what makes the streams end.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	first := false
	select {
	case <-c.closed:
	default:
		if c.err == nil {
			c.err, first = err, true
		}
	}
	c.mu.Unlock()
	if first && c.broke != nil {
		c.broke()
	}
	c.Close()
}

// Close tears down the forwarded stream and its connection to the API
// server.
func (c *Conn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		_ = c.data.Reset()
		_ = c.sc.Close()
	})
	return nil
}

// LocalAddr implements net.Conn with a placeholder: there is no socket.
func (c *Conn) LocalAddr() net.Addr { return tunnelAddr("local") }

// RemoteAddr implements net.Conn, naming the pod and port.
func (c *Conn) RemoteAddr() net.Addr { return tunnelAddr(c.endpoint.String()) }

// SetDeadline is not supported by port-forward streams; gRPC does not need
// it (its keepalive pings find a dead tunnel).
func (c *Conn) SetDeadline(time.Time) error      { return nil }
func (c *Conn) SetReadDeadline(time.Time) error  { return nil }
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }

type tunnelAddr string

func (a tunnelAddr) Network() string { return "portforward" }
func (a tunnelAddr) String() string  { return string(a) }
