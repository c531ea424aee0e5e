package s3test

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
)

// LockedBucket is the bucket every Server also starts with, created
// through the S3 API with object lock enabled (which turns versioning on):
// what a location with objectLock needs.
const LockedBucket = "etcdbackup-locked"

// createLockedBucket creates LockedBucket unless it exists (a restart).
func (s *Server) createLockedBucket(ctx context.Context) error {
	_, err := s.Client().CreateBucket(ctx, &s3sdk.CreateBucketInput{Bucket: aws.String(LockedBucket), ObjectLockEnabledForBucket: aws.Bool(true)})
	if err != nil && !isBucketOwned(err) {
		return fmt.Errorf("create bucket %s with object lock: %w", LockedBucket, err)
	}
	return nil
}

func isBucketOwned(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && (ae.ErrorCode() == "BucketAlreadyOwnedByYou" || ae.ErrorCode() == "BucketAlreadyExists")
}

// LockedConfig is Config for LockedBucket with objectLock in mode for
// days.
func (s *Server) LockedConfig(prefix, mode string, days int) s3.Config {
	c := s.Config(prefix)
	c.Bucket = LockedBucket
	c.ObjectLock = &storage.ObjectLock{Mode: mode, Days: days}
	return c
}
