package jobs

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// AgentImageContainer is the init container of the server's Pod whose image
// is the agent image. It exists so that the agent image is an `image:`
// field of the server's own Deployment, the only kind of field kustomize's
// `images:` (and every mirror-rewriting tool) rewrites; running
// `etcdbackup-agent --version` there also pulls the image onto the node
// before the first backup needs it.
const AgentImageContainer = "agent-image"

// AgentImage returns the image of init container AgentImageContainer of the
// server's own pod (namespace/pod, from the downward API), or "" when the
// pod has no such container. It returns the reference as the Deployment
// spells it, not the digest the node resolved: a digest reference of an
// image imported into a node's runtime without a registry would send the
// kubelet to a registry that may not exist; an overlay that wants a digest
// writes it in `images:` and the reference then carries it.
func AgentImage(ctx context.Context, client kubernetes.Interface, namespace, pod string) (string, error) {
	if namespace == "" || pod == "" {
		return "", errors.New("agent image: the server's pod is unknown: set POD_NAMESPACE and POD_NAME from the downward API")
	}
	p, err := client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if apierrors.IsForbidden(err) {
		return "", fmt.Errorf("agent image: reading the server's own pod %s/%s needs `get pods` in the server's Role: %w", namespace, pod, err)
	}
	if err != nil {
		return "", fmt.Errorf("agent image: read the server's own pod %s/%s: %w", namespace, pod, err)
	}
	for _, c := range p.Spec.InitContainers {
		if c.Name == AgentImageContainer {
			return c.Image, nil
		}
	}
	return "", nil
}
