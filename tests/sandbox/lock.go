package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// lockPath is the machine-wide lock every sandbox holds while it runs: the
// node uses fixed names (its network namespace, its veth, the kubepods
// cgroups, the CNI bridge), so two sandboxes on one machine would collide.
// It lives in /run, which is a tmpfs: a reboot frees it, and the kernel
// releases the flock when the holder dies however it dies.
var lockPath = "/run/etcdbackup-sandbox.lock"

// ErrBusy is returned (wrapped) by Start with Config.NoWait when another
// sandbox holds the machine; the message names it.
var ErrBusy = errors.New("another sandbox is running on this machine")

// machineLock is the held lock; closing the file releases it.
type machineLock struct{ f *os.File }

// lockMachine takes the machine-wide lock. With wait it waits (tests in
// several packages run in parallel and take turns) until ctx ends;
// without, it fails at once with ErrBusy naming the holder. The holder
// writes who it is into the lock file for that message.
func lockMachine(ctx context.Context, dir string, wait bool, logf func(string, ...any)) (*machineLock, error) {
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", lockPath, err)
	}
	announced := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockPath, err)
		}
		holder := readHolder(lockPath)
		if !wait {
			f.Close()
			return nil, fmt.Errorf("%w: %s (lock %s); stop it first", ErrBusy, holder, lockPath)
		}
		if !announced {
			logf("waiting for the sandbox already running on this machine to stop: %s", holder)
			announced = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the other sandbox (%s) to stop: %w", holder, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	who := fmt.Sprintf("pid %d (%s), dir %s, since %s", os.Getpid(), strings.Join(os.Args, " "), dir, time.Now().UTC().Format(time.RFC3339))
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(who+"\n"), 0)
	}
	return &machineLock{f: f}, nil
}

func readHolder(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return "a sandbox whose owner is not recorded"
	}
	return strings.TrimSpace(string(b))
}

func (l *machineLock) release() {
	if l == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = l.f.Close()
}
