package plugin

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

var deploymentsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}

// fakeCluster makes extract's owner checks ask a fake API server that
// knows Deployments and holds owners (and, with failing, answers every
// get with that error); it returns the fake client.
func fakeCluster(t *testing.T, failing error, owners ...*metav1.PartialObjectMetadata) *metadatafake.FakeMetadataClient {
	t.Helper()
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	objs := make([]runtime.Object, 0, len(owners))
	for _, o := range owners {
		objs = append(objs, o)
	}
	client := metadatafake.NewSimpleMetadataClient(scheme, objs...)
	if failing != nil {
		client.PrependReactor("get", "*", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, failing })
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, meta.RESTScopeNamespace)
	old := newOwnerChecker
	newOwnerChecker = func(*GlobalOptions) (*ownerChecker, error) { return &ownerChecker{mapper: mapper, client: client}, nil }
	t.Cleanup(func() { newOwnerChecker = old })
	return client
}

func deployment(ns, name, uid string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
	}
}

// Online, an ownerReference is kept when its owner exists in the cluster
// with the same UID, and removed when the owner is gone or was
// re-created; offline (--storage-config, --from-file) every one is
// removed, said in one line on stderr.
func TestExtractOwnerReferences(t *testing.T) {
	f, path := kubeFixture(t)
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	mustRun(t, addr, "upload", path, "--name", "fx")
	want := f.Owned.OwnerReferences

	// The owner exists as it was: the reference is kept.
	fakeCluster(t, nil, deployment("app", "web", "uid-app-web"))
	r := mustRun(t, addr, "extract", "fx", "cm", "owned", "--object-namespace", "app", "-o", "json")
	objs := extractedItems(t, r.out)
	if len(objs) != 1 || !reflect.DeepEqual(objs[0].GetOwnerReferences(), want) {
		t.Errorf("owner exists: %s\n%s", r.out, r.errOut)
	}
	servertest.MustSay(t, r.errOut, `ownerReferences kept on 1 object, whose owners exist in the cluster with the same UIDs: configmaps "app/owned"`)

	// Re-created with another UID, or gone: removed.
	for what, owners := range map[string][]*metav1.PartialObjectMetadata{
		"re-created": {deployment("app", "web", "uid-new")},
		"gone":       nil,
		"elsewhere":  {deployment("other", "web", "uid-app-web")},
	} {
		fakeCluster(t, nil, owners...)
		r := mustRun(t, addr, "extract", "fx", "cm", "owned", "--object-namespace", "app", "-o", "json")
		if objs := extractedItems(t, r.out); len(objs) != 1 || objs[0].GetOwnerReferences() != nil || strings.Contains(r.out, "ownerReferences") {
			t.Errorf("owner %s: %s", what, r.out)
		}
		servertest.MustSay(t, r.errOut, `ownerReferences removed from 1 object, whose owners no longer exist in the cluster`, `configmaps "app/owned" (owned by Deployment/web)`)
	}

	// The cluster does not answer: removed, with a warning that says why.
	client := fakeCluster(t, errors.New("connection refused"))
	r = mustRun(t, addr, "extract", "fx", "cm", "--object-namespace", "app", "-o", "json")
	for _, o := range extractedItems(t, r.out) {
		if o.GetOwnerReferences() != nil {
			t.Errorf("%s keeps ownerReferences the cluster did not confirm", o.GetName())
		}
	}
	servertest.MustSay(t, r.errOut, "Warning: ownerReferences removed from 1 object, whose owners could not be looked up", "connection refused", "--keep-owner-references")
	gets := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "get" && a.GetResource() == deploymentsGVR {
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("%d gets of Deployments, want 1", gets)
	}

	// --keep-owner-references asks nothing and keeps them.
	client = fakeCluster(t, nil)
	r = mustRun(t, addr, "extract", "fx", "cm", "owned", "--object-namespace", "app", "-o", "json", "--keep-owner-references")
	if objs := extractedItems(t, r.out); len(objs) != 1 || !reflect.DeepEqual(objs[0].GetOwnerReferences(), want) || len(client.Actions()) != 0 || strings.Contains(r.errOut, "ownerReferences") {
		t.Errorf("--keep-owner-references: %s\n%s\n%v", r.out, r.errOut, client.Actions())
	}

	// Offline: the cluster is not asked, every reference is removed, in
	// one line.
	client = fakeCluster(t, nil, deployment("app", "web", "uid-app-web"))
	r = mustRun(t, "extract", "fx", "cm", "--object-namespace", "app", "--from-file", path)
	if strings.Contains(r.out, "ownerReferences") || len(client.Actions()) != 0 {
		t.Errorf("offline: %s\n%v", r.out, client.Actions())
	}
	servertest.MustSay(t, r.errOut, "ownerReferences removed from 1 object: read offline (--from-file, --storage-config), the cluster is not asked")
	if n := strings.Count(r.errOut, "ownerReferences"); n != 1 {
		t.Errorf("offline: %d lines about ownerReferences:\n%s", n, r.errOut)
	}
}
