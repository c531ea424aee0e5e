package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// What a location check (package storage/probe) tries of the store
// beyond the Location calls: the request checksums and the create-only
// writes the location sends, each on an object of its own beside the
// probe's — data without a manifest, never listed, removed at once, or
// by CleanOrphans when the credentials may not delete.

var _ storage.Prober = (*Location)(nil)

const (
	// probeObjectSize is the size of the objects ProbeChecksums and
	// ProbeConditionalWrite write.
	probeObjectSize = 16 << 10
	// probeCleanupTimeout bounds the removal of such an object.
	probeCleanupTimeout = 10 * time.Second
)

// ProbePartSize implements storage.Prober: the configured part size.
func (l *Location) ProbePartSize() int64 { return l.cfg.partSize }

// adviceChecksum is what works around a store that refuses, or
// mishandles, the AWS SDK's request checksums.
const adviceChecksum = "set requestChecksum: when_required on this location: the AWS SDK then sends a checksum only where S3 requires one, without aws-chunked trailers; TLS and the SHA-256 each backup's manifest records still protect the data"

// adviceConditional is what works around a store without create-only
// writes.
const adviceConditional = "set noConditionalWrites: true on this location and let one server replica write to it: the store does not keep two writers from publishing one name"

// ProbeChecksums implements storage.Prober: a PUT without request
// checksums, then (requestChecksum when_supported) one with the CRC32 the
// SDK adds by default, each read back. Stores that refuse those headers
// (InvalidArgument "Unsupported header 'x-amz-sdk-checksum-algorithm'",
// NotImplemented for the aws-chunked trailer, XAmzContentSHA256Mismatch)
// fail the second PUT; stores that take the aws-chunked body as the
// object's bytes fail its read-back.
func (l *Location) ProbeChecksums(ctx context.Context, probe string) storage.ProbeResult {
	key := l.dataKey(probe + "-checksums")
	defer l.removeProbeObject(ctx, key)
	body, err := probeBody()
	if err != nil {
		return storage.ProbeResult{Err: err}
	}
	if err := l.putProbe(ctx, key, body, aws.RequestChecksumCalculationWhenRequired, false); err != nil {
		return storage.ProbeResult{Err: fmt.Errorf("a PUT without request checksums failed: %w", err), Advice: l.ProbeAdvice("write", err)}
	}
	if err := l.readProbe(ctx, key, body); err != nil {
		return storage.ProbeResult{Err: fmt.Errorf("a PUT without request checksums: %w", err), Advice: l.ProbeAdvice("read", err)}
	}
	if l.cfg.RequestChecksum == ChecksumWhenRequired {
		return storage.ProbeResult{Detail: "requestChecksum is when_required: the store takes writes with a checksum only where S3 requires one and gives back what was written"}
	}
	if err := l.putProbe(ctx, key, body, l.cfg.requestChecksum(), false); err != nil {
		return storage.ProbeResult{
			Err:    fmt.Errorf("the store refused a PUT carrying the AWS SDK's CRC32 request checksum (x-amz-sdk-checksum-algorithm, x-amz-checksum-crc32; over HTTPS in an aws-chunked trailer), which it took without: %w", err),
			Advice: adviceChecksum,
		}
	}
	if err := l.readProbe(ctx, key, body); err != nil {
		return storage.ProbeResult{
			Err:    fmt.Errorf("the store took a PUT carrying the AWS SDK's CRC32 request checksum but %w: it keeps the aws-chunked encoding as the object's data", err),
			Advice: adviceChecksum,
		}
	}
	return storage.ProbeResult{Detail: "the store takes the AWS SDK's CRC32 request checksums (requestChecksum when_supported) and gives back what was written"}
}

// ProbeConditionalWrite implements storage.Prober: a create-only PUT
// (If-None-Match: *) of a new object must pass, a second one of the same
// key must be refused with 412 Precondition Failed.
func (l *Location) ProbeConditionalWrite(ctx context.Context, probe string) storage.ProbeResult {
	if l.cfg.NoConditionalWrites {
		return storage.ProbeResult{Skipped: "noConditionalWrites is set: the location sends no If-None-Match, so only this server keeps two uploads of one name apart, not the store"}
	}
	key := l.dataKey(probe + "-conditional")
	defer l.removeProbeObject(ctx, key)
	body, err := probeBody()
	if err != nil {
		return storage.ProbeResult{Err: err}
	}
	if err := l.putProbe(ctx, key, body, l.cfg.requestChecksum(), true); err != nil {
		advice := l.ProbeAdvice("write", err)
		if advice == "" {
			advice = adviceConditional
		}
		return storage.ProbeResult{Err: fmt.Errorf("the store refused a create-only PUT (If-None-Match: *) of a new object: %w", err), Advice: advice}
	}
	err = l.putProbe(ctx, key, body, l.cfg.requestChecksum(), true)
	switch {
	case isPreconditionFailed(err):
		return storage.ProbeResult{Detail: "the store refuses a create-only PUT (If-None-Match: *) over an existing object"}
	case err == nil:
		return storage.ProbeResult{Err: errors.New("the store replaced an existing object despite If-None-Match: *: it ignores create-only writes"), Advice: adviceConditional}
	}
	return storage.ProbeResult{Err: fmt.Errorf("a create-only PUT (If-None-Match: *) over an existing object failed otherwise than with 412 Precondition Failed: %w", err), Advice: adviceConditional}
}

