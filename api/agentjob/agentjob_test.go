package agentjob

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// Every kind has one row, a distinct component label, and a Job name
// that is a DNS label starting with the kind.
func TestKinds(t *testing.T) {
	seen := map[string]bool{}
	dns := regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	for _, s := range Kinds {
		if s.Kind == "" || s.Component == "" || seen[string(s.Kind)] || seen[s.Component] {
			t.Errorf("row %+v: empty or repeated", s)
		}
		seen[string(s.Kind)], seen[s.Component] = true, true
		if got, ok := OfComponent(s.Component); !ok || got.Kind != s.Kind || Of(s.Kind).Component != s.Component {
			t.Errorf("%s: Of/OfComponent do not find its row", s.Kind)
		}
		name := s.Kind.JobName("Some.Backup_NAME-that-is-much-longer-than-thirty", "0123456789abcdef")
		if !dns.MatchString(name) || !strings.HasPrefix(name, string(s.Kind)+"-some-backup-name-") || !strings.HasSuffix(name, "-0123456789") {
			t.Errorf("%s: Job name %q", s.Kind, name)
		}
	}
	if _, ok := OfComponent("other-agent"); ok || Of("other") != (Spec{}) {
		t.Error("a kind that is none was found")
	}
}

// A report's free text is cut to fit a termination message, and what is
// written reads back as the same type.
func TestReportsFit(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for _, r := range []Report{DrillVerdict{Message: long}, FoldVerdict{Message: long, Backup: "b"}, DeltaEnd{ChainEnded: long}} {
		b, err := r.Encode()
		if err != nil || len(b) > 4096 {
			t.Fatalf("%T: %d bytes, %v", r, len(b), err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%T: %v", r, err)
		}
	}
}

// Args writes every flag as one --NAME=VALUE argument, optional ones
// only when set.
func TestArgs(t *testing.T) {
	got := DrillFlags{Conn: Conn{Server: "s:1", TokenFile: "/t"}, Name: "b", Location: "", SHA256: "ab", ScratchDir: "/w"}.Args()
	want := []string{"drill", "--server=s:1", "--name=b", "--location=", "--sha256=ab", "--scratch-dir=/w", "--token-file=/t"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("args %q, want %q", got, want)
	}
	got = RestoreFlags{MoveAside: true, InitialAdvertisePeerURLs: []string{"a", "b"}, ToRevision: 5}.Args()
	for _, w := range []string{"--move-aside", "--initial-advertise-peer-urls=a,b", "--to-revision=5", "--bump-revision=0"} {
		if !strings.Contains(strings.Join(got, " "), w) {
			t.Errorf("restore args %q lack %q", got, w)
		}
	}
	if strings.Contains(strings.Join(got, " "), "--allow-lease-loss") || strings.Contains(strings.Join(got, " "), "--to-time") {
		t.Errorf("restore args %q hold unset flags", got)
	}
}
