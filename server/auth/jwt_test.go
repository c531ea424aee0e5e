package auth_test

import (
	"context"

	"google.golang.org/grpc/metadata"

	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// agentJWT wraps a test's token name into a token shaped as an agent
// pod's projected ServiceAccount token (the claims pass the guard's cheap
// checks; the signature is not one), so the fake TokenReview decides;
// nameOfJWT gets the name back. Its pod claim is the name too: each
// token routes to a bucket of its own (the guard limits reviews per
// claimed pod), and the review, not the claim, says whose it is.
func agentJWT(name string) string {
	return podJWT(name, serverNS, name, "u")
}

// podJWT is agentJWT's token naming pod namespace/pod with uid.
func podJWT(name, namespace, pod, uid string) string {
	return jwtWith(map[string]any{
		"aud": []string{"etcdbackup"},
		"sub": "system:serviceaccount:" + namespace + ":" + config.DefaultServiceAccount,
		"exp": time.Now().Add(10 * time.Minute).Unix(),
		"jti": name,
		"kubernetes.io": map[string]any{
			"namespace": namespace,
			"pod":       map[string]string{"name": pod, "uid": uid},
		},
	})
}

func jwtWith(claims map[string]any) string {
	b, err := json.Marshal(claims)
	if err != nil {
		panic(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"test"}`)) + "." + enc(b) + "." + enc([]byte("not-a-signature"))
}

func nameOfJWT(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return tok
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return tok
	}
	var c struct {
		JTI string `json:"jti"`
	}
	if json.Unmarshal(b, &c) != nil || c.JTI == "" {
		return tok
	}
	return c.JTI
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func metadataCtx(authorization string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", authorization))
}
