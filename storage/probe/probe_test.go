package probe_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/probe"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

// results is "step=result" of every step, in order.
func results(r probe.Result) []string {
	var out []string
	for _, s := range r.Steps {
		out = append(out, s.Name+"="+s.Result)
	}
	return out
}

func wantResults(t *testing.T, r probe.Result, want ...string) {
	t.Helper()
	for _, s := range r.Steps {
		t.Logf("%s: %s (%s): %s (advice: %s)", s.Name, s.Result, s.Duration, s.Detail, s.Advice)
	}
	if got := results(r); !slices.Equal(got, want) {
		t.Fatalf("steps:\n got %q\nwant %q", got, want)
	}
}

func step(t *testing.T, r probe.Result, name string) probe.Step {
	t.Helper()
	for _, s := range r.Steps {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no step %q in %q", name, results(r))
	return probe.Step{}
}

// TestFilesystem: every step that means something for a directory runs
// and passes; the S3 ones are skipped, saying why; nothing is left.
func TestFilesystem(t *testing.T) {
	dir := t.TempDir()
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	storagetest.Put(t, loc, "kept", storagetest.Data(1, 1000))
	r := probe.Run(t.Context(), loc, probe.Options{})
	wantResults(t, r, "write=ok", "multipart write=skipped", "ranged read=ok", "list=ok",
		"conditional create=ok", "checksums=skipped", "object lock=skipped", "delete=ok")
	if !r.OK() || len(r.Failed()) != 0 {
		t.Fatalf("OK() = %v, Failed() = %v", r.OK(), r.Failed())
	}
	if s := step(t, r, probe.StepObjectLock); s.Detail != "the location does not ask for object lock" {
		t.Errorf("object lock: %q", s.Detail)
	}
	if s := step(t, r, probe.StepMultipartWrite); !strings.Contains(s.Detail, "filesystem location stores every backup in one piece") {
		t.Errorf("multipart write: %q", s.Detail)
	}
	ms, err := loc.List(t.Context())
	if err != nil || len(ms) != 1 || ms[0].Name != "kept" {
		t.Fatalf("after the check the location lists %v (%v), want the backup alone", ms, err)
	}
	entries, err := os.ReadDir(filepath.Join(dir, "backups"))
	if err != nil || len(entries) != 2 {
		t.Fatalf("backups/ holds %v (%v), want kept.db and kept.json", entries, err)
	}
}

// TestLeftoverProbeRemoved: a probe an interrupted check left over an
// hour ago goes with the next check; a younger one (another check in
// flight) stays.
func TestLeftoverProbeRemoved(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, age := range map[string]time.Duration{storage.ProbePrefix + "old": 2 * time.Hour, storage.ProbePrefix + "young": time.Minute} {
		up, err := loc.Create(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		m := storagetest.NewManifest(name, 0, "")
		m.CreateTime = time.Now().Add(-age)
		if err := up.Commit(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	r := probe.Run(t.Context(), loc, probe.Options{})
	if s := step(t, r, probe.StepList); s.Result != probe.ResultOK || !strings.Contains(s.Detail, "removed 1 probe(s) an interrupted check left") {
		t.Fatalf("list: %s: %s", s.Result, s.Detail)
	}
	if _, err := loc.Stat(t.Context(), storage.ProbePrefix+"old"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("the old probe: %v, want it removed", err)
	}
	if _, err := loc.Stat(t.Context(), storage.ProbePrefix+"young"); err != nil {
		t.Errorf("the young probe: %v, want it kept", err)
	}
}

// TestEndedContext: a check whose context has ended runs no step and
// writes nothing.
func TestEndedContext(t *testing.T) {
	dir := t.TempDir()
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	r := probe.Run(ctx, loc, probe.Options{})
	for _, s := range r.Steps {
		if s.Result != probe.ResultSkipped || !strings.Contains(s.Detail, "context canceled") {
			t.Errorf("%s: %s: %s", s.Name, s.Result, s.Detail)
		}
	}
	if !r.OK() || len(r.Steps) != 8 {
		t.Errorf("OK() = %v with %d steps", r.OK(), len(r.Steps))
	}
	if ms, _ := loc.List(t.Context()); len(ms) != 0 {
		t.Errorf("left %d", len(ms))
	}
}

func newS3(t *testing.T, cfg s3.Config) *s3.Location {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	l, err := s3.New(ctx, cfg)
	if err != nil {
		t.Fatalf("s3.New: %v", err)
	}
	return l
}

// wantBucketEmpty checks that a check left nothing in the store: no
// object, no open multipart upload.
func wantBucketEmpty(t *testing.T, store *s3test.Server) {
	t.Helper()
	keys, err := store.Keys(t.Context())
	if err != nil || len(keys) != 0 {
		t.Errorf("the bucket holds %q (%v), want nothing", keys, err)
	}
	ups, err := store.OpenMultipartUploads(t.Context())
	if err != nil || len(ups) != 0 {
		t.Errorf("open multipart uploads %q (%v), want none", ups, err)
	}
}

// TestS3 on versitygw: every step but object lock runs and passes, the
// multipart write in two parts, with the SDK's default checksums and
// with when_required; nothing is left in the bucket.
func TestS3(t *testing.T) {
	store := s3test.Start(t)
	for _, mode := range []string{"", storage.ChecksumWhenRequired} {
		t.Run("requestChecksum="+mode, func(t *testing.T) {
			cfg := store.Config("check")
			cfg.RequestChecksum = mode
			r := probe.Run(t.Context(), newS3(t, cfg), probe.Options{})
			wantResults(t, r, "write=ok", "multipart write=ok", "ranged read=ok", "list=ok",
				"conditional create=ok", "checksums=ok", "object lock=skipped", "delete=ok")
			if s := step(t, r, probe.StepMultipartWrite); !strings.Contains(s.Detail, "in 2 parts of at most 5.0 MiB") {
				t.Errorf("multipart write: %q", s.Detail)
			}
			if s := step(t, r, probe.StepConditionalCreate); !strings.Contains(s.Detail, "the store refuses a create-only PUT (If-None-Match: *) over an existing object") {
				t.Errorf("conditional create: %q", s.Detail)
			}
			if s := step(t, r, probe.StepRangedRead); !strings.Contains(s.Detail, "bytes 5234688-5251071 of 5.0 MiB") {
				t.Errorf("ranged read: %q (want the range across the part boundary)", s.Detail)
			}
			wantBucketEmpty(t, store)
		})
	}
}

// TestS3ObjectLock: on a bucket with object lock, a location that asks
// for it passes every step, object lock included (a probe locked for
// seconds, refused deletion, removed after), and its probes are not
// locked for the location's days: nothing the check wrote is left.
func TestS3ObjectLock(t *testing.T) {
	store := s3test.Start(t)
	for _, mode := range []string{storage.ObjectLockGovernance, storage.ObjectLockCompliance} {
		t.Run(mode, func(t *testing.T) {
			prefix := "check-" + strings.ToLower(mode)
			r := probe.Run(t.Context(), newS3(t, store.LockedConfig(prefix, mode, 30)), probe.Options{})
			wantResults(t, r, "write=ok", "multipart write=ok", "ranged read=ok", "list=ok",
				"conditional create=ok", "checksums=ok", "object lock=ok", "delete=ok")
			if s := step(t, r, probe.StepObjectLock); !strings.Contains(s.Detail, "refuses to delete the locked version") {
				t.Errorf("object lock: %q", s.Detail)
			}
			out, err := store.Client().ListObjectVersions(t.Context(), &s3sdk.ListObjectVersionsInput{Bucket: aws.String(s3test.LockedBucket), Prefix: aws.String(prefix)})
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range out.Versions {
				if ret, err := store.Client().GetObjectRetention(t.Context(), &s3sdk.GetObjectRetentionInput{Bucket: aws.String(s3test.LockedBucket),
					Key: v.Key, VersionId: v.VersionId}); err == nil && ret.Retention != nil && aws.ToTime(ret.Retention.RetainUntilDate).After(time.Now()) {
					t.Errorf("the check left %s locked until %s", aws.ToString(v.Key), aws.ToTime(ret.Retention.RetainUntilDate))
				}
			}
		})
	}
	// A location on that bucket that does not ask for object lock skips
	// the step.
	unlocked := store.LockedConfig("check-unlocked", storage.ObjectLockCompliance, 1)
	unlocked.ObjectLock = nil
	r := probe.Run(t.Context(), newS3(t, unlocked), probe.Options{})
	if s := step(t, r, probe.StepObjectLock); s.Result != "skipped" || !strings.Contains(s.Detail, "does not ask for object lock") {
		t.Errorf("object lock without objectLock: %+v", s)
	}
}

// TestS3CredentialThatMayNotDelete: a versitygw user whose bucket policy
// allows everything but s3:DeleteObject. The check names the one step
// that fails, delete, with the store's refusal and the permission to
// grant, and no credential.
func TestS3CredentialThatMayNotDelete(t *testing.T) {
	store := s3test.Start(t)
	user := store.UserDenied(t, "s3:DeleteObject")
	r := probe.Run(t.Context(), newS3(t, store.ConfigAs("check", user)), probe.Options{})
	wantResults(t, r, "write=ok", "multipart write=ok", "ranged read=ok", "list=ok",
		"conditional create=ok", "checksums=ok", "object lock=skipped", "delete=failed")
	if failed := r.Failed(); len(failed) != 1 || failed[0].Name != probe.StepDelete {
		t.Fatalf("failed steps %v, want delete alone", failed)
	}
	s := step(t, r, probe.StepDelete)
	if !strings.Contains(s.Detail, "AccessDenied") || !strings.Contains(s.Detail, "DeleteObject") {
		t.Errorf("delete's detail %q does not give the store's refusal", s.Detail)
	}
	for _, w := range []string{"the credentials may not delete objects", "grant s3:DeleteObject (and s3:AbortMultipartUpload) on arn:aws:s3:::etcdbackup/check/backups/*", "retention and delete cannot work"} {
		if !strings.Contains(s.Advice, w) {
			t.Errorf("delete's advice %q does not say %q", s.Advice, w)
		}
	}
	for _, st := range r.Steps {
		for _, secret := range []string{user.SecretAccessKey, store.SecretAccessKey} {
			if strings.Contains(st.Detail+st.Advice, secret) {
				t.Errorf("%s: a secret key in %q / %q", st.Name, st.Detail, st.Advice)
			}
		}
	}
	// Root may: the probes this credential could not remove go with the
	// next check by one that may, once they are an hour old.
	keys, err := store.Keys(t.Context())
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %q (%v): want the probes the user could not delete", keys, err)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "check/backups/"+storage.ProbePrefix) {
			t.Errorf("left %q, which is no probe's", k)
		}
	}
}

// storeProxy stands in front of versitygw as an S3-compatible store that
// differs from it in one way: refuse may answer a request itself (it
// writes the answer and returns true), answer may change versitygw's
// answer. Neither can change a request: the client signed it.
func storeProxy(t *testing.T, store *s3test.Server, refuse func(http.ResponseWriter, *http.Request) bool, answer func(*http.Response) error) (endpoint, caFile string) {
	t.Helper()
	target, err := url.Parse(store.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(store.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host // the client signed the proxy's host
		},
		Transport:      &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		ModifyResponse: answer,
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse == nil || !refuse(w, r) {
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	caFile = filepath.Join(t.TempDir(), "proxy-ca.crt")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv.URL, caFile
}

// TestS3StoreRefusingChecksums: a store that refuses the AWS SDK's
// request checksum headers, as Backblaze B2 answered Velero (#7534:
// InvalidArgument "Unsupported header 'x-amz-sdk-checksum-algorithm'
// received for this API call."). With the default requestChecksum the
// writes fail and the checksums step pins it on the headers, each
// advising requestChecksum: when_required; nothing is left. With that
// setting, the same store passes.
func TestS3StoreRefusingChecksums(t *testing.T) {
	store := s3test.Start(t)
	refused := 0
	endpoint, caFile := storeProxy(t, store, func(w http.ResponseWriter, r *http.Request) bool {
		if (r.Method != http.MethodPut && r.Method != http.MethodPost) ||
			(r.Header.Get("X-Amz-Sdk-Checksum-Algorithm") == "" && r.Header.Get("X-Amz-Trailer") == "" && r.Header.Get("X-Amz-Checksum-Crc32") == "") {
			return false
		}
		refused++
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?>` +
			`<Error><Code>InvalidArgument</Code><Message>Unsupported header 'x-amz-sdk-checksum-algorithm' received for this API call.</Message></Error>`))
		return true
	}, nil)
	cfg := store.Config("check")
	cfg.Endpoint, cfg.CABundleFile = endpoint, caFile
	r := probe.Run(t.Context(), newS3(t, cfg), probe.Options{})
	wantResults(t, r, "write=failed", "multipart write=failed", "ranged read=skipped", "list=ok",
		"conditional create=failed", "checksums=failed", "object lock=skipped", "delete=skipped")
	if refused == 0 {
		t.Fatal("the proxy refused nothing: the SDK sent no checksum header")
	}
	for _, name := range []string{probe.StepWrite, probe.StepMultipartWrite, probe.StepChecksums} {
		s := step(t, r, name)
		if !strings.Contains(s.Advice, "set requestChecksum: when_required on this location") {
			t.Errorf("%s: advice %q", name, s.Advice)
		}
		if !strings.Contains(s.Detail, "Unsupported header 'x-amz-sdk-checksum-algorithm'") {
			t.Errorf("%s: detail %q does not give the store's answer", name, s.Detail)
		}
	}
	if s := step(t, r, probe.StepChecksums); !strings.Contains(s.Detail, "refused a PUT carrying the AWS SDK's CRC32 request checksum") {
		t.Errorf("checksums: %q", s.Detail)
	}
	wantBucketEmpty(t, store)

	cfg.RequestChecksum = storage.ChecksumWhenRequired
	refused = 0
	r = probe.Run(t.Context(), newS3(t, cfg), probe.Options{})
	wantResults(t, r, "write=ok", "multipart write=ok", "ranged read=ok", "list=ok",
		"conditional create=ok", "checksums=ok", "object lock=skipped", "delete=ok")
	if refused != 0 {
		t.Errorf("with when_required the proxy still refused %d requests", refused)
	}
	wantBucketEmpty(t, store)
}

// TestS3StoreIgnoringConditionalWrites: a store that ignores
// If-None-Match answers a create-only PUT over an existing object 200 (the
// proxy turns versitygw's 412 into that): the conditional create step
// fails, advising noConditionalWrites and one writer. With that setting
// it is skipped, saying what it costs.
func TestS3StoreIgnoringConditionalWrites(t *testing.T) {
	store := s3test.Start(t)
	endpoint, caFile := storeProxy(t, store, nil, func(resp *http.Response) error {
		if resp.StatusCode == http.StatusPreconditionFailed && resp.Request.Header.Get("If-None-Match") != "" {
			resp.StatusCode, resp.Status = http.StatusOK, "200 OK"
			resp.Header = http.Header{"Etag": {`"0123456789abcdef0123456789abcdef"`}, "Content-Length": {"0"}}
			resp.ContentLength = 0
			resp.Body = http.NoBody
		}
		return nil
	})
	cfg := store.Config("check")
	cfg.Endpoint, cfg.CABundleFile = endpoint, caFile
	r := probe.Run(t.Context(), newS3(t, cfg), probe.Options{})
	wantResults(t, r, "write=ok", "multipart write=ok", "ranged read=ok", "list=ok",
		"conditional create=failed", "checksums=ok", "object lock=skipped", "delete=ok")
	s := step(t, r, probe.StepConditionalCreate)
	if !strings.Contains(s.Detail, "despite If-None-Match: *") || !strings.Contains(s.Advice, "set noConditionalWrites: true") {
		t.Errorf("conditional create: %q, advice %q", s.Detail, s.Advice)
	}
	wantBucketEmpty(t, store)

	cfg.NoConditionalWrites = true
	r = probe.Run(t.Context(), newS3(t, cfg), probe.Options{})
	if !r.OK() {
		t.Fatalf("with noConditionalWrites: %q", results(r))
	}
	if s := step(t, r, probe.StepConditionalCreate); !strings.Contains(s.Detail, "noConditionalWrites is set") {
		t.Errorf("conditional create with noConditionalWrites: %q", s.Detail)
	}
}
