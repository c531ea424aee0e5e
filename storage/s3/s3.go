// Package s3 is the storage location backed by an S3 bucket (AWS S3 or an
// S3-compatible store such as versitygw), through aws-sdk-go-v2.
//
// Layout under the configured prefix:
//
//	PREFIX/backups/NAME.db    the backup's data
//	PREFIX/backups/NAME.json  its manifest, written last: its presence makes the backup exist
//
// Create starts a multipart upload fed through an io.Pipe by the transfer
// manager (feature/s3/transfermanager): memory is bounded by about
// (Concurrency+2) × PartSize per upload, whatever the backup's size. Commit
// completes the data object, then writes the manifest. Both writes carry
// If-None-Match: *, so the data of a published backup can never be replaced
// and of two racing commits of one name (even from two servers) exactly one
// wins. Within one process, publishing and deleting a name are serialised
// as well. Abort (or a failed or cancelled Commit) aborts the multipart
// upload: nothing is listed and no part is left behind; if the store is
// unreachable at that moment, the abort is retried by later operations and
// CleanOrphans.
//
// Open resumes with a ranged GET (Range: bytes=OFFSET-) carrying If-Match
// on the data's ETag, which the manifest object records in its metadata:
// data replaced behind a manifest is never served under it.
//
// Data objects without a manifest (a crash between the two writes, a delete
// that failed halfway) are never listed; CleanOrphans removes them once
// older than OrphanAge, and aborts multipart uploads under the prefix
// started more than StaleUploadAge ago (a server killed mid-upload). New
// runs it unless told not to. A location opened with Config.ReadOnly
// writes nothing: no cleanup, and Create and Delete are refused.
package s3

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/logging"
	"golang.org/x/sync/errgroup"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

const (
	dataSuffix     = ".db"
	manifestSuffix = ".json"
	// dataETagMeta is the manifest object's user metadata holding the ETag
	// of the data it describes: Open reads the data with If-Match on it.
	dataETagMeta = "etcdbackup-data-etag"
	// maxManifestBytes bounds what Stat reads of a manifest object.
	maxManifestBytes = 1 << 20
	// cleanupTimeout bounds aborts and deletes done on behalf of an upload
	// whose own context may already be cancelled.
	cleanupTimeout = 30 * time.Second
	// listConcurrency is how many manifests List reads at once.
	listConcurrency = 8
)

// errBadManifest marks a manifest object that is not a manifest of its name.
var errBadManifest = errors.New("invalid manifest")

// Location stores backups in an S3 bucket.
type Location struct {
	cfg        Config
	client     *s3sdk.Client
	tm         *transfermanager.Client
	backupsKey string // "PREFIX/backups/"
	where      string // Describe()
	log        *slog.Logger

	mu sync.Mutex
	// naming holds a channel per name being published or deleted by this
	// process, closed when done.
	naming map[string]chan struct{}
	// active counts this process's uploads per name, so CleanOrphans never
	// touches them.
	active map[string]int
	// pendingAborts are multipart uploads (ID → key) of this process whose
	// abort failed, retried by Create and CleanOrphans.
	pendingAborts map[string]string

	// listed are the manifests List read, by name, with the ETag the
	// listing gave their object: a List reads again only the manifests
	// whose object is new or changed (a drill's verdict), so listing a
	// location of thousands of backups and delta segments costs one
	// LIST, not a GET each.
	listed map[string]listedManifest
}

type listedManifest struct {
	etag string
	m    *storage.Manifest
}

var (
	_ storage.Location           = (*Location)(nil)
	_ storage.Checker            = (*Location)(nil)
	_ storage.VerificationWriter = (*Location)(nil)
)

// New validates cfg, builds a client isolated from ~/.aws and AWS_*
// (unless cfg.DefaultCredentialChain), checks that the bucket is reachable
// with the credentials, and (unless cfg.SkipCleanup or cfg.ReadOnly)
// cleans what crashed uploads left behind. Errors name the bucket and endpoint, never a secret.
func New(ctx context.Context, cfg Config) (*Location, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	client, err := newClient(ctx, &cfg, newHTTPClient(cfg, tc))
	if err != nil {
		return nil, err
	}
	l := &Location{
		cfg:           cfg,
		client:        client,
		tm:            newTransferManager(client, cfg),
		backupsKey:    joinKey(cfg.Prefix, "backups") + "/",
		where:         cfg.describe(),
		log:           cfg.Logger,
		naming:        map[string]chan struct{}{},
		active:        map[string]int{},
		pendingAborts: map[string]string{},
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if err := l.checkBucket(ctx); err != nil {
		return nil, err
	}
	if cfg.ObjectLock != nil && !cfg.ReadOnly {
		if err := l.checkObjectLock(ctx); err != nil {
			return nil, err
		}
	}
	if !cfg.SkipCleanup && !cfg.ReadOnly {
		l.cleanAtStart(ctx)
	}
	return l, nil
}

// newHTTPClient is the client of every request to the store: TLS as
// configured, and each wait (connecting, the TLS handshake, the response
// headers) bounded by ResponseTimeout.
func newHTTPClient(cfg Config, tc *tls.Config) *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.TLSClientConfig = tc
		tr.TLSHandshakeTimeout = min(tr.TLSHandshakeTimeout, cfg.ResponseTimeout)
		tr.ResponseHeaderTimeout = cfg.ResponseTimeout
	}).WithDialerOptions(func(d *net.Dialer) {
		d.Timeout = min(d.Timeout, cfg.ResponseTimeout)
	})
}

