package plugin

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// The command lines of docs/scripting.md, run in the order the page gives
// them: the plugin part through the real command tree against a real
// server (two locations; agents played by the test in client-go's fake
// clientset), what follows a pipe through bash (jq when installed).

// docExamples returns every line of the page's sh blocks that runs the
// plugin.
func docExamples(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/scripting.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "```sh"):
			in = true
		case strings.HasPrefix(l, "```"):
			in = false
		case in && strings.HasPrefix(strings.TrimSpace(l), "kubectl etcdbackup "):
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

type docWorld struct {
	*agentWorld
	t *testing.T
	// asAgent serializes uploads made as an agent (the guard holds one
	// identity at a time).
	asAgent sync.Mutex
}

// agentUpload stores data as target's backup agent would: a target's
// backups are its agents' (an upload's target is only claimed).
func (w *docWorld) agentUpload(ctx context.Context, target string, h *ebv1.UploadHeader, data []byte) error {
	w.asAgent.Lock()
	defer w.asAgent.Unlock()
	w.agent.setAt(target, h.GetName(), cmp.Or(h.GetLocation(), "default"))
	_, err := w.srv.AgentClient.Upload(ctx, bytes.NewReader(data), h, nil)
	return err
}

func TestScriptingDoc(t *testing.T) {
	examples := docExamples(t)
	if len(examples) < 10 {
		t.Fatalf("found %d examples in docs/scripting.md; the test's parser and the page disagree", len(examples))
	}
	t.Chdir(t.TempDir())
	w := &docWorld{agentWorld: newAgentWorld(t, "control-plane", "default", "s3"), t: t}
	w.playAgents(t)
	ctx := context.Background()
	// The server stores what ends in etcd's trailer (TrailedBytes: whole
	// 512-byte pages and their SHA-256); the sizes below are what the
	// examples print.
	upload := func(name, location string, data []byte, labels map[string]string, target string) {
		h := &ebv1.UploadHeader{Name: name, Location: location, Labels: labels}
		var err error
		if target != "" {
			h.Etcd = &ebv1.EtcdInfo{ClusterId: 0xcdf818194e3a8c32, MemberId: 0x8e9e05c52164694d, MemberName: "cp-1", Revision: 48213, Version: "3.7.3"}
			err = w.agentUpload(ctx, target, h, data)
		} else {
			_, err = w.srv.Client.Upload(ctx, bytes.NewReader(data), h, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // distinct creation times: newest first is well defined
	}
	upload("cp-old", "default", etcdtest.TrailedBytes(t, 3*512+32), nil, "control-plane")
	newest := snapshotShaped(1)
	upload("cp-new", "s3", newest, nil, "control-plane")
	upload("before-upgrade", "default", etcdtest.TrailedBytes(t, 2*512+32), map[string]string{"env": "prod"}, "")
	upload("t1", "default", etcdtest.TrailedBytes(t, 544), map[string]string{"env": "test"}, "")
	upload("t2", "s3", etcdtest.TrailedBytes(t, 544), map[string]string{"env": "test"}, "")
	// A failed backup, for the page's "Failed backups". The fake
	// clientset gives its Job no creation time, so it lists last.
	if r := run(t, w.addr, "backup", "--target", "control-plane", "--name", "cp-broken", "--wait"); ExitCode(r.err) != ExitFailed {
		t.Fatalf("cp-broken: %v", r.err)
	}

	// What some examples must print, by a part of their line.
	want := map[string]*regexp.Regexp{
		"list -o name\x00":                      regexp.MustCompile(`(?m)^backup/before-upgrade$`),
		"jsonpath='{.items[*].metadata.name}'":  regexp.MustCompile(`^before-upgrade cp-new cp-old cp-broken$`),
		"jq -r '.items[].metadata.name'":        regexp.MustCompile(`^before-upgrade\ncp-new\ncp-old\ncp-broken\n$`),
		`[0].metadata.name'` + "\x00":           regexp.MustCompile(`^cp-new\n$`),
		`@.spec.target=="control-plane"`:        regexp.MustCompile(`^cp-new cp-old cp-broken$`),
		"get before-upgrade -o jsonpath":        regexp.MustCompile(`^1056$`),
		"reduce .items[]":                       regexp.MustCompile(`^default 2624\ns3 544\n$`), // cp-old 1568 and before-upgrade 1056; cp-new
		"REVISION:.status.etcd.revision":        regexp.MustCompile(`(?m)^cp-new\s+s3\s+544\s+48213$`),
		"sort -n":                               regexp.MustCompile(`^\d+\s+\S+\n`),
		`select(.status.phase == "Failed")`:     regexp.MustCompile(`(?m)^cp-broken: agent exited with code 1: `),
		"backup --target control-plane --wait":  regexp.MustCompile(`^control-plane-\d{8}-\d{6}$`),
		"get before-upgrade -o name >/dev/null": regexp.MustCompile(`^$`),
		"get no-such-backup":                    regexp.MustCompile(`^$`),
		"list -l env=test -o name | xargs":      regexp.MustCompile(`backup "t2" deleted\nbackup "t1" deleted\n`),
		"delete -l env=test --yes":              regexp.MustCompile(`^$`),
		"download \"$(kubectl etcdbackup list":  regexp.MustCompile(`^$`),
		"list -o name || test $? -eq 6":         regexp.MustCompile(`^backup/kept\n$`),
	}
	// The page's example of an unavailable location runs against a
	// server whose location "offsite" does not answer.
	degraded := &docWorld{agentWorld: &agentWorld{addr: degradedServer(t)}, t: t}
	used := map[string]bool{}
	_, haveJQ := exec.LookPath("jq")
	for _, ex := range examples {
		t.Run(ex, func(t *testing.T) {
			if strings.Contains(ex, "jq ") && haveJQ != nil {
				t.Skip("jq is not installed (apt-get install -y jq)")
			}
			ew := w
			if strings.Contains(ex, "test $? -eq 6") {
				ew = degraded
			}
			out, code := ew.eval(t, ex)
			if code != 0 {
				t.Fatalf("exit code %d; stdout:\n%s", code, out)
			}
			matched := false
			for part, re := range want {
				if strings.Contains(ex+"\x00", part) {
					matched, used[part] = true, true
					if !re.MatchString(out) {
						t.Errorf("stdout %q does not match %s", out, re)
					}
				}
			}
			if !matched && strings.TrimSpace(out) == "" {
				t.Errorf("printed nothing")
			}
		})
	}
	for part := range want {
		if !used[part] && !t.Skipped() && haveJQ == nil {
			t.Errorf("no example of the page contains %q: page and test disagree", part)
		}
	}
	// The download example wrote the newest completed control-plane backup.
	if b, err := os.ReadFile("newest.db"); err != nil || !bytes.Equal(b, newest) {
		t.Errorf("newest.db: %d bytes, %v; want cp-new's %d", len(b), err, len(newest))
	}
}

// degradedServer serves a filesystem location holding backup "kept" and
// an S3 location "offsite" whose endpoint nothing listens on: unavailable.
func degradedServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	id, secret := filepath.Join(dir, "id"), filepath.Join(dir, "secret")
	for _, f := range []string{id, secret} {
		if err := os.WriteFile(f, []byte("not used\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	srv := servertest.StartWith(t, servertest.Options{
		Locations: []string{"default"},
		Configured: []storage.LocationConfig{{Name: "offsite", S3: &storage.S3Config{
			Bucket: "etcd", Endpoint: endpoint, PathStyle: true, AccessKeyIDFile: id, SecretAccessKeyFile: secret,
		}}},
	})
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1000))
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: "kept"}, nil); err != nil {
		t.Fatal(err)
	}
	return "--server-address=" + srv.Addr
}