// ProbeAdvice implements storage.Prober: the setting or permission that
// a failed call of op needs, from the store's error code.
func (l *Location) ProbeAdvice(op string, err error) string {
	if err == nil {
		return ""
	}
	switch {
	case l.cfg.RequestChecksum != ChecksumWhenRequired && isChecksumRefusal(err):
		return adviceChecksum
	case !l.cfg.NoConditionalWrites && isConditionalRefusal(err):
		return adviceConditional
	case httpStatus(err) == http.StatusForbidden || apiCode(err) == "AccessDenied":
		return l.permissionAdvice(op)
	case httpStatus(err) == http.StatusNotImplemented || apiCode(err) == "NotImplemented":
		return "the store does not implement a request the location makes: the checksums and conditional create steps name the setting that avoids it"
	}
	return ""
}

// permissionAdvice names the permission a refused call of op needs.
func (l *Location) permissionAdvice(op string) string {
	objects := "arn:aws:s3:::" + l.cfg.Bucket + "/" + l.backupsKey + "*"
	switch op {
	case "create", "write", "commit":
		return "the credentials may not write objects: grant s3:PutObject on " + objects + " (multipart uploads take it too)"
	case "open", "read":
		return "the credentials may not read objects: grant s3:GetObject on " + objects
	case "list":
		return "the credentials may not list the bucket: grant s3:ListBucket on arn:aws:s3:::" + l.cfg.Bucket
	case "delete":
		return "the credentials may not delete objects: grant s3:DeleteObject (and s3:AbortMultipartUpload) on " + objects + "; without it retention and delete cannot work"
	}
	return "the credentials were refused: check the bucket's policy and the credentials' (" + l.credentialSource() + ")"
}

// isChecksumRefusal reports an error of the kinds stores that do not
// handle the AWS SDK's request checksums answer with.
func isChecksumRefusal(err error) bool {
	switch apiCode(err) {
	case "XAmzContentSHA256Mismatch", "XAmzContentChecksumMismatch", "BadDigest", "InvalidDigest", "MissingContentLength":
		return true
	case "InvalidArgument", "InvalidRequest", "NotImplemented":
		return mentions(err, "checksum", "x-amz-trailer", "aws-chunked", "streaming-", "x-amz-decoded-content-length", "x-amz-content-sha256")
	}
	return false
}

// isConditionalRefusal reports a store refusing If-None-Match itself.
func isConditionalRefusal(err error) bool {
	switch apiCode(err) {
	case "InvalidArgument", "InvalidRequest", "NotImplemented":
		return mentions(err, "if-none-match", "conditional")
	}
	return false
}

// mentions reports whether the store's message of err holds one of words
// (lower case).
func mentions(err error, words ...string) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	msg := strings.ToLower(ae.ErrorMessage())
	for _, w := range words {
		if strings.Contains(msg, w) {
			return true
		}
	}
	return false
}

func probeBody() ([]byte, error) {
	b := make([]byte, probeObjectSize)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("make the probe's data: %w", err)
	}
	return b, nil
}

// putProbe writes body to key with the checksum behaviour sum, create-only
// if asked.
func (l *Location) putProbe(ctx context.Context, key string, body []byte, sum aws.RequestChecksumCalculation, createOnly bool) error {
	in := &s3sdk.PutObjectInput{
		Bucket:        aws.String(l.cfg.Bucket),
		Key:           aws.String(key),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/octet-stream"),
	}
	if createOnly {
		in.IfNoneMatch = aws.String("*")
	}
	_, err := l.client.PutObject(ctx, in, func(o *s3sdk.Options) { o.RequestChecksumCalculation = sum })
	return err
}

// readProbe reads key back and compares it with want.
func (l *Location) readProbe(ctx context.Context, key string, want []byte) error {
	out, err := l.client.GetObject(ctx, &s3sdk.GetObjectInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key)})
	if err != nil {
		return fmt.Errorf("reading it back failed: %w", err)
	}
	defer out.Body.Close()
	got, err := io.ReadAll(io.LimitReader(out.Body, int64(len(want))+64<<10))
	if err != nil {
		return fmt.Errorf("reading it back failed: %w", err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("gave back %d bytes other than the %d written", len(got), len(want))
	}
	return nil
}

// removeProbeObject deletes key, within probeCleanupTimeout even when
// the check's ctx ended; a failure leaves data without a manifest, which
// CleanOrphans removes.
func (l *Location) removeProbeObject(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeCleanupTimeout)
	defer cancel()
	_ = l.deleteObject(ctx, key)
}