// newClient is the S3 client: credentials from the SDK's default chain
// when cfg asks for it (which may set cfg.Region), else only from the
// configured files and environment variables.
func newClient(ctx context.Context, cfg *Config, httpClient *awshttp.BuildableClient) (*s3sdk.Client, error) {
	common := clientOptions(*cfg, httpClient)
	if cfg.DefaultCredentialChain {
		load := []func(*awsconfig.LoadOptions) error{awsconfig.WithHTTPClient(httpClient)}
		if cfg.Region != "" {
			load = append(load, awsconfig.WithRegion(cfg.Region))
		}
		awsCfg, err := awsconfig.LoadDefaultConfig(ctx, load...)
		if err != nil {
			return nil, fmt.Errorf("s3 storage location s3://%s: load the default AWS configuration: %w", cfg.Bucket, err)
		}
		if awsCfg.Region == "" {
			awsCfg.Region = DefaultRegion
		}
		cfg.Region = awsCfg.Region
		return s3sdk.NewFromConfig(awsCfg, common), nil
	}
	src := secretSource{
		idFile: cfg.AccessKeyIDFile, secretFile: cfg.SecretAccessKeyFile, tokenFile: cfg.SessionTokenFile,
		idEnv: cfg.AccessKeyIDEnv, secretEnv: cfg.SecretAccessKeyEnv, tokenEnv: cfg.SessionTokenEnv,
	}
	// s3.New, not LoadDefaultConfig: nothing from ~/.aws or AWS_* applies.
	return s3sdk.New(s3sdk.Options{
		Region:      cfg.Region,
		Credentials: aws.NewCredentialsCache(src),
		Logger:      logging.Nop{},
	}, common), nil
}

// clientOptions are the client's options whichever way its credentials
// come: endpoint, addressing, checksums, retries.
func clientOptions(cfg Config, httpClient *awshttp.BuildableClient) func(*s3sdk.Options) {
	return func(so *s3sdk.Options) {
		so.HTTPClient = httpClient
		so.UsePathStyle = cfg.PathStyle
		if cfg.Endpoint != "" {
			so.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		so.RequestChecksumCalculation = cfg.requestChecksum()
		so.ResponseChecksumValidation = cfg.responseChecksum()
		// Ranged GETs and multipart objects carry no whole-object checksum
		// to validate; without this every such GET logs a warning.
		so.DisableLogOutputChecksumValidationSkipped = true
		so.Retryer = newRetryer()
		so.RetryMaxAttempts = 0
	}
}

// newTransferManager uploads through client in parts of cfg's size, cfg's
// number at once.
func newTransferManager(client *s3sdk.Client, cfg Config) *transfermanager.Client {
	return transfermanager.New(client, func(to *transfermanager.Options) {
		to.PartSizeBytes = cfg.partSize
		// Below one part the data goes in a single PutObject; the
		// first part is read into its own buffer, so a threshold above
		// PartSize would hold more memory.
		to.MultipartUploadThreshold = cfg.partSize
		to.Concurrency = cfg.Concurrency
		// The transfer manager ignores the client's setting.
		to.RequestChecksumCalculation = cfg.requestChecksum()
		// Abort the multipart upload with a fresh context when the
		// upload's own context was cancelled (Abort cancels it).
		to.FailTimeout = cleanupTimeout
	})
}

// cleanAtStart removes what interrupted uploads left (CleanOrphans); a
// failure is logged, and the next start tries again.
func (l *Location) cleanAtStart(ctx context.Context) {
	res, err := l.CleanOrphans(ctx)
	if err != nil {
		l.log.Warn("s3 storage location: cleaning interrupted uploads failed; it is retried at the next start",
			"s3", l.where, "error", err)
	}
	if res.any() {
		l.log.Info("s3 storage location: cleaned interrupted uploads", "s3", l.where,
			"abortedUploads", res.AbortedUploads, "removedOrphans", res.RemovedOrphans)
	}
}

func joinKey(prefix, rest string) string {
	if prefix == "" {
		return rest
	}
	return prefix + "/" + rest
}

// newRetryer is the SDK's standard retryer, except that a TLS certificate
// that cannot be verified fails at once: retrying cannot fix it.
func newRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
			if isCertificateError(err) {
				return aws.FalseTernary
			}
			return aws.UnknownTernary
		})}, o.Retryables...)
	})
}

