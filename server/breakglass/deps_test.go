package breakglass_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Break-glass links the read path and nothing that runs the server: the
// plugin binary carries it, and every server package it linked (Jobs,
// authorization, the controller, the election, coordination) made it
// larger and slower to start for no use.
func TestLinksNothingThatRunsTheServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/kubectl-etcdbackup/kubectl-etcdbackup/"
	forbidden := map[string]bool{}
	for _, p := range []string{"server", "server/auth", "server/agenttls", "server/controller", "server/coord", "server/jobs",
		"server/leader", "server/liveness", "server/retention", "server/rpc", "server/work"} {
		forbidden[mod+p] = true
	}
	for _, p := range strings.Fields(string(out)) {
		if forbidden[p] {
			t.Errorf("break-glass links %s", p)
		}
	}
}