// TestExitCodesDocumented: the page's table of exit codes and --help's
// list have the same codes.
func TestExitCodesDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/scripting.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "## Exit codes\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var doc, help []string
	for _, m := range regexp.MustCompile(`(?m)^\| (\d+) \|`).FindAllStringSubmatch(section, -1) {
		doc = append(doc, m[1])
	}
	for _, m := range regexp.MustCompile(`(?m)^  (\d+)  `).FindAllStringSubmatch(exitCodesHelp, -1) {
		help = append(help, m[1])
	}
	if strings.Join(doc, " ") != strings.Join(help, " ") || len(doc) == 0 {
		t.Errorf("docs/scripting.md documents exit codes %v, --help %v", doc, help)
	}
	if want := strconv.Itoa(ExitIncomplete); doc[len(doc)-1] != want {
		t.Errorf("the last documented exit code is %s, want %s (ExitIncomplete)", doc[len(doc)-1], want)
	}
}

// playAgents completes every backup Job of control-plane by uploading
// what an agent would, and fails cp-broken's, until the test ends.
func (w *docWorld) playAgents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	t.Cleanup(func() { cancel(); wg.Wait() })
	go func() {
		defer wg.Done()
		done := map[string]bool{}
		wait.UntilWithContext(ctx, func(ctx context.Context) {
			list, err := w.cs.BatchV1().Jobs(serverNS).List(ctx, metav1.ListOptions{LabelSelector: jobs.LabelComponent + "=backup-agent"})
			if err != nil {
				return
			}
			for _, j := range list.Items {
				name := j.Annotations[jobs.AnnotationBackup]
				if done[name] {
					continue
				}
				done[name] = true
				if name == "cp-broken" {
					w.finish(t, j, false, "snapshot from https://etcd:2379: connection refused")
					continue
				}
				h := &ebv1.UploadHeader{Name: name, Location: j.Annotations[jobs.AnnotationLocation]}
				if err := w.agentUpload(ctx, "control-plane", h, etcdtest.TrailedBytes(t, 544)); err != nil && ctx.Err() == nil {
					t.Errorf("agent of %s: %v", name, err)
				}
				w.finish(t, j, true, "")
			}
		}, 50*time.Millisecond)
	}()
}

