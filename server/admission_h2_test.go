package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2client is an attacker's HTTP/2 client: it sends exactly the frames a
// test asks for (HEADERS without a request, a request's first bytes and
// never its last) and records what the server answers. It keeps to the
// flow-control windows the server grants, as it must to stay connected.
type h2client struct {
	c      net.Conn
	scheme string

	wmu    sync.Mutex // writes: the test's and the read loop's acks
	fr     *http2.Framer
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
	nextID uint32

	mu         sync.Mutex
	cond       *sync.Cond
	connWindow int64
	initWindow int64
	streams    map[uint32]*h2stream
	pongs      map[[8]byte]bool
	goAway     bool
	err        error // why the read loop ended
}

// h2stream is what the server said about one stream.
type h2stream struct {
	window   int64
	sent     int64 // DATA bytes sent
	updated  bool  // the server opened its window
	answered bool  // headers with a grpc-status, or a reset
	status   string
	message  string
	reset    bool
}

// errSkipSource is dialH2's error when the test cannot send from another
// loopback address.
var errSkipSource = errors.New("cannot send from this source address")

// dialH2 connects from source (an IP address of the loopback) to addr,
// with TLS when cfg is set, and waits for the server's SETTINGS: an error
// says the server closed the connection before it spoke HTTP/2.
func dialH2(addr, source string, cfg *tls.Config) (*h2client, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		return nil, fmt.Errorf("%w %s: %v", errSkipSource, source, err)
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, source, err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	scheme := "http"
	if cfg != nil {
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		c, scheme = tc, "https"
	}
	h := &h2client{c: c, scheme: scheme, nextID: 1, connWindow: 65535, initWindow: 65535,
		streams: map[uint32]*h2stream{}, pongs: map[[8]byte]bool{}}
	h.cond = sync.NewCond(&h.mu)
	h.fr = http2.NewFramer(c, c)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.enc = hpack.NewEncoder(&h.hbuf)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return nil, fmt.Errorf("preface: %w", err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		c.Close()
		return nil, fmt.Errorf("settings: %w", err)
	}
	f, err := h.fr.ReadFrame()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("the server's SETTINGS: %w", err)
	}
	h.handle(f)
	_ = c.SetDeadline(time.Time{})
	go h.readLoop()
	return h, nil
}

func (h *h2client) Close() { h.c.Close() }

func (h *h2client) readLoop() {
	for {
		f, err := h.fr.ReadFrame()
		h.mu.Lock()
		if err != nil {
			h.err = err
			h.cond.Broadcast()
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		h.handle(f)
	}
}

func (h *h2client) handle(f http2.Frame) {
	var ack func() error
	h.mu.Lock()
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			break
		}
		_ = f.ForeachSetting(func(s http2.Setting) error {
			if s.ID == http2.SettingInitialWindowSize {
				for _, st := range h.streams {
					st.window += int64(s.Val) - h.initWindow
				}
				h.initWindow = int64(s.Val)
			}
			return nil
		})
		ack = h.fr.WriteSettingsAck
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			h.connWindow += int64(f.Increment)
		} else if st := h.streams[f.StreamID]; st != nil {
			st.window += int64(f.Increment)
			st.updated = true
		}
	case *http2.MetaHeadersFrame:
		if st := h.streams[f.StreamID]; st != nil {
			if v := f.PseudoValue("status"); v != "" && v != "200" {
				st.answered, st.status = true, "http "+v
			}
			for _, hf := range f.RegularFields() {
				switch hf.Name {
				case "grpc-status":
					st.answered, st.status = true, hf.Value
				case "grpc-message":
					st.message, _ = url.PathUnescape(hf.Value)
				}
			}
		}
	case *http2.RSTStreamFrame:
		if st := h.streams[f.StreamID]; st != nil {
			st.answered, st.reset = true, true
		}
	case *http2.PingFrame:
		if f.IsAck() {
			h.pongs[f.Data] = true
		} else {
			data := f.Data
			ack = func() error { return h.fr.WritePing(true, data) }
		}
	case *http2.GoAwayFrame:
		h.goAway = true
	}
	h.cond.Broadcast()
	h.mu.Unlock()
	if ack != nil {
		h.wmu.Lock()
		_ = ack()
		h.wmu.Unlock()
	}
}

