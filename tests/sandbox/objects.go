package sandbox

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CreateService creates a ClusterIP Service (the namespace too, if
// missing). The EndpointSlice controller gives it endpoints as in any
// cluster, and Pods reach it by name through cluster DNS.
func (s *Sandbox) CreateService(ctx context.Context, ns, name string, selector map[string]string, ports []corev1.ServicePort) error {
	if err := s.EnsureNamespace(ctx, ns); err != nil {
		return err
	}
	_, err := s.client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: maps.Clone(selector),
			Ports:    ports,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("sandbox: create service %s/%s: %w", ns, name, err)
	}
	return nil
}