func isCertificateError(err error) bool {
	var cve *tls.CertificateVerificationError
	return errors.As(err, &cve)
}

// checkBucket makes one authenticated request to the bucket and turns the
// usual failures into what to do.
func (l *Location) checkBucket(ctx context.Context) error {
	_, err := l.client.HeadBucket(ctx, &s3sdk.HeadBucketInput{Bucket: aws.String(l.cfg.Bucket)})
	if err == nil {
		return nil
	}
	where := fmt.Sprintf("bucket %q at %s", l.cfg.Bucket, l.endpointName())
	switch {
	case isCertificateError(err):
		return fmt.Errorf("s3 storage location: cannot verify the TLS certificate of %s: set caBundleFile to the CA that signed it: %w",
			l.endpointName(), err)
	case httpStatus(err) == http.StatusForbidden:
		return fmt.Errorf("s3 storage location: access to %s was denied: check the credentials (%s) and the bucket's policy: %w",
			where, l.credentialSource(), err)
	case httpStatus(err) == http.StatusNotFound:
		return fmt.Errorf("s3 storage location: %s does not exist: create it or fix the bucket name: %w", where, err)
	case httpStatus(err) == http.StatusMovedPermanently:
		return fmt.Errorf("s3 storage location: %s is in another region than %q: set region: %w", where, l.cfg.Region, err)
	}
	return fmt.Errorf("s3 storage location: %s is not reachable: %w", where, err)
}

// Check implements storage.Checker: the bucket answers an authenticated
// request.
func (l *Location) Check(ctx context.Context) error {
	return l.checkBucket(ctx)
}

func (l *Location) endpointName() string {
	if l.cfg.Endpoint != "" {
		return l.cfg.Endpoint
	}
	return "AWS S3 (" + l.cfg.Region + ")"
}

// credentialSource says where credentials come from, naming files and
// variables, never values.
func (l *Location) credentialSource() string {
	switch {
	case l.cfg.AccessKeyIDFile != "":
		return fmt.Sprintf("files %s and %s", l.cfg.AccessKeyIDFile, l.cfg.SecretAccessKeyFile)
	case l.cfg.AccessKeyIDEnv != "":
		return fmt.Sprintf("environment variables %s and %s", l.cfg.AccessKeyIDEnv, l.cfg.SecretAccessKeyEnv)
	}
	return "the default AWS credential chain"
}

// Type implements storage.Location.
func (l *Location) Type() string { return "s3" }

// Describe implements storage.Location: s3://bucket/prefix and the
// endpoint, never a credential.
func (l *Location) Describe() string { return l.where }

func (l *Location) dataKey(name string) string     { return l.backupsKey + name + dataSuffix }
func (l *Location) manifestKey(name string) string { return l.backupsKey + name + manifestSuffix }

// checkName is a last line of defence: the request layer validates names
// properly, but this layer must never write outside its prefix.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.ContainsRune(name, 0) {
		return fmt.Errorf("invalid backup name %q", name)
	}
	return nil
}

