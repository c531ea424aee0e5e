package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// coreDNSManifest (image, ClusterIP) is the cluster DNS as kubeadm installs it, trimmed: the
// coredns ServiceAccount with read access to Services, EndpointSlices,
// Pods and Namespaces, the Corefile, a Deployment of the CoreDNS image and
// the kube-dns Service at DNSServiceIP. CoreDNS listens on 1053 (the
// Service maps 53 to it) so it runs as non-root without
// NET_BIND_SERVICE. The Corefile has no `forward`: there is no upstream
// resolver, names outside cluster.local do not resolve.
const coreDNSManifest = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
  - kind: ServiceAccount
    name: coredns
    namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:1053 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: coredns
          image: %[1]s
          imagePullPolicy: Never
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - name: dns
              containerPort: 1053
              protocol: UDP
            - name: dns-tcp
              containerPort: 1053
              protocol: TCP
          readinessProbe:
            httpGet:
              path: /ready
              port: 8181
            periodSeconds: 1
          livenessProbe:
            httpGet:
              path: /health
              port: 8080
            periodSeconds: 10
          resources:
            limits:
              memory: 170Mi
            requests:
              cpu: 50m
              memory: 70Mi
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]
          volumeMounts:
            - name: config
              mountPath: /etc/coredns
              readOnly: true
      volumes:
        - name: config
          configMap:
            name: coredns
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  clusterIP: %[2]s
  selector:
    k8s-app: kube-dns
  ports:
    - name: dns
      port: 53
      targetPort: 1053
      protocol: UDP
    - name: dns-tcp
      port: 53
      targetPort: 1053
      protocol: TCP
`

// startDNS installs CoreDNS and waits until it is available (Ready: it
// has synced Services and EndpointSlices from the API server, which it
// reaches through the `kubernetes` Service, so kube-proxy works too) and
// kube-proxy routes the kube-dns Service to it.
func (s *Sandbox) startDNS(ctx context.Context) error {
	if err := s.applyManifest(ctx, fmt.Sprintf(coreDNSManifest, s.coreDNSImage, DNSServiceIP)); err != nil {
		return fmt.Errorf("install CoreDNS: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := s.WaitForDeploymentAvailable(ctx, "kube-system", "coredns"); err != nil {
		return fmt.Errorf("CoreDNS: %w", err)
	}
	// Ready means synced with the API server; pods reach it once
	// kube-proxy routes the kube-dns ClusterIP to it.
	return s.WaitForServiceRouted(ctx, "kube-system", "kube-dns")
}

// applyManifest runs `kubectl apply -f -` with the admin kubeconfig.
func (s *Sandbox) applyManifest(ctx context.Context, yaml string) error {
	cmd := exec.CommandContext(ctx, s.KubectlPath(), "--kubeconfig", s.kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(yaml)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kubectl apply: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}
