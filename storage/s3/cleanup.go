package s3

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// CleanupResult counts what CleanOrphans removed.
type CleanupResult struct {
	// AbortedUploads are multipart uploads aborted: this process's own
	// failed aborts, and uploads under the prefix older than StaleUploadAge.
	AbortedUploads int
	// RemovedOrphans are data objects without a manifest, older than
	// OrphanAge, removed.
	RemovedOrphans int
}

func (r CleanupResult) any() bool { return r.AbortedUploads > 0 || r.RemovedOrphans > 0 }

// CleanOrphans removes what interrupted uploads and deletes left behind:
//
//   - multipart uploads this process failed to abort (the store was down),
//     whatever their age;
//   - multipart uploads under PREFIX/backups/ started more than
//     StaleUploadAge ago (a server killed mid-upload cannot abort its own);
//     the age keeps it from aborting a live upload of another server
//     sharing the prefix;
//   - data objects without a manifest last modified more than OrphanAge ago
//     (a crash between the data and manifest writes, a delete that failed
//     halfway). They are never listed anyway; this reclaims the space.
//
// Uploads in progress in this process are never touched. New calls it;
// a server may also call it periodically. A bucket lifecycle rule
// (AbortIncompleteMultipartUpload) is a good complement on AWS.
func (l *Location) CleanOrphans(ctx context.Context) (CleanupResult, error) {
	var res CleanupResult
	if l.cfg.ReadOnly {
		return res, fmt.Errorf("clean %s: %w", l.where, storage.ErrReadOnly)
	}
	res.AbortedUploads += l.retryPendingAborts(ctx)
	var errs []error

	now := time.Now()
	p := s3sdk.NewListMultipartUploadsPaginator(l.client, &s3sdk.ListMultipartUploadsInput{
		Bucket: aws.String(l.cfg.Bucket),
		Prefix: aws.String(l.backupsKey),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list multipart uploads in %s: %w", l.where, err))
			break
		}
		for _, up := range page.Uploads {
			key, id := aws.ToString(up.Key), aws.ToString(up.UploadId)
			if now.Sub(aws.ToTime(up.Initiated)) < l.cfg.StaleUploadAge || l.isActiveKey(key) {
				continue
			}
			if err := l.abortUpload(id, key); err != nil {
				errs = append(errs, err)
				continue
			}
			res.AbortedUploads++
		}
	}

	type object struct{ modified time.Time }
	data := map[string]object{}
	manifests := map[string]bool{}
	err := l.listBackupKeys(ctx, func(_, rest string, modified time.Time, _ string) {
		if name, ok := strings.CutSuffix(rest, dataSuffix); ok {
			data[name] = object{modified}
		} else if name, ok := strings.CutSuffix(rest, manifestSuffix); ok {
			manifests[name] = true
		}
	})
	if err != nil {
		errs = append(errs, err)
	}
	for name, o := range data {
		if manifests[name] || now.Sub(o.modified) < l.cfg.OrphanAge || l.isActive(name) || checkName(name) != nil {
			continue
		}
		removed, err := l.removeOrphan(ctx, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if removed {
			res.RemovedOrphans++
		}
	}
	return res, joinErrs(errs...)
}

func (l *Location) isActive(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active[name] > 0
}

// isActiveKey reports whether key is the data key of an upload in progress
// in this process.
func (l *Location) isActiveKey(key string) bool {
	rest, ok := strings.CutPrefix(key, l.backupsKey)
	if !ok {
		return false
	}
	name, ok := strings.CutSuffix(rest, dataSuffix)
	return ok && l.isActive(name)
}
