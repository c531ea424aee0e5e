package rpc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

func TestBadNamesAreInvalidArgumentAndTouchNothing(t *testing.T) {
	ts := servertest.Start(t, "")
	ts.Upload(t, "existing", trailed(t, 1))
	if err := os.WriteFile(filepath.Join(filepath.Dir(ts.Dir), "x.json"), []byte(`{"name":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	before := servertest.Tree(t, filepath.Dir(ts.Dir))
	bad := []string{"../x", "/abs", "", strings.Repeat("a", 300), "UPPER", "a/b", ".", "..", "x\x00y", "-lead"}
	ctx := context.Background()
	for _, name := range bad {
		_, err := ts.Client.Upload(ctx, bytes.NewReader([]byte("data")), &ebv1.UploadHeader{Name: name}, nil)
		servertest.WantCode(t, err, codes.InvalidArgument)
		_, err = ts.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name})
		servertest.WantCode(t, err, codes.InvalidArgument)
		_, err = ts.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: name})
		servertest.WantCode(t, err, codes.InvalidArgument)
		_, err = ts.Client.Download(ctx, io.Discard, client.DownloadRequest{Name: name})
		servertest.WantCode(t, err, codes.InvalidArgument)
		_, err = ts.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: name})
		if name == "" {
			if err != nil {
				t.Fatal(err)
			}
		} else {
			servertest.WantCode(t, err, codes.NotFound)
		}
	}
	if after := servertest.Tree(t, filepath.Dir(ts.Dir)); after != before {
		t.Fatalf("disk changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The message says what is wrong.
	_, err := ts.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: strings.Repeat("a", 300)})
	if !strings.Contains(status.Convert(err).Message(), "limit is 200") {
		t.Fatalf("unhelpful message: %v", err)
	}
	// Bad labels, hash formats and compression are refused too.
	for _, h := range []*ebv1.UploadHeader{
		{Name: "ok", Labels: map[string]string{"bad key!": "v"}},
		{Name: "ok", ExpectedSha256: "not-hex"},
		{Name: "ok", ExpectedSha256: strings.ToUpper(sha(nil))},
		{Name: "ok", Compression: "gzip"},
		{Name: "ok", Source: &ebv1.BackupSource{Kind: "stolen"}},
	} {
		_, err := ts.Client.Upload(ctx, bytes.NewReader([]byte("data")), h, nil)
		servertest.WantCode(t, err, codes.InvalidArgument)
	}
	if after := servertest.Tree(t, filepath.Dir(ts.Dir)); after != before {
		t.Fatalf("disk changed by bad headers")
	}
}

func TestImmutableAndNotFound(t *testing.T) {
	ts := servertest.Start(t, "")
	ctx := context.Background()
	first := trailed(t, 1)
	ts.Upload(t, "a", first)
	_, err := ts.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "a"}, nil)
	servertest.WantCode(t, err, codes.AlreadyExists)
	var out bytes.Buffer
	if _, err := ts.Client.Download(ctx, &out, client.DownloadRequest{Name: "a"}); err != nil || !bytes.Equal(out.Bytes(), first) {
		t.Fatalf("original changed: %d bytes, equal %v, %v", out.Len(), bytes.Equal(out.Bytes(), first), err)
	}
	_, err = ts.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "missing"})
	servertest.WantCode(t, err, codes.NotFound)
	_, err = ts.Client.Download(ctx, io.Discard, client.DownloadRequest{Name: "missing"})
	servertest.WantCode(t, err, codes.NotFound)
	if _, err := ts.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	_, err = ts.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "a"})
	servertest.WantCode(t, err, codes.NotFound)
	// Deleted names can be reused.
	ts.Upload(t, "a", trailed(t, 1))
}

func TestListFiltersAndSorts(t *testing.T) {
	ts := servertest.Start(t, "")
	ctx := context.Background()
	for _, n := range []string{"b", "a", "c"} {
		if _, err := ts.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: n, Labels: map[string]string{"env": map[bool]string{true: "prod", false: "dev"}[n != "b"]}}, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // distinct creation times: the listing order by time is well defined
	}
	resp, err := ts.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{LabelSelector: "env=prod"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range resp.GetBackups() {
		got = append(got, b.GetName())
	}
	if strings.Join(got, ",") != "c,a" {
		t.Fatalf("list env=prod = %v, want newest first [c a]", got)
	}
	_, err = ts.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{LabelSelector: "env in (("})
	servertest.WantCode(t, err, codes.InvalidArgument)
}

func TestListBackupsPages(t *testing.T) {
	srv := servertest.Start(t, "")
	const n = 1203
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("b-%04d", i)
	}
	created := time.Now().Add(-time.Hour)
	srv.WriteBackups(t, "default", created, names...)
	// Two more created at one instant: the order, and so the pages, go by
	// name among them.
	srv.WriteBackups(t, "default", created.Add(-time.Minute), "same-b")
	srv.WriteBackups(t, "default", created.Add(-time.Minute), "same-a")
	ctx := context.Background()

	list := func(req *ebv1.ListBackupsRequest) (pages []int, all []string) {
		t.Helper()
		for {
			resp, err := srv.Client.Backups.ListBackups(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			pages = append(pages, len(resp.GetBackups()))
			for _, b := range resp.GetBackups() {
				all = append(all, b.GetName())
			}
			if resp.GetNextPageToken() == "" {
				return pages, all
			}
			req.PageToken = resp.GetNextPageToken()
		}
	}
	pages, all := list(&ebv1.ListBackupsRequest{})
	if fmt.Sprint(pages) != "[500 500 205]" || len(all) != n+2 || all[0] != "b-1202" || all[n-1] != "b-0000" || all[n] != "same-a" || all[n+1] != "same-b" {
		t.Fatalf("pages %v, %d backups, first %s, last %v", pages, len(all), all[0], all[n-1:])
	}
	if pages, _ := list(&ebv1.ListBackupsRequest{PageSize: 5000}); fmt.Sprint(pages) != "[1000 205]" {
		t.Errorf("page size 5000: pages %v; want at most 1000 each", pages)
	}
	if pages, _ := list(&ebv1.ListBackupsRequest{PageSize: 600}); fmt.Sprint(pages) != "[600 600 5]" {
		t.Errorf("page size 600: pages %v", pages)
	}

	// A backup deleted between pages does not shift the next page: each
	// backup is listed once.
	first, err := srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: "b-1200"}); err != nil {
		t.Fatal(err)
	}
	next, err := srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageSize: 10, PageToken: first.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	if got := next.GetBackups()[0].GetName(); got != "b-1192" {
		t.Errorf("the page after b-1193 starts at %s; want b-1192", got)
	}

	_, err = srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageToken: "not-a-token"})
	servertest.WantRefusal(t, err, codes.InvalidArgument, "page token")
	_, err = srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageToken: first.GetNextPageToken(), LabelSelector: "env=prod"})
	servertest.WantRefusal(t, err, codes.InvalidArgument, "page token", "env=prod")
	_, err = srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{PageSize: -1})
	servertest.WantRefusal(t, err, codes.InvalidArgument, "page size")
}
