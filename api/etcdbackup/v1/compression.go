package etcdbackupv1

import (
	"fmt"
	"strings"
)

// Compression names that UploadHeader.compression and Backup.compression
// may carry. They are part of the wire contract, so the one list lives
// here, beside the generated messages, for the server, the agents and the
// plugin alike.
const (
	CompressionNone = ""
	CompressionZstd = "zstd"
)

// CompressionNoneName is how people spell no compression: the CLI's
// --compression none, a target's `compression: none` in the server's
// config. On the wire and in storage it is CompressionNone.
const CompressionNoneName = "none"

// CompressionFromName turns a compression as people spell it into its
// wire name: "none" is CompressionNone; anything else is itself.
func CompressionFromName(c string) string {
	if c == CompressionNoneName {
		return CompressionNone
	}
	return c
}

// Compressions lists every supported compression; "" is none.
var Compressions = []string{CompressionNone, CompressionZstd}

// ValidateCompression returns an error naming the accepted values unless c
// is one of Compressions.
func ValidateCompression(c string) error {
	for _, ok := range Compressions {
		if c == ok {
			return nil
		}
	}
	return fmt.Errorf("compression %q is not supported; use %s or none", c, strings.Join(Compressions[1:], ", "))
}
