package storage

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The configuration of storage locations: the `locations:` list of the
// server's configuration file, which the plugin's --storage-config reads
// as is. Secrets are never in it: it names files or environment variables
// that hold them.

// LocationConfig is one entry of the `locations:` list of the server's
// configuration file (and of the plugin's --storage-config): a name and
// exactly one of the backends.
type LocationConfig struct {
	// Name is what clients address it by: a DNS-1123 subdomain.
	Name       string            `json:"name"`
	Filesystem *FilesystemConfig `json:"filesystem,omitempty"`
	S3         *S3Config         `json:"s3,omitempty"`
	// Copies are the locations the data server copies everything stored
	// here to (backups, delta segments, recovery kits), as stored.
	Copies []CopyConfig `json:"copies,omitempty"`
}

// CopyConfig is one copy location of a location.
type CopyConfig struct {
	// To names another configured location.
	To string `json:"to"`
}

// FilesystemConfig is a directory (a mounted PersistentVolumeClaim).
type FilesystemConfig struct {
	Path string `json:"path"`
	// SharedVolume says Path is on a ReadWriteMany volume that every
	// replica of the data server mounts. Only the server's config reads
	// it: it refuses more than one replica with a filesystem location
	// not marked so (server/config).
	SharedVolume bool `json:"sharedVolume,omitempty"`
}

// S3Config is a bucket of an S3-compatible store, checked by
// ValidateS3Config; package storage/s3 fills in the defaults of the zero fields. Credentials come from exactly one of: the
// *File fields (a mounted Secret), the *Env fields (names of environment
// variables), or DefaultCredentialChain.
type S3Config struct {
	// Bucket must exist.
	Bucket string `json:"bucket"`
	// Prefix is prepended to every key ("team-a/etcd" → team-a/etcd/backups/…).
	Prefix string `json:"prefix,omitempty"`
	// Region for SigV4 signing (default us-east-1, or the chain's).
	Region string `json:"region,omitempty"`
	// Endpoint is the store's URL; empty means AWS S3 itself.
	Endpoint string `json:"endpoint,omitempty"`
	// PathStyle addresses https://endpoint/bucket/key.
	PathStyle bool `json:"pathStyle,omitempty"`
	// CABundleFile is a PEM file of CAs trusted besides the system's.
	CABundleFile       string `json:"caBundleFile,omitempty"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`

	AccessKeyIDFile     string `json:"accessKeyIDFile,omitempty"`
	SecretAccessKeyFile string `json:"secretAccessKeyFile,omitempty"`
	SessionTokenFile    string `json:"sessionTokenFile,omitempty"`
	AccessKeyIDEnv      string `json:"accessKeyIDEnv,omitempty"`
	SecretAccessKeyEnv  string `json:"secretAccessKeyEnv,omitempty"`
	SessionTokenEnv     string `json:"sessionTokenEnv,omitempty"`
	// DefaultCredentialChain uses the SDK's chain (env, ~/.aws, IRSA, roles).
	DefaultCredentialChain bool `json:"defaultCredentialChain,omitempty"`

	// PartSizeMiB is the multipart part size (default 5, at least 5).
	PartSizeMiB int64 `json:"partSizeMiB,omitempty"`
	// Concurrency is the number of parts of one upload in flight (default 2).
	Concurrency int `json:"concurrency,omitempty"`
	// RequestChecksum is "when_supported" (default) or "when_required".
	RequestChecksum string `json:"requestChecksum,omitempty"`
	// NoConditionalWrites stops sending If-None-Match: *, for stores that
	// reject it.
	NoConditionalWrites bool `json:"noConditionalWrites,omitempty"`
	// ObjectLock, when set, writes every object of a backup (data,
	// manifest, delta segment, recovery kit) with this retention, which
	// the store enforces: nobody, these credentials included, can delete
	// or overwrite the bytes before it ends. The bucket must have object
	// lock enabled (the location refuses to open otherwise).
	ObjectLock *ObjectLock `json:"objectLock,omitempty"`
}

// Object lock retention modes (S3's).
const (
	// ObjectLockGovernance: a user with s3:BypassGovernanceRetention can
	// still shorten or remove the retention.
	ObjectLockGovernance = "GOVERNANCE"
	// ObjectLockCompliance: nobody can, not even the bucket's root user,
	// until it ends.
	ObjectLockCompliance = "COMPLIANCE"
)

// ObjectLock is the retention every object of an S3 location is written
// with.
type ObjectLock struct {
	// Mode is GOVERNANCE or COMPLIANCE.
	Mode string `json:"mode"`
	// Days is how long each object is kept from when it is written.
	Days int `json:"days"`
}

