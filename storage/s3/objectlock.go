package s3

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// checkObjectLock makes sure the bucket has object lock enabled, as a
// location with objectLock requires: without it the retention headers
// are refused (or, by some stores, silently ignored) and the backups
// would be as deletable as any.
func (l *Location) checkObjectLock(ctx context.Context) error {
	out, err := l.client.GetObjectLockConfiguration(ctx, &s3sdk.GetObjectLockConfigurationInput{Bucket: aws.String(l.cfg.Bucket)})
	where := fmt.Sprintf("bucket %q at %s", l.cfg.Bucket, l.endpointName())
	switch {
	case err == nil && out.ObjectLockConfiguration != nil && out.ObjectLockConfiguration.ObjectLockEnabled == types.ObjectLockEnabledEnabled:
		return nil
	case err == nil || apiCode(err) == "ObjectLockConfigurationNotFoundError" || isNotFound(err):
		return fmt.Errorf("s3 storage location: %s does not have object lock enabled, which objectLock requires: "+
			"create the bucket with object lock (aws s3api create-bucket --object-lock-enabled-for-bucket; on AWS it can also be "+
			"enabled on an existing versioned bucket with put-object-lock-configuration), or remove objectLock from the location: %w",
			where, storage.ErrMisconfigured)
	}
	return fmt.Errorf("s3 storage location: read the object lock configuration of %s: %w", where, err)
}

// retention is the object lock an object written now gets: its mode and
// when it ends (zero without objectLock).
func (l *Location) retention(now time.Time) (types.ObjectLockMode, *time.Time) {
	o := l.cfg.ObjectLock
	if o == nil {
		return "", nil
	}
	until := o.Retention(now)
	return types.ObjectLockMode(o.Mode), &until
}

// lockedError says whether name, whose manifest is m (nil: not read), is
// still under object lock by what the manifest records or the store's
// own answer for its manifest object (HEAD, which says the retention an
// operator may have extended since), and returns the refusal then.
func (l *Location) lockedError(name string, m *storage.Manifest, head *s3sdk.HeadObjectOutput) error {
	now := time.Now()
	until, mode := time.Time{}, ""
	if m != nil && m.Locked(now) {
		until = m.LockedUntil
	}
	if head != nil && head.ObjectLockRetainUntilDate != nil && head.ObjectLockRetainUntilDate.After(until) && head.ObjectLockRetainUntilDate.After(now) {
		until, mode = *head.ObjectLockRetainUntilDate, string(head.ObjectLockMode)
	}
	if until.IsZero() {
		return nil
	}
	if mode == "" && l.cfg.ObjectLock != nil {
		mode = l.cfg.ObjectLock.Mode
	}
	return &storage.LockedError{Name: name, Until: until, Mode: mode}
}

// probeLockFor is how long the object lock step's probe is locked: long
// enough for the store to be asked to delete it, short enough to wait
// out before removing it.
const probeLockFor = 3 * time.Second

// ProbeObjectLock implements storage.Prober: a probe written with the
// configured mode and a retention of seconds must come back with that
// retention, be refused deletion of its version while it lasts, and go
// once it passed.
func (l *Location) ProbeObjectLock(ctx context.Context, probe string) storage.ProbeResult {
	o := l.cfg.ObjectLock
	if o == nil {
		return storage.ProbeResult{Skipped: "the location does not ask for object lock (objectLock: {mode, days} under s3)"}
	}
	key := l.dataKey(probe + "-objectlock")
	until := time.Now().Add(probeLockFor).UTC().Truncate(time.Second).Add(time.Second)
	out, err := l.client.PutObject(ctx, &s3sdk.PutObjectInput{
		Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key),
		Body: strings.NewReader("etcdbackup object lock probe\n"), ContentLength: aws.Int64(29),
		ObjectLockMode: types.ObjectLockMode(o.Mode), ObjectLockRetainUntilDate: &until,
	})
	if err != nil {
		advice := l.ProbeAdvice("write", err)
		if advice == "" {
			advice = "the bucket must have object lock enabled, and the credentials need s3:PutObjectRetention; some stores also require a checksum on locked writes (requestChecksum: when_supported)"
		}
		return storage.ProbeResult{Err: fmt.Errorf("the store refused a PUT with an object lock retention (%s until %s): %w", o.Mode, until.Format(time.RFC3339), err), Advice: advice}
	}
	version := out.VersionId
	defer func() {
		// Once the retention passed, the version itself goes (a plain
		// delete would leave it behind a delete marker).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeCleanupTimeout+probeLockFor)
		defer cancel()
		if wait := time.Until(until) + time.Second; wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
		}
		_, _ = l.client.DeleteObject(ctx, &s3sdk.DeleteObjectInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key), VersionId: version})
	}()
	ret, err := l.client.GetObjectRetention(ctx, &s3sdk.GetObjectRetentionInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key), VersionId: version})
	switch {
	case err != nil:
		return storage.ProbeResult{Err: fmt.Errorf("reading back the retention of an object written with one failed: %w", err),
			Advice: "the credentials need s3:GetObjectRetention; a store that has no such call does not keep object lock"}
	case ret.Retention == nil || string(ret.Retention.Mode) != o.Mode || !aws.ToTime(ret.Retention.RetainUntilDate).Equal(until):
		return storage.ProbeResult{Err: fmt.Errorf("the store did not keep the retention it was given (%s until %s): it answered %+v", o.Mode, until.Format(time.RFC3339), ret.Retention),
			Advice: "use a store (or bucket) that enforces S3 object lock, or remove objectLock from the location"}
	}
	if _, err := l.client.DeleteObject(ctx, &s3sdk.DeleteObjectInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(key), VersionId: version}); err == nil {
		return storage.ProbeResult{Err: errors.New("the store deleted an object version under retention: it does not enforce object lock"),
			Advice: "use a store (or bucket) that enforces S3 object lock; until then objectLock protects nothing"}
	}
	return storage.ProbeResult{Detail: fmt.Sprintf("the store keeps a %s retention and refuses to delete the locked version before it ends (backups here are locked %d days)", o.Mode, o.Days)}
}
