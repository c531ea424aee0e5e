package plugin

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// nowhere is an address nothing listens on: a command run against it that
// fails with anything but "cannot reach" never got as far as the server.
const nowhere = "127.0.0.1:1"

type result struct {
	out, errOut string
	err         error
}

// run drives the real command tree, as main does, with test streams.
func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	err := execute(&out, &errOut, args...)
	return result{out: out.String(), errOut: errOut.String(), err: err}
}

// execute runs the real command tree with args, writing to out and
// errOut.
func execute(out, errOut io.Writer, args ...string) error {
	return executeContext(context.Background(), out, errOut, args...)
}

// executeContext is execute under ctx: what main's signal handling
// cancels.
func executeContext(ctx context.Context, out, errOut io.Writer, args ...string) error {
	streams := genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: out, ErrOut: errOut}
	cmd := NewCmdRoot(streams)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return cmd.ExecuteContext(ctx)
}

// lockedBuffer is a buffer a test reads while a command writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// running is a command started in the background by start, whose stderr
// can be watched while it runs.
type running struct {
	out, errOut lockedBuffer
	done        chan error
}

// start runs the real command tree as run does, in the background.
func start(args ...string) *running {
	return startContext(context.Background(), args...)
}

// startContext is start under ctx, which the test may cancel as Ctrl-C
// would.
func startContext(ctx context.Context, args ...string) *running {
	r := &running{done: make(chan error, 1)}
	go func() { r.done <- executeContext(ctx, &r.out, &r.errOut, args...) }()
	return r
}

// waitErrOut waits until the command's stderr matches re: the command
// got that far. It may be called from any goroutine.
func (r *running) waitErrOut(t *testing.T, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return rx.MatchString(r.errOut.String()), nil
	})
	if err != nil {
		t.Errorf("stderr never matched %q: %v\n%s", re, err, r.errOut.String())
	}
}

// result waits for the command to end.
func (r *running) result() result {
	err := <-r.done
	return result{out: r.out.String(), errOut: r.errOut.String(), err: err}
}

func mustRun(t *testing.T, args ...string) result {
	t.Helper()
	r := run(t, args...)
	if r.err != nil {
		t.Fatalf("%v: %v\nstdout: %s\nstderr: %s", args, r.err, r.out, r.errOut)
	}
	return r
}

func mustFail(t *testing.T, want string, args ...string) result {
	t.Helper()
	r := run(t, args...)
	if r.err == nil {
		t.Fatalf("%v succeeded, want an error containing %q\nstdout: %s", args, want, r.out)
	}
	if !strings.Contains(r.err.Error(), want) {
		t.Fatalf("%v: error %q does not contain %q", args, r.err, want)
	}
	return r
}

// startServer runs the real data server and returns the flag that points
// the plugin at it.
func startServer(t *testing.T) string {
	t.Helper()
	return "--server-address=" + servertest.Start(t, "").Addr
}

// Sizes to ask writeSnapshot for. Each size is made once per test binary
// (an etcd member started and filled), so tests share these.
const (
	// smallSnapshot is etcd's smallest: an empty member's, about 25 KiB.
	smallSnapshot = 0
	// bigSnapshot is about 5 MiB: several gRPC messages of
	// client.ChunkBytes, and like every etcd snapshot (whole 4 KiB bolt
	// pages and a 32-byte trailer) not a round number.
	bigSnapshot = 5 << 20
)

// writeSnapshot writes a real etcd snapshot of about size bytes to a new
// file and returns its path, contents and hex SHA-256: upload sends
// nothing else. Snapshots of the same size are the same bytes.
func writeSnapshot(t *testing.T, name string, size int) (string, []byte, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	data := etcdtest.SnapshotFile(t, path, size)
	return path, data, sha(data)
}

// writeRandom writes n random bytes to a new file and returns its path,
// contents and hex SHA-256: no etcd snapshot, which upload refuses.
func writeRandom(t *testing.T, name string, n int) (string, []byte, string) {
	t.Helper()
	data := make([]byte, n)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data, sha(data)
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// parseTable splits kubectl-style table output into rows of column→value,
// cutting each row at the header's column starts.
func parseTable(t *testing.T, out string) (header []string, rows []map[string]string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatalf("no table in %q", out)
	}
	head := lines[0]
	var starts []int
	for i := 0; i < len(head); i++ {
		if head[i] != ' ' && (i == 0 || head[i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	for i, s := range starts {
		end := len(head)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		header = append(header, strings.TrimSpace(head[s:end]))
	}
	for _, l := range lines[1:] {
		row := map[string]string{}
		for i, s := range starts {
			if s >= len(l) {
				continue
			}
			end := len(l)
			if i+1 < len(starts) && starts[i+1] < end {
				end = starts[i+1]
			}
			row[header[i]] = strings.TrimSpace(l[s:end])
		}
		rows = append(rows, row)
	}
	return header, rows
}

// genericiooptionsForHelp gives streams for building a command tree that is
// only inspected, never run.
func genericiooptionsForHelp() genericiooptions.IOStreams {
	return genericiooptions.NewTestIOStreamsDiscard()
}
