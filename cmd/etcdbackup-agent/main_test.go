package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// The restore agent bumps by etcd's recommendation unless its Job says
// otherwise, and refuses a negative bump before it dials the server or
// touches the data directory.
func TestRestoreBumpRevisionFlag(t *testing.T) {
	f := commands{}.restore().Flags().Lookup("bump-revision")
	if f == nil || f.DefValue != strconv.FormatInt(snapshot.DefaultRevisionBump, 10) {
		t.Fatalf("--bump-revision flag: %+v", f)
	}
	root := newRoot()
	root.SetArgs([]string{"restore", "--server=127.0.0.1:1", "--name=b", "--data-dir=" + t.TempDir(), "--member-name=m1",
		"--initial-cluster=m1=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380", "--bump-revision=-1"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--bump-revision -1 is negative") {
		t.Fatalf("negative bump: %v", err)
	}
}
