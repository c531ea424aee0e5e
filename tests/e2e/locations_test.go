package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// The server binary with a filesystem and an S3 location (a real
// versitygw), and, as root, a third location on a 2 MiB tmpfs:
//   - an upload that does not fit the tmpfs is refused as the location
//     being full, nothing is listed, the earlier backup is intact;
//   - with versitygw stopped (SIGSTOP: it accepts connections and never
//     answers), the server restarts and serves the filesystem location,
//     `version` shows the S3 one unavailable with its error, and calls to
//     it fail naming it; a name without --location is found in the
//     filesystem with a warning, and `list` of every location prints the
//     filesystem's backups, warns about S3 and exits 6 (incomplete);
//   - after SIGCONT the S3 location serves again without a restart.
//
// What is uploaded are real etcd snapshots: upload takes nothing else.
func TestLocations(t *testing.T) {
	s3 := s3test.Start(t)
	dir := t.TempDir()
	small := ""
	if os.Geteuid() == 0 {
		small = filepath.Join(dir, "small")
		if err := os.Mkdir(small, 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", small).CombinedOutput(); err != nil {
			t.Logf("no tmpfs (%v: %s): the full-location part is skipped", err, out)
			small = ""
		} else {
			t.Cleanup(func() {
				if out, err := exec.Command("umount", small).CombinedOutput(); err != nil {
					t.Errorf("umount %s: %v: %s", small, err, out)
				}
			})
		}
	} else {
		t.Log("not root: no tmpfs, the full-location part is skipped")
	}
	config := filepath.Join(dir, "config.yaml")
	cfg := fmt.Sprintf(`locations:
  - name: default
    filesystem: {path: %s}
  - name: s3
    s3:
      bucket: %s
      region: %s
      endpoint: %s
      pathStyle: true
      caBundleFile: %s
      accessKeyIDFile: %s
      secretAccessKeyFile: %s
`, filepath.Join(dir, "fs"), s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile)
	if small != "" {
		cfg += fmt.Sprintf("  - name: small\n    filesystem: {path: %s}\n", small)
	}
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *world.ServerProcess {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv, err := world.StartServerArgs(ctx, binDir, &testLog{t: t, prefix: "server: "}, "--config", config)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Stop() })
		return srv
	}
	srv := start()
	addr := "--server-address=" + srv.Addr

	r := mustSucceed(t, plugin(t, addr, "version"), "version")
	if !strings.Contains(r.Stdout, "Storage Location: s3, s3: s3://"+s3.Bucket+" at "+s3.Endpoint+", available\n") {
		t.Fatalf("version with every location available: %s", r)
	}
	inS3 := filepath.Join(dir, "in-s3")
	inS3Data := etcdtest.SnapshotFile(t, inS3, 300<<10)
	mustSucceed(t, plugin(t, addr, "upload", inS3, "--location", "s3"), "upload to s3")

	if small != "" {
		fits := filepath.Join(dir, "fits")
		fitsData := etcdtest.SnapshotFile(t, fits, 512<<10)
		mustSucceed(t, plugin(t, addr, "upload", fits, "--location", "small"), "upload that fits")
		big := filepath.Join(dir, "too-big")
		etcdtest.SnapshotFile(t, big, 3<<20)
		r = mustFail(t, plugin(t, addr, "upload", big, "--location", "small"), "upload larger than the location")
		if !strings.Contains(r.Stderr, `storage location "small" is full`) || !strings.Contains(r.Stderr, "ResourceExhausted") {
			t.Fatalf("upload larger than the location: %s", r)
		}
		t.Logf("upload larger than the location: %s", strings.TrimSpace(r.Stderr))
		r = mustSucceed(t, plugin(t, addr, "list", "--location", "small", "-o", "name"), "list small")
		if strings.Contains(r.Stdout, "too-big") || !strings.Contains(r.Stdout, "fits") {
			t.Fatalf("list after the refused upload: %s", r)
		}
		if entries, err := os.ReadDir(filepath.Join(small, ".tmp")); err != nil || len(entries) != 0 {
			t.Fatalf("partial data left in %s/.tmp: %d entries, %v", small, len(entries), err)
		}
		out := filepath.Join(dir, "fits.out")
		mustSucceed(t, plugin(t, addr, "download", "fits", "--location", "small", "-o", out), "download the earlier backup")
		mustEqualFile(t, out, fitsData)
	}

	// S3 stops answering; the server restarts meanwhile.
	if err := s3.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			_ = s3.Signal(syscall.SIGCONT)
		}
	})
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	srv = start()
	t.Logf("the server serves %s after its start with S3 stopped", time.Since(began).Round(time.Millisecond))
	addr = "--server-address=" + srv.Addr

	r = mustSucceed(t, plugin(t, addr, "version"), "version with S3 stopped")
	if !strings.Contains(r.Stdout, "Storage Location: default (default), filesystem: "+filepath.Join(dir, "fs")+", available\n") ||
		!strings.Contains(r.Stdout, "Storage Location: s3, s3: s3://"+s3.Bucket+" at "+s3.Endpoint+", unavailable: ") ||
		!strings.Contains(r.Stdout, "no answer within") {
		t.Fatalf("version with S3 stopped: %s", r)
	}
	inFS := filepath.Join(dir, "in-fs")
	inFSData := etcdtest.SnapshotFile(t, inFS, 200<<10)
	mustSucceed(t, plugin(t, addr, "upload", inFS, "--location", "default"), "upload to the filesystem with S3 stopped")
	r = mustSucceed(t, plugin(t, addr, "list", "--location", "default", "-o", "name"), "list the filesystem with S3 stopped")
	if !strings.Contains(r.Stdout, "in-fs") {
		t.Fatalf("list with S3 stopped: %s", r)
	}
	out := filepath.Join(dir, "in-fs.out")
	mustSucceed(t, plugin(t, addr, "download", "in-fs", "--location", "default", "-o", out), "download from the filesystem with S3 stopped")
	mustEqualFile(t, out, inFSData)

	for _, args := range [][]string{
		{"list", "--location", "s3"},
		{"download", "in-s3", "--location", "s3", "-o", filepath.Join(dir, "nothing")},
	} {
		r = mustFail(t, plugin(t, append([]string{addr}, args...)...), strings.Join(args, " ")+" with S3 stopped")
		if !strings.Contains(r.Stderr, `storage location "s3" is unavailable`) || strings.Contains(r.Stderr, "cannot reach the etcdbackup server") {
			t.Fatalf("%v with S3 stopped: the error does not name the location: %s", args, r)
		}
		t.Logf("%v with S3 stopped: %s", args, strings.TrimSpace(r.Stderr))
	}
	// Without --location, a name is found in the locations that answer,
	// with a warning that the unreachable one could not be searched.
	out = filepath.Join(dir, "in-fs.found")
	r = mustSucceed(t, plugin(t, addr, "download", "in-fs", "-o", out), "download without --location with S3 stopped")
	if !strings.Contains(r.Stderr, `Warning: storage location "s3" could not be searched for backup "in-fs" (unavailable: `) ||
		!strings.Contains(r.Stderr, `; using the one in location "default"`) {
		t.Fatalf("download without --location with S3 stopped: %s", r)
	}
	mustEqualFile(t, out, inFSData)
	// A name in none of them may be in the unreachable one: not "not
	// found" (3), but an error saying what could not be searched.
	r = mustFail(t, plugin(t, addr, "get", "in-s3"), "get of a backup in S3 with S3 stopped")
	if !strings.Contains(r.Stderr, `backup "in-s3" is not in storage location`) || !strings.Contains(r.Stderr, `, but location "s3" could not be searched (unavailable: `) ||
		!strings.Contains(r.Stderr, "retry once it is available again") || r.ExitCode != 1 {
		t.Fatalf("get of a backup in S3 with S3 stopped: %s", r)
	}
	// list of every location shows what it can, names the one it cannot,
	// and exits 6: incomplete.
	r = plugin(t, addr, "list", "-o", "name")
	if r.ExitCode != 6 || !strings.Contains(r.Stdout, "backup/in-fs\n") || strings.Contains(r.Stdout, "in-s3") ||
		!strings.Contains(r.Stderr, `Warning: storage location "s3" is unavailable: `) || !strings.Contains(r.Stderr, "; its backups are not listed\n") {
		t.Fatalf("list of every location with S3 stopped: %s", r)
	}

	// S3 answers again: the server finds out by itself.
	if err := s3.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	began = time.Now()
	for {
		r = plugin(t, addr, "list", "--location", "s3", "-o", "name")
		if r.ExitCode == 0 {
			break
		}
		if time.Since(began) > 45*time.Second {
			t.Fatalf("S3 not served again 45s after SIGCONT: %s", r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("S3 served again %s after SIGCONT", time.Since(began).Round(time.Millisecond))
	if !strings.Contains(r.Stdout, "in-s3") {
		t.Fatalf("list of S3 after SIGCONT: %s", r)
	}
	out = filepath.Join(dir, "in-s3.out")
	mustSucceed(t, plugin(t, addr, "download", "in-s3", "--location", "s3", "-o", out), "download from S3 after SIGCONT")
	mustEqualFile(t, out, inS3Data)
	r = mustSucceed(t, plugin(t, addr, "version"), "version after SIGCONT")
	if !strings.Contains(r.Stdout, "Storage Location: s3, s3: s3://"+s3.Bucket+" at "+s3.Endpoint+", available\n") {
		t.Fatalf("version after SIGCONT: %s", r)
	}
}
