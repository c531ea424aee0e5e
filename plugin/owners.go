package plugin

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
)

// ownerChecker asks the live cluster whether the owners an extracted
// object's ownerReferences name still exist with the UIDs they had: a
// reference to an owner that does exist is kept (the object is again
// that owner's dependent, garbage-collected with it, as it was); one to
// an owner that is gone is removed, or the garbage collector would
// delete the recovered object again. Only metadata is read.
type ownerChecker struct {
	mapper meta.RESTMapper
	client metadata.Interface
	seen   map[ownerKey]ownerAnswer
	// broken is the first lookup error: the cluster is not asked again
	// (an unreachable API server would otherwise cost a timeout per
	// owner).
	broken error
}

type ownerKey struct {
	apiVersion, kind, namespace, name string
}

type ownerAnswer struct {
	uid   string
	found bool
	err   error
}

// newOwnerChecker builds the checker from the kubeconfig; tests replace
// it.
var newOwnerChecker = func(g *GlobalOptions) (*ownerChecker, error) {
	if g == nil || g.ConfigFlags == nil {
		return nil, fmt.Errorf("no kubeconfig")
	}
	cfg, err := g.ConfigFlags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	mapper, err := g.ConfigFlags.ToRESTMapper()
	if err != nil {
		return nil, fmt.Errorf("discover the cluster's resource types: %w", err)
	}
	client, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &ownerChecker{mapper: mapper, client: client}, nil
}

// exists says whether ref's owner exists in the cluster with ref's UID;
// namespace is the dependent's (an owner is in its namespace or
// cluster-scoped). An error is a question the cluster did not answer.
func (c *ownerChecker) exists(ctx context.Context, namespace string, ref metav1.OwnerReference) (bool, error) {
	if c.seen == nil {
		c.seen = map[ownerKey]ownerAnswer{}
	}
	key := ownerKey{ref.APIVersion, ref.Kind, namespace, ref.Name}
	if c.broken != nil {
		return false, c.broken
	}
	a, ok := c.seen[key]
	if !ok {
		a = c.lookup(ctx, key)
		c.seen[key] = a
		c.broken = a.err
	}
	if a.err != nil {
		return false, a.err
	}
	return a.found && a.uid == string(ref.UID), nil
}

func (c *ownerChecker) lookup(ctx context.Context, k ownerKey) ownerAnswer {
	gv, err := schema.ParseGroupVersion(k.apiVersion)
	if err != nil {
		return ownerAnswer{} // not a reference the API server would have kept: no owner
	}
	m, err := c.mapper.RESTMapping(schema.GroupKind{Group: gv.Group, Kind: k.kind}, gv.Version)
	if meta.IsNoMatchError(err) {
		return ownerAnswer{} // the owner's type is gone, and so is the owner
	}
	if err != nil {
		return ownerAnswer{err: fmt.Errorf("find %s %s: %w", k.apiVersion, k.kind, err)}
	}
	var ri metadata.ResourceInterface = c.client.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = c.client.Resource(m.Resource).Namespace(k.namespace)
	}
	obj, err := ri.Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ownerAnswer{}
	}
	if err != nil {
		return ownerAnswer{err: fmt.Errorf("get %s %s: %w", k.kind, k.name, err)}
	}
	return ownerAnswer{uid: string(obj.UID), found: true}
}
