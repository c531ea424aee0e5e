package etcdbackupv1

import "fmt"

// Encryption names that UploadHeader.encryption and Backup.encryption may
// carry: part of the wire contract, like the compression names.
const (
	EncryptionNone = ""
	// EncryptionAge is an age v1 file (https://age-encryption.org/v1).
	EncryptionAge = "age"
)

// Limits on the recipients a backup records: a hybrid post-quantum
// recipient is about 2 KB, a classic one 62 bytes.
const (
	MaxAgeRecipients      = 32
	MaxAgeRecipientLength = 4096
)

// ValidateEncryption returns an error naming the accepted values unless e
// is one of the encryption names.
func ValidateEncryption(e string) error {
	if e == EncryptionNone || e == EncryptionAge {
		return nil
	}
	return fmt.Errorf("encryption %q is not supported; use %s or none", e, EncryptionAge)
}
