package s3

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultPartSize is the multipart part size: S3's minimum. One upload
	// holds about (Concurrency+2) × PartSize of buffers, whatever the
	// backup's size, and the garbage collector lets the heap grow to about
	// twice what is live; at 10,000 parts (S3's limit) it allows backups up
	// to 48 GiB, six times etcd's largest database (8 GiB).
	DefaultPartSize int64 = 5 << 20
	// DefaultConcurrency is how many parts of one upload are sent at once.
	// With DefaultPartSize it keeps the server's memory for one S3 upload
	// about half of what 8 MiB × 4 took, at the same throughput on the
	// benchmark (docs/benchmarks.md); a distant store with high latency
	// per part gains from more, at (part size × 2) of memory each.
	DefaultConcurrency = 2
	// DefaultRegion is used when Region is empty and the default credential
	// chain is not asked for: S3-compatible stores mostly ignore it, but
	// SigV4 signing needs one.
	DefaultRegion = "us-east-1"
	// DefaultOrphanAge is how old backup data without a manifest must be
	// before it is taken for the leftover of a crash and removed.
	DefaultOrphanAge = time.Hour
	// DefaultStaleUploadAge is how old (since its start) an open multipart
	// upload under the prefix must be before CleanOrphans aborts it. It must
	// exceed the longest upload any server writing this prefix performs.
	DefaultStaleUploadAge = 24 * time.Hour
	// DefaultResponseTimeout is how long a request waits for the store's
	// answer once it is sent: a store that accepts connections but does
	// not answer (stopped, overloaded) fails calls instead of hanging them.
	DefaultResponseTimeout = 30 * time.Second

	// MinPartSize is S3's minimum size of every part but the last.
	MinPartSize int64 = storage.MinPartSizeMiB << 20
	// MaxPartSize is S3's maximum part size.
	MaxPartSize int64 = storage.MaxPartSizeMiB << 20
)

// Checksum modes for Config.RequestChecksum.
const (
	// ChecksumWhenSupported (the default) sends a CRC32 of every part and of
	// single-part objects; over HTTPS it goes in an aws-chunked trailer. The
	// store verifies it: a corrupted part is refused. versitygw, AWS and
	// recent S3-compatible stores accept it.
	ChecksumWhenSupported = storage.ChecksumWhenSupported
	// ChecksumWhenRequired sends a checksum only where an operation requires
	// one: no aws-chunked encoding, no trailers. For stores that reject
	// aws-chunked uploads ("STREAMING-UNSIGNED-PAYLOAD-TRAILER not
	// implemented", XAmzContentSHA256Mismatch, ...). TLS and the end-to-end
	// SHA-256 in the manifest still protect the data.
	ChecksumWhenRequired = storage.ChecksumWhenRequired
)

// Config describes one S3 storage location: its section of the server's
// configuration file (storage.S3Config, whose zero optional fields get the
// defaults above), and what only code sets. Credentials come from exactly
// one of: the *File fields (a mounted Secret, re-read at least every
// minute, so a rotated Secret is picked up without a restart), the *Env
// fields (names of environment variables, e.g. set from a Secret with
// secretKeyRef), or DefaultCredentialChain (the AWS SDK's chain: AWS_*
// variables, ~/.aws, web identity, container and instance roles; without
// it none of those is read, so a stray ~/.aws or AWS_PROFILE cannot change
// what the location does). An Endpoint must not carry credentials;
// InsecureSkipVerify is for trying things out and never goes with
// CABundleFile; NoConditionalWrites serialises uploads of one name only
// within one server process.
type Config struct {
	storage.S3Config

	// OrphanAge and StaleUploadAge tune CleanOrphans; see the defaults.
	OrphanAge      time.Duration
	StaleUploadAge time.Duration
	// SkipCleanup stops New from running CleanOrphans.
	SkipCleanup bool
	// ReadOnly opens the location without writing anything to the bucket
	// (break-glass access to a prefix a server owns): no cleanup at open,
	// as if SkipCleanup, and Create, Delete and CleanOrphans fail with
	// storage.ErrReadOnly. The credentials need only read access.
	ReadOnly bool
	// ResponseTimeout bounds each wait of a request on the store:
	// connecting, the TLS handshake (at most the SDK's 10 s) and the
	// response headers once the request is sent (DefaultResponseTimeout
	// when zero). It does not bound a transfer that makes progress.
	ResponseTimeout time.Duration

	// Logger receives cleanup results and warnings; nil discards them.
	// Nothing logged contains a credential.
	Logger *slog.Logger

	// partSize is PartSizeMiB in bytes, set by withDefaults.
	partSize int64
}

