package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
)

// s3Flags say where `floor serve -s3-bucket ...` stores.
type s3Flags struct {
	bucket, region, endpoint, caFile, keyIDFile, secretFile, prefix string
	partMiB, concurrency                                            int
}

// s3Store keeps each backup as the object PREFIX/NAME.db, written by the
// transfer manager as the product's S3 location writes its data (part
// size, concurrency, the SDK's default checksums), read with one GET.
type s3Store struct {
	client *s3sdk.Client
	tm     *transfermanager.Client
	f      s3Flags
}

func newS3Store(f s3Flags) (*s3Store, error) {
	pem, err := os.ReadFile(f.caFile)
	if err != nil {
		return nil, fmt.Errorf("s3 CA bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("s3 CA bundle %s holds no certificate", f.caFile)
	}
	id, err := os.ReadFile(f.keyIDFile)
	if err != nil {
		return nil, fmt.Errorf("s3 access key ID: %w", err)
	}
	secret, err := os.ReadFile(f.secretFile)
	if err != nil {
		return nil, fmt.Errorf("s3 secret access key: %w", err)
	}
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	})
	client := s3sdk.New(s3sdk.Options{
		Region:       f.region,
		BaseEndpoint: aws.String(f.endpoint),
		UsePathStyle: true,
		HTTPClient:   httpClient,
		Credentials: credentials.NewStaticCredentialsProvider(strings.TrimSpace(string(id)),
			strings.TrimSpace(string(secret)), ""),
		// Multipart objects carry no whole-object checksum: the SDK
		// would log that it skipped validating one on every GET.
		DisableLogOutputChecksumValidationSkipped: true,
	})
	part := int64(f.partMiB) << 20
	tm := transfermanager.New(client, func(o *transfermanager.Options) {
		o.PartSizeBytes, o.MultipartUploadThreshold, o.Concurrency = part, part, f.concurrency
	})
	return &s3Store{client: client, tm: tm, f: f}, nil
}

func (s *s3Store) key(name string) (string, error) {
	if _, err := dirStore("").path(name); err != nil {
		return "", err
	}
	return s.f.prefix + name + ".db", nil
}

func (s *s3Store) create(ctx context.Context, name string) (upload, error) {
	key, err := s.key(name)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	u := &s3Upload{pw: pw, done: make(chan error, 1)}
	// The upload owns the goroutine: commit and abort wait for it.
	go func() {
		_, err := s.tm.UploadObject(ctx, &transfermanager.UploadObjectInput{
			Bucket: aws.String(s.f.bucket), Key: aws.String(key), Body: pr,
		})
		pr.CloseWithError(err) // a writer must not wait for a reader that has gone
		u.done <- err
	}()
	return u, nil
}

func (s *s3Store) open(ctx context.Context, name string) (io.ReadCloser, error) {
	key, err := s.key(name)
	if err != nil {
		return nil, err
	}
	out, err := s.client.GetObject(ctx, &s3sdk.GetObjectInput{Bucket: aws.String(s.f.bucket), Key: aws.String(key)})
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return out.Body, nil
}

// s3Upload feeds the transfer manager through a pipe, as the product's S3
// location does.
type s3Upload struct {
	pw   *io.PipeWriter
	done chan error
}

func (u *s3Upload) Write(p []byte) (int, error) { return u.pw.Write(p) }

func (u *s3Upload) commit() error {
	u.pw.Close()
	if err := <-u.done; err != nil {
		return fmt.Errorf("upload object: %w", err)
	}
	return nil
}

var errAborted = errors.New("upload aborted")

func (u *s3Upload) abort() {
	u.pw.CloseWithError(errAborted)
	<-u.done
}
