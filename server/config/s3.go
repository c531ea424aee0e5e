package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Limits and values of the s3 section; zero values mean the defaults of
// package server/storage/s3.
const (
	// MinPartSizeMiB and MaxPartSizeMiB are S3's limits of a part.
	MinPartSizeMiB = 5
	MaxPartSizeMiB = 5 << 10
	MaxConcurrency = 64

	// ChecksumWhenSupported and ChecksumWhenRequired are the values of
	// requestChecksum; package server/storage/s3 documents them.
	ChecksumWhenSupported = "when_supported"
	ChecksumWhenRequired  = "when_required"
)

// ValidateS3 checks an s3 section at fldPath. Errors never contain
// credential values: only file and variable names, and the endpoint with
// any user information redacted.
func ValidateS3(c S3, fldPath *field.Path) field.ErrorList {
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
	return errs
}