// withDefaults validates c and returns it with defaults applied and the
// prefix normalised. Errors never contain credential values: only file
// and variable names.
func (c Config) withDefaults() (Config, error) {
	errs := storage.ValidateS3Config(c.S3Config, field.NewPath("s3"))
	if c.OrphanAge < 0 || c.StaleUploadAge < 0 {
		errs = append(errs, field.Invalid(field.NewPath("orphanAge"), field.OmitValueType{}, "orphan and stale upload ages must not be negative"))
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("s3 storage location: %w", errs.ToAggregate())
	}
	c.Prefix = strings.Trim(c.Prefix, "/")
	if c.PartSizeMiB == 0 {
		c.PartSizeMiB = DefaultPartSize >> 20
	}
	c.partSize = c.PartSizeMiB << 20
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.RequestChecksum == "" {
		c.RequestChecksum = ChecksumWhenSupported
	}
	if c.OrphanAge == 0 {
		c.OrphanAge = DefaultOrphanAge
	}
	if c.StaleUploadAge == 0 {
		c.StaleUploadAge = DefaultStaleUploadAge
	}
	if c.Region == "" && !c.DefaultCredentialChain {
		c.Region = DefaultRegion
	}
	if c.ResponseTimeout <= 0 {
		c.ResponseTimeout = DefaultResponseTimeout
	}
	return c, nil
}

// Validate checks c as New does, without contacting the store: an error
// is one of configuration, which retrying cannot fix.
func (c Config) Validate() error {
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	_, err = c.tlsConfig()
	return err
}

// Describe is what Location.Describe will say, known before the store
// answers: where the location stores, never a credential.
func (c Config) Describe() string {
	if d, err := c.withDefaults(); err == nil {
		c = d
	}
	return c.describe()
}

func (c Config) requestChecksum() aws.RequestChecksumCalculation {
	if c.RequestChecksum == ChecksumWhenRequired {
		return aws.RequestChecksumCalculationWhenRequired
	}
	return aws.RequestChecksumCalculationWhenSupported
}

func (c Config) responseChecksum() aws.ResponseChecksumValidation {
	if c.RequestChecksum == ChecksumWhenRequired {
		return aws.ResponseChecksumValidationWhenRequired
	}
	return aws.ResponseChecksumValidationWhenSupported
}

// tlsConfig is the client TLS configuration: the system roots plus the CA
// bundle, or no verification when explicitly asked.
func (c Config) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.InsecureSkipVerify {
		tc.InsecureSkipVerify = true // #nosec G402 -- only when the configuration asks for it explicitly
		return tc, nil
	}
	if c.CABundleFile == "" {
		return tc, nil
	}
	pem, err := os.ReadFile(c.CABundleFile)
	if err != nil {
		return nil, fmt.Errorf("s3 storage location: read CA bundle: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("s3 storage location: CA bundle %q holds no PEM certificate", c.CABundleFile)
	}
	tc.RootCAs = pool
	return tc, nil
}

// describe is where the location stores, for humans: never a credential.
func (c Config) describe() string {
	s := "s3://" + c.Bucket
	if c.Prefix != "" {
		s += "/" + c.Prefix
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err == nil {
			u.User = nil
			s += " at " + u.String()
		}
	} else if c.Region != "" {
		s += " (AWS " + c.Region + ")"
	}
	return s
}
