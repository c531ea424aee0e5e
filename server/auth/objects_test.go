package auth_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1listers "k8s.io/client-go/listers/batch/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// staticCaches are client-go listers over stores the test fills by hand:
// what the server's informers would hold, at a moment of the test's
// choosing.
type staticCaches struct {
	pods, jobs cache.Indexer
}

func newStaticCaches() *staticCaches {
	idx := func() cache.Indexer {
		return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
	return &staticCaches{pods: idx(), jobs: idx()}
}

func (s *staticCaches) guard(t *testing.T, c *cluster) *auth.AgentGuard {
	t.Helper()
	g, err := auth.NewAgentGuard(auth.AgentGuardConfig{
		Client: c.cs, Namespace: serverNS, RestoreNamespaces: []string{appNS, otherNS}, ServiceAccount: config.DefaultServiceAccount,
		Signer: c.launcher.Signer(), TargetNamespaces: map[string]string{"app": appNS, "other": otherNS},
		Pods: corev1listers.NewPodLister(s.pods), Jobs: batchv1listers.NewJobLister(s.jobs),
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// counts returns the pod and Job reads c's API server has had.
func counts(c *cluster) (pods, jobs int) {
	for _, a := range c.cs.Actions() {
		if a.GetVerb() != "get" {
			continue
		}
		switch a.GetResource().Resource {
		case "pods":
			pods++
		case "jobs":
			jobs++
		}
	}
	return pods, jobs
}

// A Job is created, then signed: a cache that has the Job but not yet
// its signature must not turn its first pod away. The guard reads that
// Job from the API server once, and admits.
func TestAgentGuardReadsAJobTheCacheHasNotSeenSigned(t *testing.T) {
	c := newCluster(t)
	s := newStaticCaches()
	g := s.guard(t, c)
	j := c.backupJob(t)
	p := c.pod(t, j, "backup-pod", true)
	unsigned := j.DeepCopy()
	delete(unsigned.Annotations, jobs.AnnotationSignature)
	if err := s.pods.Add(p); err != nil {
		t.Fatal(err)
	}
	if err := s.jobs.Add(unsigned); err != nil {
		t.Fatal(err)
	}
	tok := podJWT(c.tokenFor(p), serverNS, p.Name, string(p.UID))
	c.cs.ClearActions()
	if _, err := g.Admit(withRawToken(tok), auth.MethodUploadBackup); err != nil {
		t.Fatalf("a pod of a Job the cache has not seen signed: %v", err)
	}
	if pods, jobs := counts(c); pods != 0 || jobs != 1 {
		t.Fatalf("%d pod and %d Job reads; want the Job's only", pods, jobs)
	}
	// Once the cache has the signed Job, no read.
	if err := s.jobs.Update(j); err != nil {
		t.Fatal(err)
	}
	c.cs.ClearActions()
	if _, err := g.Admit(withRawToken(tok), auth.MethodUploadBackup); err != nil {
		t.Fatal(err)
	}
	if pods, jobs := counts(c); pods != 0 || jobs != 0 {
		t.Fatalf("%d pod and %d Job reads; want none", pods, jobs)
	}
}

// A namespace whose informers cannot answer (not watched, not filled:
// the server may lack list or watch there) is not a namespace without
// pods: its agents are checked against the API server instead.
func TestAgentGuardReadsWhereTheCacheCannotTell(t *testing.T) {
	c := newCluster(t)
	pods, jl := agentCaches(t, c.cs, serverNS) // the app namespace is not watched
	g, err := auth.NewAgentGuard(auth.AgentGuardConfig{
		Client: c.cs, Namespace: serverNS, RestoreNamespaces: []string{appNS, otherNS}, ServiceAccount: config.DefaultServiceAccount,
		Signer: c.launcher.Signer(), TargetNamespaces: map[string]string{"app": appNS, "other": otherNS},
		Pods: pods, Jobs: jl,
	})
	if err != nil {
		t.Fatal(err)
	}
	rj := c.restoreJob(t)
	p := c.pod(t, rj, "restore-pod", true)
	tok := podJWT(c.tokenFor(p), appNS, p.Name, string(p.UID))
	c.cs.ClearActions()
	if _, err := g.Admit(withRawToken(tok), auth.MethodDownloadBackup); err != nil {
		t.Fatalf("an agent where the cache cannot tell: %v", err)
	}
	if pods, jobs := counts(c); pods != 1 || jobs != 1 {
		t.Fatalf("%d pod and %d Job reads; want one of each", pods, jobs)
	}
	// A forged token naming a pod there is reviewed (and refused by
	// the review), not refused as unknown.
	forged := podJWT("forged", appNS, "restore-x", "uid-x")
	_, err = g.Admit(withRawToken(forged), auth.MethodDownloadBackup)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "did not accept the bearer token") {
		t.Fatalf("a forged token where the cache cannot tell: %v; want the review's refusal", err)
	}
}

// Where the cache can tell, a pod it does not have is unknown: refused
// Unauthenticated before any review; so is a pod whose name it has under
// another UID.
func TestAgentGuardRefusesUnknownPodsWithoutAReview(t *testing.T) {
	c := newCluster(t)
	s := newStaticCaches()
	g := s.guard(t, c)
	j := c.backupJob(t)
	p := c.pod(t, j, "backup-pod", true)
	if err := s.pods.Add(p); err != nil {
		t.Fatal(err)
	}
	c.tokenFor(p)
	c.cs.ClearActions()
	for _, tok := range []string{
		podJWT("tok-backup-pod-secret", serverNS, "backup-pod", "uid-of-an-earlier-pod"),
		podJWT("tok-backup-pod-secret", serverNS, "never-made", "u"),
		podJWT("tok-backup-pod-secret", appNS, "backup-pod", string(p.UID)),
	} {
		_, err := g.Admit(withRawToken(tok), auth.MethodUploadBackup)
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "unknown to the server") {
			t.Fatalf("Admit: %v; want Unauthenticated, pod unknown", err)
		}
		if strings.Contains(err.Error(), tok) {
			t.Fatalf("the refusal shows the token: %v", err)
		}
	}
	for _, a := range c.cs.Actions() {
		t.Errorf("a request to the API server: %s %s", a.GetVerb(), a.GetResource().Resource)
	}
}

// client-go's listers are what the guard takes.
var (
	_ auth.PodLister = corev1listers.NewPodLister(nil)
	_ auth.JobLister = batchv1listers.NewJobLister(nil)
)
