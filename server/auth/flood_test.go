package auth_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// flood is a real in-process server whose agent port is guarded by the
// real AgentGuard over a fake API server that counts TokenReviews, with a
// real backup agent's token file.
type flood struct {
	srv     *servertest.Server
	reviews *atomic.Int64
}

func newFlood(tb testing.TB) *flood {
	tb.Helper()
	c := newCluster(tb)
	var reviews atomic.Int64
	c.cs.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		return false, nil, nil
	})
	bj := c.backupJob(tb)
	tok := c.tokenFor(c.pod(tb, bj, "backup-pod", true))
	file := filepath.Join(tb.TempDir(), "token")
	if err := os.WriteFile(file, []byte(agentJWT(tok)), 0o600); err != nil {
		tb.Fatal(err)
	}
	srv := servertest.StartWith(tb, servertest.Options{AgentGuard: c.guard, AgentDialOptions: []grpc.DialOption{client.WithTokenFile(file)}})
	return &flood{srv: srv, reviews: &reviews}
}

// junk sends n calls with tokens that fail the cheap checks, from
// workers goroutines on a connection of their own.
func (f *flood) junk(tb testing.TB, ctx context.Context, n, workers int, token func(i int) string) int64 {
	tb.Helper()
	conn, c, err := client.Dial(f.srv.AgentAddr)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	var sent atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n && ctx.Err() == nil; i += workers {
				md := metadata.Pairs("authorization", "Bearer "+token(i))
				_, _ = c.Info.GetServerInfo(metadata.NewOutgoingContext(ctx, md), &ebv1.GetServerInfoRequest{})
				sent.Add(1)
			}
		})
	}
	wg.Wait()
	return sent.Load()
}

func junkToken(i int) string {
	switch i % 4 {
	case 0:
		return fmt.Sprintf("junk-%d", i)
	case 1:
		return claimsWith(func(c map[string]any) { c["aud"] = []string{"https://kubernetes.default.svc"}; c["jti"] = i })
	case 2:
		return claimsWith(func(c map[string]any) { c["sub"] = "system:serviceaccount:intruder:default"; c["jti"] = i })
	default:
		return claimsWith(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Minute).Unix(); c["jti"] = i })
	}
}

// wellShaped tokens pass the cheap checks (anyone can write such claims)
// but the API server knows none.
func wellShaped(i int) string {
	return claimsWith(func(c map[string]any) { c["jti"] = fmt.Sprintf("forged-%d", i); c["exp"] = forgedExp })
}

// forgedExp keeps each forged token the same from call to call.
var forgedExp = time.Now().Add(time.Hour).Unix()

// upload is the real agent's backup: its Job's backup b1.
func (f *flood) upload(ctx context.Context) error {
	db := bytes.Repeat([]byte{7}, 512)
	sum := sha256.Sum256(db)
	_, err := f.srv.AgentClient.Upload(ctx, bytes.NewReader(append(db, sum[:]...)), &ebv1.UploadHeader{Name: "b1"}, nil)
	return err
}

// A flood of tokens on the agent port costs the API server nothing when
// they are junk and at most one review per distinct well-shaped token,
// while the real agent's backup and a user's list go through.
func TestAgentPortFlood(t *testing.T) {
	f := newFlood(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if n := f.junk(t, ctx, 10_000, 16, junkToken); n != 10_000 {
		t.Fatalf("sent %d", n)
	}
	if n := f.reviews.Load(); n != 0 {
		t.Fatalf("10,000 junk tokens cost %d TokenReviews; want 0", n)
	}

	// Distinct well-shaped tokens, each sent 5 times, while the agent
	// backs up and a user lists.
	const distinct = 200
	var wg sync.WaitGroup
	wg.Go(func() { f.junk(t, ctx, 5*distinct, 16, func(i int) string { return wellShaped(i % distinct) }) })
	if err := f.upload(ctx); err != nil {
		t.Fatalf("the real agent's backup during the flood: %v", err)
	}
	if _, err := f.srv.Client.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{}); err != nil {
		t.Fatalf("a user's list during the flood: %v", err)
	}
	wg.Wait()
	// Each distinct token is reviewed once, then its answer is cached;
	// one more for the real agent's token.
	if n := f.reviews.Load(); n > distinct+1 {
		t.Fatalf("%d distinct forged tokens sent 5 times each cost %d TokenReviews; want at most %d", distinct, n, distinct+1)
	}
	t.Logf("TokenReviews: %d for %d distinct well-shaped tokens sent %d times, and the agent's", f.reviews.Load(), distinct, 5*distinct)
}

// BenchmarkAgentCallUnderFlood times the real backup agent's calls
// (GetServerInfo through the real guard, after its upload) while 16 goroutines send junk and well-shaped
// forged tokens without pause; it reports the reviews the flood cost.
//
//	go test -run '^$' -bench AgentCallUnderFlood ./server/auth/
func BenchmarkAgentCallUnderFlood(b *testing.B) {
	f := newFlood(b)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent atomic.Int64
	wg.Go(func() {
		sent.Add(f.junk(b, ctx, 1<<40, 16, func(i int) string {
			if i%2 == 0 {
				return junkToken(i)
			}
			return wellShaped(i)
		}))
	})
	if err := f.upload(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := f.srv.AgentClient.Info.GetServerInfo(context.Background(), &ebv1.GetServerInfoRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cancel()
	wg.Wait()
	b.ReportMetric(float64(f.reviews.Load()), "reviews")
	b.ReportMetric(float64(sent.Load()), "flood-calls")
}