// open starts a call to method with the given metadata (name, value
// pairs) and sends nothing more: a half-open call.
func (h *h2client) open(method string, md ...string) (uint32, error) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	id := h.nextID
	h.nextID += 2
	h.hbuf.Reset()
	fields := []string{":method", "POST", ":scheme", h.scheme, ":path", method, ":authority", "etcdbackup",
		"content-type", "application/grpc", "te", "trailers"}
	for i := 0; i+1 < len(fields); i += 2 {
		if err := h.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]}); err != nil {
			return 0, err
		}
	}
	for i := 0; i+1 < len(md); i += 2 {
		if err := h.enc.WriteField(hpack.HeaderField{Name: md[i], Value: md[i+1]}); err != nil {
			return 0, err
		}
	}
	h.mu.Lock()
	h.streams[id] = &h2stream{window: h.initWindow}
	h.mu.Unlock()
	return id, h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hbuf.Bytes(), EndHeaders: true})
}

// send sends on stream id (more of) a message that declares declared
// bytes: as much as the server's windows let through now, never its last
// byte. It stops at the stream's window, which a server reading the
// message opens to the declared length; called again, it goes on from
// where it stopped. It returns the bytes sent.
func (h *h2client) send(id uint32, declared uint32, deadline time.Time) (int64, error) {
	msg := make([]byte, 5+int(declared)-1)
	binary.BigEndian.PutUint32(msg[1:5], declared)
	h.mu.Lock()
	from := h.streams[id].sent
	h.mu.Unlock()
	msg = msg[from:]
	var sent int64
	for sent < int64(len(msg)) {
		h.mu.Lock()
		st := h.streams[id]
		for st.window > 0 && h.connWindow <= 0 && h.err == nil && !st.answered && time.Now().Before(deadline) {
			h.waitLocked(deadline)
		}
		n := min(st.window, h.connWindow, int64(len(msg))-sent, 16<<10)
		stop := h.err != nil || st.answered || n <= 0
		if !stop {
			st.window -= n
			h.connWindow -= n
			st.sent += n
		}
		h.mu.Unlock()
		if stop {
			return sent, nil
		}
		h.wmu.Lock()
		err := h.fr.WriteData(id, false, msg[sent:sent+n])
		h.wmu.Unlock()
		if err != nil {
			return sent, err
		}
		sent += n
	}
	return sent, nil
}

// ping waits until the server has answered a PING: it has read every
// frame sent before.
func (h *h2client) ping(deadline time.Time) error {
	var data [8]byte
	h.wmu.Lock()
	binary.BigEndian.PutUint32(data[:], h.nextID)
	h.nextID += 2 // keeps the pings' data apart; the next stream still takes an odd ID
	err := h.fr.WritePing(false, data)
	h.wmu.Unlock()
	if err != nil {
		return err
	}
	return h.wait(deadline, func() bool { return h.pongs[data] })
}

// answer waits for the server's answer to stream id.
func (h *h2client) answer(id uint32, deadline time.Time) (h2stream, error) {
	err := h.wait(deadline, func() bool { return h.streams[id].answered })
	h.mu.Lock()
	defer h.mu.Unlock()
	return *h.streams[id], err
}

// closed waits until the server has closed the connection.
func (h *h2client) closed(deadline time.Time) error {
	return h.wait(deadline, func() bool { return false })
}

// wait waits until done (called with h.mu held) or the connection ends
// (an error unless done) or deadline passes.
func (h *h2client) wait(deadline time.Time, done func() bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for !done() {
		if h.err != nil {
			return h.err
		}
		if !time.Now().Before(deadline) {
			return context.DeadlineExceeded
		}
		h.waitLocked(deadline)
	}
	return nil
}

// waitLocked waits, h.mu held, for the read loop to record something or
// for deadline.
func (h *h2client) waitLocked(deadline time.Time) {
	t := time.AfterFunc(time.Until(deadline), func() {
		h.mu.Lock()
		h.cond.Broadcast()
		h.mu.Unlock()
	})
	h.cond.Wait()
	t.Stop()
}
