package sandbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Capture records what crosses node 0's pod network (node 2's, after
// AddNode, only where it crosses node 0): every frame on every interface
// of node 0's network namespace (the pods' veths, the
// CNI bridge), read from an AF_PACKET socket opened inside it, as a pod
// with NET_RAW on the host network would. It keeps no payload: for each
// TCP port it counts packets and payload bytes, and says whether a marker
// was seen in a flow to or from it (searching across segment bounds).
type Capture struct {
	fd     int
	marker []byte
	stop   chan struct{}
	done   chan struct{}

	mu    sync.Mutex
	ports map[uint16]*PortTraffic
	tails map[flowKey][]byte
	err   error
}

// PortTraffic is what a Capture saw to or from one TCP port.
type PortTraffic struct {
	Packets, PayloadBytes int64
	// Marker: the marker appeared in a flow of this port.
	Marker bool
}

type flowKey struct {
	ifindex  int
	src, dst netip.AddrPort
}

// CapturePodNetwork starts capturing on the node's pod network, looking
// for marker. Stop ends it.
func (s *Sandbox) CapturePodNetwork(marker []byte) (*Capture, error) {
	if len(marker) == 0 {
		return nil, errors.New("capture: empty marker")
	}
	fd, err := packetSocketIn("/run/netns/" + netnsName)
	if err != nil {
		return nil, err
	}
	c := &Capture{fd: fd, marker: marker, stop: make(chan struct{}), done: make(chan struct{}),
		ports: map[uint16]*PortTraffic{}, tails: map[flowKey][]byte{}}
	go c.loop()
	return c, nil
}

// packetSocketIn opens an AF_PACKET socket for every protocol inside the
// network namespace at nsPath: a socket stays in the namespace it was
// made in, so only the making thread switches, and back.
func packetSocketIn(nsPath string) (int, error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("capture: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("capture: the node's network namespace: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("capture: enter the node's network namespace: %w", err)
	}
	fd, serr := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked: it ends with its goroutine, never
		// running anything else in the wrong namespace.
		if serr == nil {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("capture: return to the test's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	if serr != nil {
		return -1, fmt.Errorf("capture: AF_PACKET socket: %w", serr)
	}
	// Room for a burst while the reader is descheduled, and a read
	// timeout so Stop is noticed.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("capture: %w", err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (c *Capture) loop() {
	defer close(c.done)
	buf := make([]byte, 256<<10)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			c.mu.Lock()
			c.err = fmt.Errorf("capture: read: %w", err)
			c.mu.Unlock()
			return
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok {
			continue
		}
		c.frame(ll.Ifindex, buf[:n])
	}
}

// frame takes an Ethernet frame carrying IPv4 TCP apart.
func (c *Capture) frame(ifindex int, f []byte) {
	if len(f) < 14 || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_IP {
		return
	}
	ip := f[14:]
	if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != unix.IPPROTO_TCP {
		return
	}
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if total == 0 || total > len(ip) {
		total = len(ip) // a GSO frame may say 0; take what arrived
	}
	if ihl < 20 || total < ihl+20 {
		return
	}
	tcp := ip[ihl:total]
	doff := int(tcp[12]>>4) * 4
	if doff < 20 || doff > len(tcp) {
		return
	}
	src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(tcp[0:2]))
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(tcp[2:4]))
	payload := tcp[doff:]
	key := flowKey{ifindex: ifindex, src: src, dst: dst}
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := false
	if len(payload) > 0 {
		tail := c.tails[key]
		joined := append(append(make([]byte, 0, len(tail)+len(payload)), tail...), payload...)
		seen = bytes.Contains(joined, c.marker)
		keep := min(len(joined), len(c.marker)-1)
		c.tails[key] = append(tail[:0], joined[len(joined)-keep:]...)
	}
	for _, p := range []uint16{src.Port(), dst.Port()} {
		t := c.ports[p]
		if t == nil {
			t = &PortTraffic{}
			c.ports[p] = t
		}
		t.Packets++
		t.PayloadBytes += int64(len(payload))
		t.Marker = t.Marker || seen
	}
}

// Stop ends the capture and returns what it saw, by TCP port.
func (c *Capture) Stop() (map[uint16]PortTraffic, error) {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
	unix.Close(c.fd)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uint16]PortTraffic, len(c.ports))
	for p, t := range c.ports {
		out[p] = *t
	}
	return out, c.err
}
