package sandbox

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ResignServiceAccountToken returns token (one the API server issued) with
// its claims changed by edit and signed again with the cluster's
// service-account signing key, as only the holder of that key could: an
// expired copy of a real token, say. The API server verifies it like any
// other.
func (s *Sandbox) ResignServiceAccountToken(token string, edit func(claims map[string]any)) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", errors.New("not a JWS compact token")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("token payload: %w", err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", fmt.Errorf("token claims: %w", err)
	}
	edit(claims)
	if payload, err = json.Marshal(claims); err != nil {
		return "", err
	}
	keyPEM, err := os.ReadFile(s.pki.saKeyFile)
	if err != nil {
		return "", err
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return "", errors.New("service-account key: no PEM block")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("service-account key: %w", err)
	}
	// Keep the header (alg ES256, kid) as the API server wrote it.
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	digest := sha256.Sum256([]byte(signed))
	r, sig, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		return "", err
	}
	raw := make([]byte, 64)
	r.FillBytes(raw[:32])
	sig.FillBytes(raw[32:])
	return signed + "." + base64.RawURLEncoding.EncodeToString(raw), nil
}
