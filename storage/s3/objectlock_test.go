package s3_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/storagetest"
)

// A location with objectLock writes every object of a backup with that
// retention, records it in the manifest, and refuses to delete the
// backup before it ends, deleting nothing. The store enforces it too: a
// raw DeleteObject with the location's own credentials cannot remove the
// bytes (a delete of the version is refused; a plain delete only hides
// the version behind a delete marker, which the bytes survive).
func TestObjectLock(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	for _, mode := range []string{storage.ObjectLockGovernance, storage.ObjectLockCompliance} {
		t.Run(mode, func(t *testing.T) {
			prefix := "locked-" + strings.ToLower(mode)
			loc := newLocation(t, srv, prefix, func(c *s3.Config) {
				c.Bucket, c.ObjectLock = s3test.LockedBucket, &storage.ObjectLock{Mode: mode, Days: 2}
			})
			before := time.Now()
			data := storagetest.Data(7, 6<<20) // two parts
			put := storagetest.Put(t, loc, "nightly-1", data)
			want := before.Add(48 * time.Hour)
			if d := put.LockedUntil.Sub(want); d < -time.Second || d > time.Minute {
				t.Fatalf("manifest says locked until %s, want about %s", put.LockedUntil, want)
			}
			m, err := loc.Stat(ctx, "nightly-1")
			if err != nil || !m.LockedUntil.Equal(put.LockedUntil) {
				t.Fatalf("Stat: %v, locked until %v", err, m)
			}
			c := srv.Client()
			for _, key := range []string{prefix + "/backups/nightly-1.db", prefix + "/backups/nightly-1.json"} {
				r, err := c.GetObjectRetention(ctx, &s3sdk.GetObjectRetentionInput{Bucket: aws.String(s3test.LockedBucket), Key: aws.String(key)})
				if err != nil {
					t.Fatalf("retention of %s: %v", key, err)
				}
				if string(r.Retention.Mode) != mode || !aws.ToTime(r.Retention.RetainUntilDate).Equal(put.LockedUntil) {
					t.Errorf("retention of %s: %s until %s, want %s until %s", key, r.Retention.Mode, aws.ToTime(r.Retention.RetainUntilDate), mode, put.LockedUntil)
				}
			}

			// A drill's verdict rewrites the manifest: the new version is
			// locked as the backup was.
			if err := loc.SetVerification(ctx, "nightly-1", &storage.Verification{Result: storage.VerificationSucceeded}); err != nil {
				t.Fatal(err)
			}
			r, err := c.GetObjectRetention(ctx, &s3sdk.GetObjectRetentionInput{Bucket: aws.String(s3test.LockedBucket), Key: aws.String(prefix + "/backups/nightly-1.json")})
			if err != nil || string(r.Retention.Mode) != mode || !aws.ToTime(r.Retention.RetainUntilDate).Equal(put.LockedUntil) {
				t.Fatalf("retention of the manifest after a verdict: %v %+v", err, r)
			}

			// The product refuses, and nothing is deleted.
			err = loc.Delete(ctx, "nightly-1")
			var le *storage.LockedError
			if !errors.As(err, &le) || !errors.Is(err, storage.ErrLocked) || !le.Until.Equal(put.LockedUntil) ||
				!strings.Contains(err.Error(), "locked until "+put.LockedUntil.UTC().Format(time.RFC3339)) {
				t.Fatalf("Delete of a locked backup: %v", err)
			}
			if _, err := loc.Stat(ctx, "nightly-1"); err != nil {
				t.Fatalf("after the refused delete: %v", err)
			}

			// The store refuses the location's own credentials.
			dataKey := prefix + "/backups/nightly-1.db"
			versions, err := c.ListObjectVersions(ctx, &s3sdk.ListObjectVersionsInput{Bucket: aws.String(s3test.LockedBucket), Prefix: aws.String(dataKey)})
			if err != nil || len(versions.Versions) != 1 {
				t.Fatalf("versions of %s: %v %v", dataKey, err, versions)
			}
			version := versions.Versions[0].VersionId
			raw := c // the location's own credentials
			if _, err := raw.DeleteObject(ctx, &s3sdk.DeleteObjectInput{Bucket: aws.String(s3test.LockedBucket), Key: aws.String(dataKey), VersionId: version}); err == nil {
				t.Fatal("the store deleted a locked version")
			}
			// A plain delete hides the object behind a delete marker; the
			// bytes stay.
			if _, err := raw.DeleteObject(ctx, &s3sdk.DeleteObjectInput{Bucket: aws.String(s3test.LockedBucket), Key: aws.String(dataKey)}); err != nil {
				t.Logf("plain delete: %v", err)
			}
			got, err := c.GetObject(ctx, &s3sdk.GetObjectInput{Bucket: aws.String(s3test.LockedBucket), Key: aws.String(dataKey), VersionId: version})
			if err != nil {
				t.Fatalf("the locked version after the deletes: %v", err)
			}
			h := sha256.New()
			_, err = io.Copy(h, got.Body)
			got.Body.Close()
			if err != nil || hex.EncodeToString(h.Sum(nil)) != put.SHA256 {
				t.Fatalf("the locked version's bytes after the deletes: %v, SHA-256 %x, want %s", err, h.Sum(nil), put.SHA256)
			}
		})
	}
}

// A location with objectLock on a bucket without it refuses to open, as
// a configuration error (the server does not start).
func TestObjectLockNeedsALockedBucket(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("p")
	cfg.ObjectLock = &storage.ObjectLock{Mode: storage.ObjectLockCompliance, Days: 1}
	_, err := s3.New(context.Background(), cfg)
	if !errors.Is(err, storage.ErrMisconfigured) || !strings.Contains(err.Error(), `bucket "etcdbackup"`) ||
		!strings.Contains(err.Error(), "does not have object lock enabled") || !strings.Contains(err.Error(), "remove objectLock") {
		t.Fatalf("s3.New on a bucket without object lock: %v", err)
	}
}