// Retention is how long an object written at now is locked.
func (o ObjectLock) Retention(now time.Time) time.Time {
	return now.Add(time.Duration(o.Days) * 24 * time.Hour).UTC().Truncate(time.Second)
}

// ValidateLocations checks a `locations:` list at fldPath: at least one
// location, each with exactly one valid backend, names unique.
func ValidateLocations(locs []LocationConfig, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(locs) == 0 {
		errs = append(errs, field.Required(fldPath, "add at least one storage location"))
	}
	names := make([]string, 0, len(locs))
	for i, l := range locs {
		names = append(names, l.Name)
		errs = append(errs, validateLocation(l, fldPath.Index(i))...)
	}
	errs = append(errs, ValidateLocationNames(names, fldPath)...)
	return append(errs, validateCopies(locs, fldPath)...)
}

// validateCopies checks the copies of each location: each names another
// configured location once, and no location's backups come back to it
// through copies (a cycle would copy each backup back and forth).
func validateCopies(locs []LocationConfig, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	configured := sets.New[string]()
	for _, l := range locs {
		configured.Insert(l.Name)
	}
	to := map[string][]string{}
	for i, l := range locs {
		seen := sets.New[string]()
		for j, c := range l.Copies {
			p := fldPath.Index(i).Child("copies").Index(j).Child("to")
			switch {
			case c.To == "":
				errs = append(errs, field.Required(p, "the name of the location to copy to"))
			case c.To == l.Name:
				errs = append(errs, field.Invalid(p, c.To, "a location cannot be its own copy: name another location"))
			case !configured.Has(c.To):
				errs = append(errs, field.NotFound(p, c.To))
			case seen.Has(c.To):
				errs = append(errs, field.Duplicate(p, c.To))
			default:
				to[l.Name] = append(to[l.Name], c.To)
			}
			seen.Insert(c.To)
		}
	}
	for i, l := range locs {
		if reachable(to, l.Name, l.Name) {
			errs = append(errs, field.Invalid(fldPath.Index(i).Child("copies"), field.OmitValueType{},
				fmt.Sprintf("location %q is copied back to itself through its copies: copies must not form a cycle", l.Name)))
		}
	}
	return errs
}

// reachable says whether want is reached from from through copies.
func reachable(to map[string][]string, from, want string) bool {
	seen := sets.New[string]()
	next := slices.Clone(to[from])
	for len(next) > 0 {
		n := next[len(next)-1]
		next = next[:len(next)-1]
		if n == want {
			return true
		}
		if !seen.Has(n) {
			seen.Insert(n)
			next = append(next, to[n]...)
		}
	}
	return false
}

// CopiesOf are the names of the locations loc's backups are copied to.
func CopiesOf(locs []LocationConfig, loc string) []string {
	var out []string
	for _, l := range locs {
		if l.Name == loc {
			for _, c := range l.Copies {
				out = append(out, c.To)
			}
		}
	}
	return out
}

func validateLocation(l LocationConfig, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case l.Filesystem == nil && l.S3 == nil:
		errs = append(errs, field.Required(p, "must have exactly one of filesystem, s3"))
	case l.Filesystem != nil && l.S3 != nil:
		errs = append(errs, field.Invalid(p, field.OmitValueType{}, "must have exactly one of filesystem, s3"))
	case l.Filesystem != nil && l.Filesystem.Path == "":
		errs = append(errs, field.Required(p.Child("filesystem", "path"), "the directory backups are stored in"))
	case l.S3 != nil:
		errs = append(errs, ValidateS3Config(*l.S3, p.Child("s3"))...)
	}
	return errs
}

// ValidateLocationNames checks the names of the locations at fldPath:
// DNS-1123 subdomains, each used once.
func ValidateLocationNames(names []string, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, n := range names {
		p := fldPath.Index(i).Child("name")
		errs = append(errs, ValidateName(n, p)...)
		if n != "" && seen.Has(n) {
			errs = append(errs, field.Duplicate(p, n))
		}
		seen.Insert(n)
	}
	return errs
}

// ValidateName checks the name clients address a location (or a target)
// by: a DNS-1123 subdomain.
func ValidateName(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "a DNS-1123 subdomain such as \"default\"")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// Limits and values of the s3 section; zero values mean the defaults of
// package storage/s3.
const (
	// MinPartSizeMiB and MaxPartSizeMiB are S3's limits of a part.
	MinPartSizeMiB = 5
	MaxPartSizeMiB = 5 << 10
	MaxConcurrency = 64

	// ChecksumWhenSupported and ChecksumWhenRequired are the values of
	// requestChecksum; package storage/s3 documents them.
	ChecksumWhenSupported = "when_supported"
	ChecksumWhenRequired  = "when_required"
)

