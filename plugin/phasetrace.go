//go:build etcdbackup_trace

package plugin

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Built with the etcdbackup_trace tag (go build -tags etcdbackup_trace),
// KUBECTL_ETCDBACKUP_TRACE=1 prints, on the process's stderr, the
// wall-clock time at which each phase of reaching the server ends, one
// "etcdbackup-trace <unix microseconds> <phase>" line each: with the time
// the process was started (a benchmark's exec) they say where a command's
// latency goes. It is for measuring, not for users: it has no flag, and
// the product's build leaves it out (phasetrace_off.go), so no package
// global there writes around IOStreams.
var traceOn = os.Getenv("KUBECTL_ETCDBACKUP_TRACE") == "1"

// traceInit is when this package was initialised: every package the
// plugin imports is initialised by then.
var traceInit = time.Now()

var traceMu sync.Mutex

// trace notes that phase ended now.
func trace(phase string) {
	if !traceOn {
		return
	}
	traceAt(time.Now(), phase)
}

func traceAt(t time.Time, phase string) {
	if !traceOn {
		return
	}
	traceMu.Lock()
	defer traceMu.Unlock()
	fmt.Fprintf(os.Stderr, "etcdbackup-trace %d %s\n", t.UnixMicro(), phase)
}

// traceFunc is trace, or nil when tracing is off, for packages that take
// a hook.
func traceFunc() func(string) {
	if !traceOn {
		return nil
	}
	return trace
}

// traceHTTP adds the API server connection's phases to the trace.
func traceHTTP(ctx context.Context) context.Context {
	if !traceOn {
		return ctx
	}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart:         func(string, string) { trace("http: connect start") },
		TLSHandshakeDone:     func(tls.ConnectionState, error) { trace("http: TLS handshake done") },
		GotConn:              func(i httptrace.GotConnInfo) { trace(fmt.Sprintf("http: got conn (reused %v)", i.Reused)) },
		GotFirstResponseByte: func() { trace("http: first response byte") },
	})
}

// traceConn notes the first reads and writes on the tunnel: gRPC's
// preface and settings, then each call.
type traceConn struct {
	net.Conn
	reads, writes atomic.Int32
}

func (c *traceConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if i := c.reads.Add(1); i <= 6 {
		trace(fmt.Sprintf("tunnel: read %d (%d bytes)", i, n))
	}
	return n, err
}

func (c *traceConn) Write(p []byte) (int, error) {
	if i := c.writes.Add(1); i <= 6 {
		trace(fmt.Sprintf("tunnel: write %d (%d bytes)", i, len(p)))
	}
	return c.Conn.Write(p)
}

// traceNetConn wraps c in a traceConn when tracing is on.
func traceNetConn(c net.Conn) net.Conn {
	if !traceOn {
		return c
	}
	return &traceConn{Conn: c}
}