// lockName serialises publishing and deleting name within this process.
func (l *Location) lockName(ctx context.Context, name string) (unlock func(), err error) {
	for {
		l.mu.Lock()
		ch, busy := l.naming[name]
		if !busy {
			ch = make(chan struct{})
			l.naming[name] = ch
			l.mu.Unlock()
			return func() {
				l.mu.Lock()
				delete(l.naming, name)
				l.mu.Unlock()
				close(ch)
			}, nil
		}
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Stat implements storage.Location.
func (l *Location) Stat(ctx context.Context, name string) (*storage.Manifest, error) {
	m, _, err := l.stat(ctx, name)
	return m, err
}

// stat reads name's manifest and the ETag of the data it describes ("" if
// the manifest does not say).
func (l *Location) stat(ctx context.Context, name string) (*storage.Manifest, string, error) {
	if err := checkName(name); err != nil {
		return nil, "", err
	}
	out, err := l.client.GetObject(ctx, &s3sdk.GetObjectInput{
		Bucket: aws.String(l.cfg.Bucket),
		Key:    aws.String(l.manifestKey(name)),
	})
	if isNotFound(err) {
		return nil, "", fmt.Errorf("%q: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return nil, "", fmt.Errorf("read manifest of %q from %s: %w", name, l.where, err)
	}
	defer out.Body.Close()
	m, err := readManifest(out.Body, name)
	if err != nil {
		return nil, "", fmt.Errorf("manifest %s in %s: %w", l.manifestKey(name), l.where, err)
	}
	return m, out.Metadata[dataETagMeta], nil
}

// readManifest reads a manifest object's body, at most maxManifestBytes
// of it, as the manifest of name. A body that is not one (too large, not
// JSON, another name's) wraps errBadManifest; any other error is the
// read's.
func readManifest(body io.Reader, name string) (*storage.Manifest, error) {
	b, err := io.ReadAll(io.LimitReader(body, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("%w: it is larger than %d bytes", errBadManifest, maxManifestBytes)
	}
	var m storage.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: decode: %w", errBadManifest, err)
	}
	if err := storage.CheckManifest(&m, name); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadManifest, err)
	}
	return &m, nil
}

// Open implements storage.Location. An offset > 0 or a length is a ranged
// GET. The
// data is read with If-Match on the ETag the manifest recorded, so a
// backup deleted and re-uploaded between the two reads is not mixed up.
func (l *Location) Open(ctx context.Context, name string, offset, length int64) (io.ReadCloser, *storage.Manifest, error) {
	m, etag, err := l.stat(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if offset < 0 || offset > m.Size || length < 0 {
		return nil, nil, fmt.Errorf("offset %d, length %d outside backup %q of %d bytes", offset, length, name, m.Size)
	}
	if offset == m.Size && offset > 0 {
		// S3 refuses a range starting at the end (416); there is nothing
		// to read anyway.
		return io.NopCloser(bytes.NewReader(nil)), m, nil
	}
	in := &s3sdk.GetObjectInput{
		Bucket: aws.String(l.cfg.Bucket),
		Key:    aws.String(l.dataKey(name)),
	}
	if etag != "" {
		in.IfMatch = aws.String(etag)
	}
	switch {
	case length > 0 && offset+length < m.Size:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", offset, offset+length-1))
	case offset > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", offset))
	}
	out, err := l.client.GetObject(ctx, in)
	if isNotFound(err) || isPreconditionFailed(err) {
		// Deleted (or replaced) between reading the manifest and the data.
		return nil, nil, fmt.Errorf("%q: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read data of %q from %s at offset %d: %w", name, l.where, offset, err)
	}
	return out.Body, m, nil
}

// List implements storage.Location: the manifests under the prefix.
func (l *Location) List(ctx context.Context) ([]*storage.Manifest, error) {
	var names, etags []string
	err := l.listBackupKeys(ctx, func(key, name string, _ time.Time, etag string) {
		if n, ok := strings.CutSuffix(name, manifestSuffix); ok && checkName(n) == nil {
			names, etags = append(names, n), append(etags, etag)
		}
	})
	if err != nil {
		return nil, err
	}
	found := make([]*storage.Manifest, len(names))
	l.mu.Lock()
	known := l.listed
	l.mu.Unlock()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	for i, name := range names {
		if c, ok := known[name]; ok && etags[i] != "" && c.etag == etags[i] {
			found[i] = c.m.Clone()
			continue
		}
		g.Go(func() error {
			m, err := l.Stat(gctx, name)
			if errors.Is(err, storage.ErrNotFound) {
				return nil // deleted while listing
			}
			if errors.Is(err, errBadManifest) {
				// Not written by this program (someone else's object under
				// the prefix): one bad object must not hide every backup.
				l.log.Warn("s3 storage location: skipping an unreadable manifest", "s3", l.where, "error", err)
				return nil
			}
			found[i] = m
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make([]*storage.Manifest, 0, len(found))
	listed := make(map[string]listedManifest, len(found))
	for i, m := range found {
		if m != nil {
			listed[names[i]] = listedManifest{etag: etags[i], m: m.Clone()}
			out = append(out, m)
		}
	}
	l.mu.Lock()
	l.listed = listed
	l.mu.Unlock()
	return out, nil
}

// listBackupKeys calls fn for every object directly under PREFIX/backups/.
func (l *Location) listBackupKeys(ctx context.Context, fn func(key, name string, modified time.Time, etag string)) error {
	p := s3sdk.NewListObjectsV2Paginator(l.client, &s3sdk.ListObjectsV2Input{
		Bucket: aws.String(l.cfg.Bucket),
		Prefix: aws.String(l.backupsKey),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list %s: %w", l.where, err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			rest, ok := strings.CutPrefix(key, l.backupsKey)
			if !ok || strings.Contains(rest, "/") {
				continue
			}
			fn(key, rest, aws.ToTime(o.LastModified), aws.ToString(o.ETag))
		}
	}
	return nil
}

// Delete implements storage.Location: the manifest first, then the data.
func (l *Location) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if l.cfg.ReadOnly {
		return fmt.Errorf("delete %q from %s: %w", name, l.where, storage.ErrReadOnly)
	}
	unlock, err := l.lockName(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	head, err := l.head(ctx, l.manifestKey(name))
	if isNotFound(err) {
		return fmt.Errorf("%q: %w", name, storage.ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("delete %q from %s: %w", name, l.where, err)
	}
	// Under object lock a delete must not begin: on a versioned bucket
	// it would hide the backup behind a delete marker (the store keeps
	// the bytes, but the backup is gone from every listing), and the
	// store refuses the data's removal only later.
	// A manifest this program cannot read (errBadManifest) says no lock
	// of its own; the store's HEAD still does.
	m, _, err := l.stat(ctx, name)
	if err != nil && !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, errBadManifest) {
		return fmt.Errorf("delete %q from %s: %w", name, l.where, err)
	}
	if err := l.lockedError(name, m, head); err != nil {
		return err
	}
	if err := l.deleteObject(ctx, l.manifestKey(name)); err != nil {
		return fmt.Errorf("delete manifest of %q from %s: %w", name, l.where, err)
	}
	if err := l.deleteObject(ctx, l.dataKey(name)); err != nil {
		// The backup is gone from listings; CleanOrphans removes the data.
		return fmt.Errorf("delete data of %q from %s (its manifest is deleted; the data is removed by the next cleanup): %w",
			name, l.where, err)
	}
	return nil
}

func (l *Location) head(ctx context.Context, key string) (*s3sdk.HeadObjectOutput, error) {
	return l.client.HeadObject(ctx, &s3sdk.HeadObjectInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key)})
}

func (l *Location) deleteObject(ctx context.Context, key string) error {
	_, err := l.client.DeleteObject(ctx, &s3sdk.DeleteObjectInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key)})
	if isNotFound(err) {
		return nil
	}
	return err
}

// SetVerification implements storage.VerificationWriter: the manifest is
// read, changed and written back with If-Match on the ETag it was read
// with, so a backup deleted (or replaced) meanwhile is not brought back;
// its other metadata (the data's ETag) is kept.
func (l *Location) SetVerification(ctx context.Context, name string, v *storage.Verification) error {
	if err := checkName(name); err != nil {
		return err
	}
	if l.cfg.ReadOnly {
		return fmt.Errorf("record the verification of %q in %s: %w", name, l.where, storage.ErrReadOnly)
	}
	unlock, err := l.lockName(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	out, err := l.client.GetObject(ctx, &s3sdk.GetObjectInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(l.manifestKey(name))})
	if isNotFound(err) {
		return fmt.Errorf("%q: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("read manifest of %q from %s: %w", name, l.where, err)
	}
	m, err := readManifest(out.Body, name)
	out.Body.Close()
	if err != nil {
		return fmt.Errorf("manifest %s in %s, read back to record its verification: %w", l.manifestKey(name), l.where, err)
	}
	m.Verification = v
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest of %q: %w", name, err)
	}
	put := &s3sdk.PutObjectInput{
		Bucket:        aws.String(l.cfg.Bucket),
		Key:           aws.String(l.manifestKey(name)),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
		Metadata:      out.Metadata,
	}
	if !l.cfg.NoConditionalWrites {
		put.IfMatch = out.ETag
	}
	if m.Locked(time.Now()) {
		// The new version keeps the lock the backup was stored with (the
		// one before it stays locked too).
		until := m.LockedUntil
		put.ObjectLockMode, put.ObjectLockRetainUntilDate = out.ObjectLockMode, &until
		if put.ObjectLockMode == "" && l.cfg.ObjectLock != nil {
			put.ObjectLockMode = types.ObjectLockMode(l.cfg.ObjectLock.Mode)
		}
	}
	if _, err := l.client.PutObject(ctx, put); err != nil {
		if isPreconditionFailed(err) || isNotFound(err) {
			return fmt.Errorf("%q changed or was deleted while its verification was recorded: %w", name, storage.ErrNotFound)
		}
		return fmt.Errorf("write manifest of %q to %s: %w", name, l.where, err)
	}
	return nil
}
