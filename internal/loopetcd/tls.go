package loopetcd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// certValidity is how long the throwaway certificates are valid: longer
// than any drill, replay or fold runs (an agent Job's deadline is hours),
// short enough that a stray copy of the key is worth nothing for long.
const certValidity = 7 * 24 * time.Hour

// RootUser is the user the member's client authenticates as: etcd maps
// a verified client certificate's CommonName to a user when auth is
// enabled, and a snapshot of an etcd with auth enabled always has root
// (etcd refuses `auth enable` without it, and refuses to take the root
// role from it while auth is on). Without auth the name is ignored.
const RootUser = "root"

// memberTLS is one member's throwaway PKI: a CA made for it alone, the
// serving certificate etcd reads from files, and the client certificate
// (CommonName root), kept in memory.
type memberTLS struct {
	server transport.TLSInfo
	client *tls.Config
}

// newMemberTLS makes a fresh CA (ECDSA P-256) in memory and writes what
// etcd must read from files — the CA's certificate and the serving
// certificate and key — into dir, which must exist and be private. The
// CA's key is never written: nothing else can be signed by it once the
// process ends.
func newMemberTLS(dir string) (*memberTLS, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		Subject:   pkix.Name{CommonName: "etcdbackup scratch etcd CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(certValidity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	if caTmpl.SerialNumber, err = serial(); err != nil {
		return nil, err
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	issue := func(cn string, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, *ecdsa.PrivateKey, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			Subject:   pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(certValidity),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: ips,
		}
		if tmpl.SerialNumber, err = serial(); err != nil {
			return nil, nil, err
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		return der, key, err
	}
	serverDER, serverKey, err := issue("etcdbackup scratch etcd", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	clientDER, clientKey, err := issue(RootUser, x509.ExtKeyUsageClientAuth, nil)
	if err != nil {
		return nil, err
	}
	serverKeyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return nil, err
	}
	write := func(name, typ string, der []byte) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
	}
	t := &memberTLS{server: transport.TLSInfo{ClientCertAuth: true}}
	if t.server.TrustedCAFile, err = write("ca.crt", "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	if t.server.CertFile, err = write("server.crt", "CERTIFICATE", serverDER); err != nil {
		return nil, err
	}
	if t.server.KeyFile, err = write("server.key", "EC PRIVATE KEY", serverKeyDER); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	t.client = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		RootCAs:      pool,
		Certificates: []tls.Certificate{{Certificate: [][]byte{clientDER}, PrivateKey: clientKey}},
	}
	return t, nil
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
