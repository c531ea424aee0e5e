package s3

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultPartSize is the multipart part size. One upload holds about
	// (Concurrency+2) × PartSize in memory, whatever the backup's size; at
	// 10,000 parts (S3's limit) it allows backups up to 78 GiB.
	DefaultPartSize int64 = 8 << 20
	// DefaultConcurrency is how many parts of one upload are sent at once.
	DefaultConcurrency = 4
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

	// MinPartSize is S3's minimum size of every part but the last.
	MinPartSize int64 = 5 << 20
	// MaxPartSize is S3's maximum part size.
	MaxPartSize int64 = 5 << 30
)

// Checksum modes for Config.RequestChecksum.
const (
	// ChecksumWhenSupported (the default) sends a CRC32 of every part and of
	// single-part objects; over HTTPS it goes in an aws-chunked trailer. The
	// store verifies it: a corrupted part is refused. versitygw, AWS and
	// recent S3-compatible stores accept it.
	ChecksumWhenSupported = "when_supported"
	// ChecksumWhenRequired sends a checksum only where an operation requires
	// one: no aws-chunked encoding, no trailers. For stores that reject
	// aws-chunked uploads ("STREAMING-UNSIGNED-PAYLOAD-TRAILER not
	// implemented", XAmzContentSHA256Mismatch, ...). TLS and the end-to-end
	// SHA-256 in the manifest still protect the data.
	ChecksumWhenRequired = "when_required"
)

// Config describes one S3 storage location: its section of the server's
// configuration file (config.S3, whose zero optional fields get the
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
	config.S3

	// OrphanAge and StaleUploadAge tune CleanOrphans; see the defaults.
	OrphanAge      time.Duration
	StaleUploadAge time.Duration
	// SkipCleanup stops New from running CleanOrphans.
	SkipCleanup bool

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
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.Bucket == "" {
		bad("bucket is required")
	} else if strings.ContainsAny(c.Bucket, "/\\ ") || len(c.Bucket) > 255 {
		bad("bucket %q is not a bucket name", c.Bucket)
	}
	c.Prefix = strings.Trim(c.Prefix, "/")
	if c.Prefix != "" {
		for seg := range strings.SplitSeq(c.Prefix, "/") {
			if seg == "" || seg == "." || seg == ".." || strings.ContainsRune(seg, 0) {
				bad("prefix %q: empty, '.' or '..' path segments are not allowed", c.Prefix)
				break
			}
		}
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil:
			bad("endpoint is not a URL: %v", redactURLError(err))
		case u.Scheme != "https" && u.Scheme != "http":
			bad("endpoint %q: the scheme must be https or http", u.Redacted())
		case u.Host == "":
			bad("endpoint %q has no host", u.Redacted())
		case u.User != nil:
			bad("endpoint %q must not contain credentials: use the credential files or variables", u.Redacted())
		case u.RawQuery != "" || u.Fragment != "":
			bad("endpoint %q must not have a query or fragment", u.Redacted())
		}
	}
	if c.InsecureSkipVerify && c.CABundleFile != "" {
		bad("both caBundleFile and insecureSkipVerify are set: with a CA bundle, certificates can be verified, so leave insecureSkipVerify off")
	}

	files := c.AccessKeyIDFile != "" || c.SecretAccessKeyFile != "" || c.SessionTokenFile != ""
	envs := c.AccessKeyIDEnv != "" || c.SecretAccessKeyEnv != "" || c.SessionTokenEnv != ""
	sources := 0
	for _, b := range []bool{files, envs, c.DefaultCredentialChain} {
		if b {
			sources++
		}
	}
	switch {
	case sources == 0:
		bad("no credentials configured: set accessKeyIDFile and secretAccessKeyFile (a mounted Secret), accessKeyIDEnv and secretAccessKeyEnv, or defaultCredentialChain")
	case sources > 1:
		bad("credentials are configured more than one way: use only one of the files, the environment variables, or defaultCredentialChain")
	case files && (c.AccessKeyIDFile == "" || c.SecretAccessKeyFile == ""):
		bad("credential files: both accessKeyIDFile and secretAccessKeyFile are required")
	case envs && (c.AccessKeyIDEnv == "" || c.SecretAccessKeyEnv == ""):
		bad("credential environment variables: both accessKeyIDEnv and secretAccessKeyEnv are required")
	}

	if c.PartSizeMiB == 0 {
		c.PartSizeMiB = DefaultPartSize >> 20
	}
	if c.PartSizeMiB < MinPartSize>>20 || c.PartSizeMiB > MaxPartSize>>20 {
		bad("part size %d MiB is outside S3's limits [%d MiB, %d MiB (5 GiB)]", c.PartSizeMiB, MinPartSize>>20, MaxPartSize>>20)
	}
	c.partSize = c.PartSizeMiB << 20
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 1 || c.Concurrency > 64 {
		bad("concurrency %d must be between 1 and 64", c.Concurrency)
	}
	switch c.RequestChecksum {
	case "":
		c.RequestChecksum = ChecksumWhenSupported
	case ChecksumWhenSupported, ChecksumWhenRequired:
	default:
		bad("request checksum %q must be %q or %q", c.RequestChecksum, ChecksumWhenSupported, ChecksumWhenRequired)
	}
	if c.OrphanAge == 0 {
		c.OrphanAge = DefaultOrphanAge
	}
	if c.StaleUploadAge == 0 {
		c.StaleUploadAge = DefaultStaleUploadAge
	}
	if c.OrphanAge < 0 || c.StaleUploadAge < 0 {
		bad("orphan and stale upload ages must not be negative")
	}
	if c.Region == "" && !c.DefaultCredentialChain {
		c.Region = DefaultRegion
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("s3 storage location: %w", joinErrs(errs...))
	}
	return c, nil
}

// redactURLError drops the URL text from a parse error: it may contain
// credentials someone put in it.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
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
