//go:build linux

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// netNS is a network namespace the agent created for one Pod: the Pod's
// "sandbox". The agent holds it through an open file descriptor only — no
// bind mount under /run/netns — so nothing outlives the agent: the kernel
// frees the namespace once the descriptor is closed and the last process in
// it has exited.
type netNS struct {
	mu     sync.RWMutex // held shared while the descriptor is in use, exclusively to close it
	file   *os.File
	closed bool
}

// hostNetNS is the agent's own network namespace, which a thread returns to
// after working inside a Pod's.
var hostNetNS = sync.OnceValues(func() (*os.File, error) {
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("open the host network namespace: %w", err)
	}
	return f, nil
})

// errNetNSClosed is returned for work asked of a Pod whose sandbox is gone.
var errNetNSClosed = errors.New("the pod's network namespace is gone")

// newNetNS creates a network namespace with `lo` up and podIP on it. Being
// loopback, every 127.0.0.0/8 address is local in it too — Service
// ClusterIPs (127.96.0.0/16 in the sandbox) included — and nothing else is
// reachable: a Pod reaches the world only through the agent's proxy.
func newNetNS(podIP netip.Addr) (*netNS, error) {
	host, err := hostNetNS()
	if err != nil {
		return nil, err
	}
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	// A goroutine of its own, locked to its thread: unshare(CLONE_NEWNET)
	// moves only the calling thread. If the thread cannot be put back into
	// the host namespace, the goroutine exits still locked and the Go
	// runtime destroys the thread rather than reuse it.
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("unshare network namespace: %w", err)}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err == nil {
			if err = configureLoopback(podIP); err != nil {
				f.Close()
				f = nil
			}
		} else {
			err = fmt.Errorf("open the new network namespace: %w", err)
		}
		if rerr := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); rerr != nil {
			if f != nil {
				f.Close()
			}
			done <- result{err: fmt.Errorf("return to the host network namespace: %w", rerr)}
			return // still locked: the thread is thrown away
		}
		runtime.UnlockOSThread()
		done <- result{f: f, err: err}
	}()
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	return &netNS{file: r.f}, nil
}

// configureLoopback brings `lo` up and adds ip to it as a /32, on the
// calling thread's network namespace, with the classic interface ioctls
// (no netlink library needed for this much).
func configureLoopback(ip netip.Addr) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for interface ioctls: %w", err)
	}
	defer unix.Close(fd)
	lo, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, lo); err != nil {
		return fmt.Errorf("get flags of lo: %w", err)
	}
	lo.SetUint16(lo.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, lo); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	if !ip.IsValid() {
		return nil
	}
	// "lo:pod" is the address' label, as `ip addr add … label lo:pod`.
	addr, err := unix.NewIfreq("lo:pod")
	if err != nil {
		return err
	}
	if err := addr.SetInet4Addr(ip.AsSlice()); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, addr); err != nil {
		return fmt.Errorf("add %s to lo: %w", ip, err)
	}
	mask, err := unix.NewIfreq("lo:pod")
	if err != nil {
		return err
	}
	if err := mask.SetInet4Addr([]byte{255, 255, 255, 255}); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, mask); err != nil {
		return fmt.Errorf("set netmask of %s: %w", ip, err)
	}
	return nil
}

// do runs fn on a thread inside the namespace. Sockets fn creates belong to
// the namespace for good, wherever they are used afterwards.
func (n *netNS) do(fn func() error) error {
	host, err := hostNetNS()
	if err != nil {
		return err
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return errNetNSClosed
	}
	done := make(chan error, 1)
	// Same thread discipline as newNetNS: a fresh goroutine, locked, and a
	// thread that could not go home dies with its goroutine.
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(n.file.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter the pod's network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("return to the host network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Dial connects to addr from inside the namespace.
func (n *netNS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a TCP listener inside the namespace.
func (n *netNS) Listen(addr string) (net.Listener, error) {
	var l net.Listener
	err := n.do(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// netnsFile is the open descriptor of a network namespace.
type netnsFile = os.File

// withFile calls fn with the namespace's descriptor held open (for handing
// it to a container's shim, or to netlink).
func (n *netNS) withFile(fn func(*netnsFile) error) error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return errNetNSClosed
	}
	return fn(n.file)
}

// Close drops the agent's reference; the namespace disappears once its last
// process has exited too.
func (n *netNS) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	return n.file.Close()
}
