package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// configFor is a client configuration for a client-certificate identity.
func (s *Sandbox) configFor(certPEM, keyPEM []byte) *rest.Config {
	return &rest.Config{
		Host: s.apiserver.url,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   s.pki.ca.certPEM,
			CertData: certPEM,
			KeyData:  keyPEM,
		},
		// Tests create objects in bursts; client-side throttling (default
		// 5 QPS) would only add waiting.
		QPS:   100,
		Burst: 200,
	}
}

// writeKubeconfig writes a self-contained kubeconfig (certificates embedded)
// with one cluster, user and context, all named "sandbox"/user.
func (s *Sandbox) writeKubeconfig(path, user string, certPEM, keyPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["sandbox"] = &clientcmdapi.Cluster{
		Server:                   s.apiserver.url,
		CertificateAuthorityData: s.pki.ca.certPEM,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: certPEM,
		ClientKeyData:         keyPEM,
	}
	ctxName := user + "@sandbox"
	cfg.Contexts[ctxName] = &clientcmdapi.Context{Cluster: "sandbox", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = ctxName
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("kubeconfig dir: %w", err)
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// NewUserKubeconfig writes a kubeconfig for a user authenticated by a client
// certificate (CN=user, O=groups) signed by the client CA, and returns its
// path (under Dir/kubeconfigs). The user has no permissions beyond what RBAC
// grants its name or groups: bind roles to test authorization.
func (s *Sandbox) NewUserKubeconfig(user string, groups ...string) (string, error) {
	if user == "" {
		return "", fmt.Errorf("sandbox: NewUserKubeconfig: empty user name")
	}
	certPEM, keyPEM, err := s.pki.newClientCert(user, groups)
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	path := filepath.Join(s.dir, "kubeconfigs", unsafeFileChars.ReplaceAllString(user, "_")+".kubeconfig")
	if err := s.writeKubeconfig(path, user, certPEM, keyPEM); err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	return path, nil
}

// UserRESTConfig is NewUserKubeconfig's identity as a client configuration.
func (s *Sandbox) UserRESTConfig(user string, groups ...string) (*rest.Config, error) {
	certPEM, keyPEM, err := s.pki.newClientCert(user, groups)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return s.configFor(certPEM, keyPEM), nil
}

// componentKubeconfig writes the kubeconfig of a control-plane component
// (under Dir/kubeconfigs) and returns its path.
func (s *Sandbox) componentKubeconfig(name string, kp *keyPair) (string, error) {
	path := filepath.Join(s.dir, "kubeconfigs", name+".kubeconfig")
	if err := s.writeKubeconfig(path, name, kp.certPEM, kp.keyPEM); err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	return path, nil
}