// ValidateS3Config checks an s3 section at fldPath. Errors never contain
// credential values: only file and variable names, and the endpoint with
// any user information redacted.
func ValidateS3Config(c S3Config, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case c.Bucket == "":
		errs = append(errs, field.Required(fldPath.Child("bucket"), "a bucket is required"))
	case strings.ContainsAny(c.Bucket, "/\\ ") || len(c.Bucket) > 255:
		errs = append(errs, field.Invalid(fldPath.Child("bucket"), c.Bucket, "is not a bucket name"))
	}
	if prefix := strings.Trim(c.Prefix, "/"); prefix != "" {
		for seg := range strings.SplitSeq(prefix, "/") {
			if seg == "" || seg == "." || seg == ".." || strings.ContainsRune(seg, 0) {
				errs = append(errs, field.Invalid(fldPath.Child("prefix"), c.Prefix, "empty, '.' or '..' path segments are not allowed"))
				break
			}
		}
	}
	if c.Endpoint != "" {
		p := fldPath.Child("endpoint")
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil:
			// The URL's text may hold credentials someone put in it.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			errs = append(errs, field.Invalid(p, field.OmitValueType{}, fmt.Sprintf("is not a URL: %v", err)))
		case u.Scheme != "https" && u.Scheme != "http":
			errs = append(errs, field.Invalid(p, u.Redacted(), "the scheme must be https or http"))
		case u.Host == "":
			errs = append(errs, field.Invalid(p, u.Redacted(), "has no host"))
		case u.User != nil:
			errs = append(errs, field.Invalid(p, u.Redacted(), "must not contain credentials: use the credential files or variables"))
		case u.RawQuery != "" || u.Fragment != "":
			errs = append(errs, field.Invalid(p, u.Redacted(), "must not have a query or fragment"))
		}
	}
	if c.InsecureSkipVerify && c.CABundleFile != "" {
		errs = append(errs, field.Forbidden(fldPath.Child("insecureSkipVerify"),
			"both caBundleFile and insecureSkipVerify are set: with a CA bundle, certificates can be verified, so leave insecureSkipVerify off"))
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
		errs = append(errs, field.Required(fldPath, "no credentials configured: set accessKeyIDFile and secretAccessKeyFile (a mounted Secret), accessKeyIDEnv and secretAccessKeyEnv, or defaultCredentialChain"))
	case sources > 1:
		errs = append(errs, field.Invalid(fldPath, field.OmitValueType{}, "credentials are configured more than one way: use only one of the files, the environment variables, or defaultCredentialChain"))
	case files && (c.AccessKeyIDFile == "" || c.SecretAccessKeyFile == ""):
		errs = append(errs, field.Required(fldPath, "credential files: both accessKeyIDFile and secretAccessKeyFile are required"))
	case envs && (c.AccessKeyIDEnv == "" || c.SecretAccessKeyEnv == ""):
		errs = append(errs, field.Required(fldPath, "credential environment variables: both accessKeyIDEnv and secretAccessKeyEnv are required"))
	}

	if c.PartSizeMiB != 0 && (c.PartSizeMiB < MinPartSizeMiB || c.PartSizeMiB > MaxPartSizeMiB) {
		errs = append(errs, field.Invalid(fldPath.Child("partSizeMiB"), c.PartSizeMiB,
			fmt.Sprintf("part size must be within S3's limits [%d, %d (5 GiB)]", MinPartSizeMiB, MaxPartSizeMiB)))
	}
	if c.Concurrency != 0 && (c.Concurrency < 1 || c.Concurrency > MaxConcurrency) {
		errs = append(errs, field.Invalid(fldPath.Child("concurrency"), c.Concurrency, fmt.Sprintf("must be between 1 and %d", MaxConcurrency)))
	}
	switch c.RequestChecksum {
	case "", ChecksumWhenSupported, ChecksumWhenRequired:
	default:
		errs = append(errs, field.Invalid(fldPath.Child("requestChecksum"), c.RequestChecksum,
			fmt.Sprintf("request checksum must be %q or %q", ChecksumWhenSupported, ChecksumWhenRequired)))
	}
	if o := c.ObjectLock; o != nil {
		p := fldPath.Child("objectLock")
		if o.Mode != ObjectLockGovernance && o.Mode != ObjectLockCompliance {
			errs = append(errs, field.NotSupported(p.Child("mode"), o.Mode, []string{ObjectLockGovernance, ObjectLockCompliance}))
		}
		if o.Days < 1 || o.Days > MaxObjectLockDays {
			errs = append(errs, field.Invalid(p.Child("days"), o.Days, fmt.Sprintf("must be between 1 and %d (100 years)", MaxObjectLockDays)))
		}
	}
	return errs
}

// MaxObjectLockDays bounds ObjectLock.Days (S3's own bound is 100 years).
const MaxObjectLockDays = 36500