// eval runs one command line of the page: the plugin part in process,
// $(…) inside it first, then what follows it.
func (w *docWorld) eval(t *testing.T, line string) (string, int) {
	t.Helper()
	words, rest := w.words(t, line)
	if len(words) < 2 || words[0] != "kubectl" || words[1] != "etcdbackup" {
		t.Fatalf("not a plugin command: %q", line)
	}
	r := runIn(t, "", false, append([]string{w.addr}, words[2:]...)...)
	out, code := r.out, ExitCode(r.err)
	rest = strings.TrimSpace(rest)
	if strings.HasPrefix(rest, ">/dev/null") {
		out, rest = "", strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(rest, ">/dev/null"), " 2>&1"))
	}
	switch {
	case rest == "":
		return out, code
	case strings.HasPrefix(rest, "|| test $? -eq "):
		want, err := strconv.Atoi(strings.TrimPrefix(rest, "|| test $? -eq "))
		if err != nil {
			t.Fatalf("%q: %v", rest, err)
		}
		if code != want {
			t.Errorf("exit code %d, want %d (%v)", code, want, r.err)
		}
		return out, 0
	case code != 0:
		t.Fatalf("%q: exit code %d: %v\n%s", line, code, r.err, r.errOut)
	case strings.HasPrefix(rest, "| xargs -r kubectl etcdbackup "):
		args := strings.Fields(strings.TrimPrefix(rest, "| xargs -r kubectl etcdbackup "))
		names := strings.Fields(out)
		if len(names) == 0 {
			return "", 0
		}
		r := runIn(t, "", false, append(append([]string{w.addr}, args...), names...)...)
		return r.out, ExitCode(r.err)
	case strings.HasPrefix(rest, "|"):
		cmd := exec.Command("bash", "-o", "pipefail", "-c", strings.TrimPrefix(rest, "|"))
		cmd.Stdin = strings.NewReader(out)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s\ninput:\n%s", rest, err, stderr.String(), out)
		}
		return stdout.String(), 0
	}
	t.Fatalf("the test cannot run %q after the plugin command", rest)
	return "", 0
}

// words splits the start of line into shell words, up to the first
// unquoted |, > or ;, and returns the remainder. Quotes are removed;
// "$(…)" is replaced by what eval prints for it.
func (w *docWorld) words(t *testing.T, line string) ([]string, string) {
	t.Helper()
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ':
			flush()
		case c == '|' || c == '>' || c == ';':
			flush()
			return words, line[i:]
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				t.Fatalf("unterminated ' in %q", line)
			}
			cur.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			inWord = true
			for i++; i < len(line) && line[i] != '"'; i++ {
				if strings.HasPrefix(line[i:], "$(") {
					end := matchParen(line, i+1)
					if end < 0 {
						t.Fatalf("unterminated $( in %q", line)
					}
					out, code := w.eval(t, line[i+2:end])
					if code != 0 {
						t.Fatalf("$(%s): exit code %d", line[i+2:end], code)
					}
					cur.WriteString(strings.TrimRight(out, "\n"))
					i = end
					continue
				}
				cur.WriteByte(line[i])
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, ""
}

// matchParen returns the index of the ) closing the ( at open, skipping
// quoted text.
func matchParen(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return -1
			}
			i += j + 1
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// snapshotShaped returns pages 512-byte pages followed by their SHA-256:
// what a plain download checks of an etcd snapshot (its trailer).
func snapshotShaped(pages int) []byte {
	db := bytes.Repeat([]byte("etcd db page "), pages*512/13+1)[:pages*512]
	sum := sha256.Sum256(db)
	return append(db, sum[:]...)
}
