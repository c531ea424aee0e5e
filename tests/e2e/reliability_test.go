package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// TestReliability, on real processes through the tunnel: a zstd bomb
// uploaded as a backup is refused by verify and download and leaves the
// server serving; an upload whose server is killed mid-way leaves no
// backup and, retried, stores the file once; 16 downloads and 2 uploads at
// once all arrive byte-identical.
func TestReliability(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := world.DefaultNamespace
	storage, err := c.sb.VolumePath(ctx, ns, "etcdbackup-data")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("zstd-bomb", func(t *testing.T) {
		// 256 MiB of zeros in a few KiB of zstd, recorded as a 1 MiB
		// snapshot: what a caller who may upload can send the server.
		var bomb bytes.Buffer
		enc, err := zstd.NewWriter(&bomb)
		if err != nil {
			t.Fatal(err)
		}
		zeros := make([]byte, 1<<20)
		for range 256 {
			if _, err := enc.Write(zeros); err != nil {
				t.Fatal(err)
			}
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		conn, cl, err := client.Dial(c.serverAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fake := sha256.Sum256([]byte("not the plain snapshot"))
		if _, err := cl.Upload(ctx, bytes.NewReader(bomb.Bytes()), &ebv1.UploadHeader{
			Name: "bomb", Compression: "zstd", RawSize: 1 << 20, RawSha256: hex.EncodeToString(fake[:]),
		}, nil); err != nil {
			t.Fatalf("upload of the crafted backup: %v", err)
		}
		r := mustFail(t, c.run(t, nil, "etcdbackup", "verify", "bomb"), "verify of a zstd bomb")
		if !strings.Contains(r.Stderr, "expands past its recorded size") {
			t.Errorf("verify does not say the backup expands past its size: %s", r.Stderr)
		}
		out := filepath.Join(t.TempDir(), "bomb.db")
		r = mustFail(t, c.run(t, nil, "etcdbackup", "download", "bomb", "-o", out), "download of a zstd bomb")
		if !strings.Contains(r.Stderr, "expands past its recorded size") {
			t.Errorf("download does not say the backup expands past its size: %s", r.Stderr)
		}
		if fi, err := os.Stat(out); err == nil {
			t.Errorf("a refused download left %s (%d bytes)", out, fi.Size())
		}
		// The server still serves: its scratch volume did not fill.
		mustSucceed(t, c.run(t, nil, "etcdbackup", "list"), "list after the bomb")
	})

	t.Run("server-killed-mid-upload", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "big.db")
		data := writeSnapshotFile(t, src, 192<<20)
		before := dirSize(t, storage)
		cmd := c.kubectl.Command(ctx, "etcdbackup", "upload", src, "--name", "survivor")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pollUntil(ctx, t, "16 MiB of the upload on the server", func() bool { return dirSize(t, storage)-before > 16<<20 })
		pid := serverPID(t, c.sb)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		t.Logf("server pid %d killed mid-upload", pid)
		// The server is dead, so nothing can commit now: a manifest would
		// mean the half-sent upload became a backup.
		if _, err := os.Stat(filepath.Join(storage, "backups", "survivor.json")); err == nil {
			t.Fatal("a half-sent upload has a manifest")
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("upload across the server's death: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "retrying") {
			t.Errorf("the upload does not say it retried: %s", stderr.String())
		}
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "-o", "name"), "list")
		if strings.Count(r.Stdout, "survivor") != 1 {
			t.Fatalf("survivor listed %d times: %s", strings.Count(r.Stdout, "survivor"), r.Stdout)
		}
		out := filepath.Join(t.TempDir(), "survivor.db")
		mustSucceed(t, c.run(t, nil, "etcdbackup", "download", "survivor", "-o", out, "--raw"), "download")
		mustEqualFile(t, out, data)
	})

	t.Run("16-downloads-2-uploads", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "fan.db")
		data := writeSnapshotFile(t, src, 24<<20)
		mustSucceed(t, c.run(t, nil, "etcdbackup", "upload", src, "--name", "fan"), "upload")
		dir := t.TempDir()
		var wg sync.WaitGroup
		results := make([]world.Result, 18)
		for i := range results {
			wg.Go(func() {
				args := []string{"etcdbackup", "download", "fan", "--raw", "-o", filepath.Join(dir, fmt.Sprintf("fan-%d.db", i))}
				if i >= 16 {
					args = []string{"etcdbackup", "upload", src, "--name", fmt.Sprintf("fan-up-%d", i)}
				}
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Minute)
				defer ccancel()
				results[i] = world.RunCommand(c.kubectl.Command(cctx, args...))
			})
		}
		wg.Wait()
		for i, r := range results {
			mustSucceed(t, r, "transfer "+strconv.Itoa(i))
		}
		for i := range 16 {
			mustEqualFile(t, filepath.Join(dir, fmt.Sprintf("fan-%d.db", i)), data)
		}
		for i := 16; i < 18; i++ {
			out := filepath.Join(dir, fmt.Sprintf("up-%d.db", i))
			mustSucceed(t, c.run(t, nil, "etcdbackup", "download", fmt.Sprintf("fan-up-%d", i), "--raw", "-o", out), "download an upload")
			mustEqualFile(t, out, data)
		}
		hwm, err := world.ReadStatusValue(serverPID(t, c.sb), "VmHWM")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("16 downloads and 2 uploads of 24 MiB through the tunnel, side by side: all identical; server peak RSS %d MiB", hwm/1024)
	})
}

// serverPID is the data server's process on the sandbox's node.
func serverPID(t *testing.T, sb *sandbox.Sandbox) int {
	t.Helper()
	for _, pid := range sb.ContainerPIDs() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err == nil && strings.Contains(string(b), "etcdbackup-server") && !strings.Contains(string(b), "--version") {
			return pid
		}
	}
	t.Fatal("no etcdbackup-server process on the node")
	return 0
}

// dirSize is the bytes of the regular files under dir.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
