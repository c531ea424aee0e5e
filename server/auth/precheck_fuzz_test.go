package auth

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// FuzzPrecheck feeds the agent port's pre-review token check (run on
// every call before any TokenReview, on bytes anyone who reaches the pod
// sends) arbitrary tokens: it never panics, and what it lets through to a
// review names a pod of the agents' ServiceAccount in an agent namespace,
// unexpired, and fits MaxTokenBytes.
func FuzzPrecheck(f *testing.F) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	seg := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	valid := seg(`{"alg":"RS256"}`) + "." + seg(`{"aud":["`+AgentAudience+`"],"sub":"system:serviceaccount:ns:etcdbackup-agent","exp":1796558400,`+
		`"kubernetes.io":{"pod":{"name":"backup-x","uid":"u-1"}}}`) + ".c2ln"
	for _, s := range []string{
		valid,
		strings.Replace(valid, ".c2ln", ".", 1),
		seg(`{}`) + "." + seg(`{"aud":"`+AgentAudience+`","sub":"system:serviceaccount:ns:etcdbackup-agent","exp":1e300,"kubernetes.io":{"pod":{"name":"p","uid":"u"}}}`) + ".x",
		seg(`{}`) + "." + seg(`{"aud":[1,2],"exp":-1}`) + ".x",
		"a.b.c", "..", "", "Bearer x", strings.Repeat("A", MaxTokenBytes+1),
	} {
		f.Add(s)
	}
	r := &agentReviewer{serviceAccount: "etcdbackup-agent", namespaces: []string{"ns", "app"}}
	if _, err := r.precheck(valid, []string{AgentAudience}, now); err != nil {
		f.Fatalf("the valid seed is refused: %v", err)
	}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := r.precheck(token, []string{AgentAudience}, now)
		if err != nil {
			if !strings.Contains(err.Error(), "the bearer token is not an agent's projected ServiceAccount token") {
				t.Fatalf("refusal does not say what it refuses: %v", err)
			}
			if strings.Contains(err.Error(), token) && len(token) > 8 {
				t.Fatalf("refusal shows the token: %v", err)
			}
			return
		}
		switch {
		case len(token) > MaxTokenBytes:
			t.Fatalf("admitted a token of %d bytes", len(token))
		case c.namespace != "ns" && c.namespace != "app":
			t.Fatalf("admitted namespace %q", c.namespace)
		case c.pod == "" || c.podUID == "":
			t.Fatalf("admitted a token bound to no pod: %+v", c)
		case !now.Before(c.exp):
			t.Fatalf("admitted an expired token (exp %v)", c.exp)
		}
	})
}
