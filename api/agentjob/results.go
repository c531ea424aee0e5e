package agentjob

import (
	"encoding/json"
	"time"
)

// What agents of the kinds that report (Spec.Reports) write as their
// container's termination message, as JSON, and the server reads back
// from the pod's status. A termination message holds 4096 bytes: the
// free text of each is cut to maxReportText.
const maxReportText = 3000

// DrillVerdict is a drill's finding, as the server records it in the
// backup's manifest (status.verification).
type DrillVerdict struct {
	// Succeeded is true when the restored member answered and every
	// recorded fact matched.
	Succeeded bool `json:"succeeded"`
	// NoVerdict is true when the drill learned nothing about the backup
	// (it could not be decrypted here, the server did not serve it, the
	// scratch space failed): Message says what to fix.
	NoVerdict bool `json:"noVerdict,omitempty"`
	// Revision, Keys and HashKV are what the restored member answered
	// (zero when it was not reached).
	Revision int64  `json:"revision"`
	Keys     int64  `json:"keys"`
	HashKV   uint32 `json:"hashKV"`
	// Message says what was compared, or why the drill failed and what
	// that means.
	Message string `json:"message"`
	// Duration is the drill's wall time, download included.
	Duration time.Duration `json:"duration"`
}

// FoldVerdict is a fold's finding.
type FoldVerdict struct {
	// Succeeded is true when the chain was replayed, the result checked
	// and stored as Backup.
	Succeeded bool `json:"succeeded"`
	// NoVerdict is true when the fold learned nothing about the chain (it
	// could not be decrypted here): Message says what to do.
	NoVerdict bool   `json:"noVerdict,omitempty"`
	Backup    string `json:"backup,omitempty"`
	// Revision, Keys and HashKV are what the checked member answered;
	// Revisions how many revisions were replayed.
	Revision  int64  `json:"revision"`
	Keys      int64  `json:"keys"`
	HashKV    uint32 `json:"hashKV"`
	Revisions int64  `json:"revisions"`
	// Message says what was done, or why the chain did not fold.
	Message  string        `json:"message"`
	Duration time.Duration `json:"duration"`
}

// DeltaEnd is what a delta agent whose chain ended reports: why (etcd
// compacted past it, a revision went missing, etcd's history changed).
// Storage has the same reason in the chain's last segment when the agent
// could store it; the report is how the server learns it when it could
// not.
type DeltaEnd struct {
	ChainEnded string `json:"chainEnded"`
}

// Report is what an agent writes as its termination message.
type Report interface {
	// Encode is the JSON the agent writes, its free text cut to fit.
	Encode() ([]byte, error)
}

// Encode implements Report.
func (v DrillVerdict) Encode() ([]byte, error) {
	v.Message = cut(v.Message)
	return json.Marshal(v)
}

// Encode implements Report.
func (v FoldVerdict) Encode() ([]byte, error) {
	v.Message = cut(v.Message)
	return json.Marshal(v)
}

// Encode implements Report.
func (e DeltaEnd) Encode() ([]byte, error) {
	e.ChainEnded = cut(e.ChainEnded)
	return json.Marshal(e)
}

// cut shortens s to what a report's free text may hold.
func cut(s string) string {
	if len(s) > maxReportText {
		return s[:maxReportText] + "…"
	}
	return s
}
