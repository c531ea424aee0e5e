package plugin

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// recordingGuard records, for each call the real server receives,
// whether it carried an authorization header, then asks the guard of
// the mode under test.
type recordingGuard struct {
	auth.Guard
	mu   sync.Mutex
	seen []string // "Method token" or "Method -"
}

func (g *recordingGuard) Admit(ctx context.Context, method string) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	token := "-"
	if v := md.Get(auth.AuthorizationHeader); len(v) > 0 {
		token = strings.TrimPrefix(v[0], "Bearer ")
	}
	g.mu.Lock()
	g.seen = append(g.seen, method[strings.LastIndex(method, "/")+1:]+" "+token)
	g.mu.Unlock()
	return g.Guard.Admit(ctx, method)
}

func (g *recordingGuard) calls() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.seen, ", ")
}

// sarGuard is the real SubjectAccessReview guard against a fake API
// server that knows one token, allowed to list, get and upload backups.
func sarGuard() auth.Guard {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		tr := action.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		tr.Status.Authenticated = tr.Spec.Token == "kubeconfig-token"
		tr.Status.User = authnv1.UserInfo{Username: "alice"}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		sar := action.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		sar.Status.Allowed = true
		return true, sar, nil
	})
	return auth.NewSubjectAccessReviewGuard(cs, "etcdbackup-system")
}

// The plugin's tunnelled connection (its interceptors, on a real
// in-process server) sends the kubeconfig's token to a server in
// SubjectAccessReview mode, which asks for it, and never to one in
// PortForward mode, which does not use it.
func TestKubeconfigTokenGoesOnlyToAServerThatAsks(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		guard auth.Guard
		// The calls the server received, with the token each carried.
		want string
	}{
		{"PortForward", auth.AllowAll{}, "ListBackups -, GetBackup -, UploadBackup -"},
		// The first call is refused without a token and made again
		// with it; every later one carries it at once.
		{"SubjectAccessReview", sarGuard(), "ListBackups -, ListBackups kubeconfig-token, GetBackup kubeconfig-token, UploadBackup kubeconfig-token"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			g := &recordingGuard{Guard: tc.guard}
			srv := servertest.StartWith(t, servertest.Options{UserGuard: g})
			c := tokenWhenAskedClient(t, srv.Addr)
			ctx := context.Background()
			if _, err := c.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "none"}); status.Code(err) != codes.NotFound {
				t.Fatalf("get: %v", err)
			}
			if _, err := c.Upload(ctx, bytes.NewReader(etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1))), &ebv1.UploadHeader{Name: "b1"}, nil); err != nil {
				t.Fatal(err)
			}
			if got := g.calls(); got != tc.want {
				t.Errorf("the server received\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
	// A connection whose first call is a stream learns the need with one
	// GetServerInfo first: an upload's data cannot be sent twice.
	t.Run("stream first", func(t *testing.T) {
		for mode, tc := range map[string]struct {
			guard auth.Guard
			want  string
		}{
			"PortForward":         {auth.AllowAll{}, "GetServerInfo -, UploadBackup -"},
			"SubjectAccessReview": {sarGuard(), "GetServerInfo -, GetServerInfo kubeconfig-token, UploadBackup kubeconfig-token"},
		} {
			g := &recordingGuard{Guard: tc.guard}
			srv := servertest.StartWith(t, servertest.Options{UserGuard: g})
			c := tokenWhenAskedClient(t, srv.Addr)
			if _, err := c.Upload(context.Background(), bytes.NewReader(etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1))), &ebv1.UploadHeader{Name: "b1"}, nil); err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			if got := g.calls(); got != tc.want {
				t.Errorf("%s: the server received\n%s\nwant\n%s", mode, got, tc.want)
			}
		}
	})
}

// tokenWhenAskedClient connects to addr as connectTunnel does, with the
// kubeconfig token "kubeconfig-token".
func tokenWhenAskedClient(t *testing.T, addr string) *client.Client {
	t.Helper()
	creds, err := newKubeconfigToken(&rest.Config{Host: "https://api.example:6443", BearerToken: "kubeconfig-token"})
	if err != nil {
		t.Fatal(err)
	}
	asked := &tokenWhenAsked{creds: creds}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, asked.dialOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return client.New(conn)
}
