package plugin

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// More backups than fit in one page of ListBackups (500 by default)
// list completely, once each, newest first, in every output format.
func TestListFollowsPages(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	const n = 2500
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("b-%04d", i)
	}
	srv.WriteBackups(t, "default", time.Now().Add(-time.Hour), names...)
	// Backup i is i seconds newer than backup i-1: newest first is the
	// reverse.
	want := slices.Clone(names)
	slices.Reverse(want)

	got := strings.Fields(mustRun(t, addr, "list", "-o", "name").out)
	for i := range got {
		got[i] = strings.TrimPrefix(got[i], "backup/")
	}
	if !slices.Equal(got, want) {
		t.Fatalf("list -o name: %d names (first %v); want the %d backups newest first", len(got), got[:min(3, len(got))], n)
	}

	var list struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, addr, "list", "-o", "json").out), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != n || list.Items[0].Metadata.Name != want[0] || list.Items[n-1].Metadata.Name != want[n-1] {
		t.Fatalf("list -o json: %d items; want %d", len(list.Items), n)
	}
	if _, rows := parseTable(t, mustRun(t, addr, "list").out); len(rows) != n {
		t.Fatalf("list: %d rows; want %d", len(rows), n)
	}
}
