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
