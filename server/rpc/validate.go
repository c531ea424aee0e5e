package rpc

import (
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
)

// validateLabels checks each label as Kubernetes would, and their number
// and bytes against lim: labels are stored in every manifest and sent in
// every listing. No label may be under etcdbackup.io/: those are the
// server's (a scheduled backup's), and a client's would pass its backup
// off as one.
func validateLabels(labels map[string]string, lim config.Limits) error {
	if k, ok := ebv1.ReservedLabel(labels); ok {
		return status.Errorf(codes.InvalidArgument,
			"label %q: labels under %s are the server's own (it marks scheduled backups with them); choose another key", k, ebv1.ReservedLabelPrefix)
	}
	if len(labels) > lim.MaxLabels {
		return status.Errorf(codes.InvalidArgument, "%d labels were given; the limit is %d (limits.maxLabels)", len(labels), lim.MaxLabels)
	}
	size := 0
	for k, v := range labels {
		size += len(k) + len(v)
	}
	if size > lim.MaxLabelBytes {
		return status.Errorf(codes.InvalidArgument,
			"the labels' keys and values are %d bytes together; the limit is %d (limits.maxLabelBytes)", size, lim.MaxLabelBytes)
	}
	for k, v := range labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return status.Errorf(codes.InvalidArgument, "label key %q is invalid: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return status.Errorf(codes.InvalidArgument, "label %s=%q has an invalid value: %s", k, v, strings.Join(errs, "; "))
		}
	}
	return nil
}

func validateSHA256(field, s string) error {
	if s == "" {
		return nil
	}
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 || strings.ToLower(s) != s {
		return status.Errorf(codes.InvalidArgument, "%s %q is not a SHA-256: want 64 lower-case hex characters", field, s)
	}
	return nil
}

func validateCompression(c string) error {
	if err := ebv1.ValidateCompression(c); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

// validateEncryption checks an upload's encryption and its recipients:
// public keys only, parsed as age would.
func validateEncryption(e string, recipients []string) error {
	if err := ebv1.ValidateEncryption(e); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	switch {
	case e == ebv1.EncryptionNone && len(recipients) > 0:
		return status.Error(codes.InvalidArgument, "age recipients were given but the encryption is none; set encryption to \"age\"")
	case e == ebv1.EncryptionAge:
		if _, err := crypt.ParseRecipients(recipients); err != nil {
			return status.Errorf(codes.InvalidArgument, "age recipients: %v", err)
		}
	}
	return nil
}

func validateSourceKind(kind string) (string, error) {
	switch kind {
	case "":
		return ebv1.SourceUpload, nil
	case ebv1.SourceUpload, ebv1.SourceAgent, ebv1.SourceDelta, ebv1.SourceKit:
		return kind, nil
	}
	return "", status.Errorf(codes.InvalidArgument, "source kind %q is not one of %q, %q", kind, ebv1.SourceUpload, ebv1.SourceAgent)
}

// validateField bounds a free-form metadata field: it is stored in the
// manifest and sent in every listing.
// It must hold no control characters (protobuf makes it UTF-8): `list`
// and `get` print it on operators' terminals, where an escape sequence
// would act.
func validateField(name, v string, lim config.Limits) error {
	if len(v) > lim.MaxFieldBytes {
		return status.Errorf(codes.InvalidArgument, "%s is %d bytes; the limit is %d (limits.maxFieldBytes)", name, len(v), lim.MaxFieldBytes)
	}
	for i, r := range v {
		if unicode.IsControl(r) {
			return status.Errorf(codes.InvalidArgument, "%s holds control character %U at byte %d; give plain text", name, r, i)
		}
	}
	return nil
}

func checkf(cond bool, format string, args ...any) error {
	if cond {
		return nil
	}
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}

// validateEtcdFacts checks the snapshot facts an upload's header or
// trailer carries.
func validateEtcdFacts(where string, e *ebv1.EtcdInfo) error {
	return checkf(e.GetRevision() >= 0 && e.GetTotalKeys() >= 0 && e.GetDbSize() >= 0 && e.GetKeyspaceKeys() >= 0 && e.GetCompactRevision() >= 0,
		"%s: the etcd revision (%d), key counts (%d, %d), database size (%d) and compact revision (%d) must not be negative", where, e.GetRevision(), e.GetTotalKeys(), e.GetKeyspaceKeys(), e.GetDbSize(), e.GetCompactRevision())
}

func validateUploadHeader(h *ebv1.UploadHeader, lim config.Limits) (kind string, err error) {
	if err := edge.ValidateName("backup", h.GetName()); err != nil {
		return "", err
	}
	if h.ExpectedSize != nil && h.GetExpectedSize() < 0 {
		return "", status.Errorf(codes.InvalidArgument, "expected size %d is negative", h.GetExpectedSize())
	}
	for _, err := range []error{
		validateSHA256("expected SHA-256", h.GetExpectedSha256()),
		validateSHA256("raw SHA-256", h.GetRawSha256()),
		validateLabels(h.GetLabels(), lim),
		validateCompression(h.GetCompression()),
		validateEncryption(h.GetEncryption(), h.GetAgeRecipients()),
		validateField("source description", h.GetSource().GetDescription(), lim),
		validateField("source target", h.GetSource().GetTarget(), lim),
		validateField("etcd member name", h.GetEtcd().GetMemberName(), lim),
		validateField("etcd version", h.GetEtcd().GetVersion(), lim),
		checkf(h.GetRawSize() >= 0, "raw size %d is negative", h.GetRawSize()),
		validateEtcdFacts("header", h.GetEtcd()),
	} {
		if err != nil {
			return "", err
		}
	}
	return validateSourceKind(h.GetSource().GetKind())
}

// validateTrailer checks the checksums and snapshot facts an upload's
// trailer carries.
func validateTrailer(t *ebv1.UploadTrailer) error {
	if err := validateSHA256("trailer SHA-256", t.GetSha256()); err != nil {
		return err
	}
	if err := validateSHA256("trailer raw SHA-256", t.GetRawSha256()); err != nil {
		return err
	}
	return validateEtcdFacts("trailer", t.GetEtcd())
}
