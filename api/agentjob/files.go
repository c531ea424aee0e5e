package agentjob

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// What a Job hands its agent as a file rather than as flags (a list too
// long for arguments): an annotation of the Job's pod, which the server
// signs, mounted by the downward API. A fold's chain (FoldInputs, its
// --inputs-file) and a restore to a point's delta segments (a JSON list
// of Ref, its --segments-file).

// Ref is a stored backup or delta segment an agent reads, and the
// SHA-256 it must have: the agent downloads only this content under this
// name.
type Ref struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// MaxFoldSegments is the most segments one fold Job reads: its inputs
// annotation (about 150 bytes a segment) stays well within the 256 KiB a
// Job's annotations may hold.
const MaxFoldSegments = 1000

// FoldInputs is the chain a fold Job replays: its full backup and
// segments, each pinned to its SHA-256, and the revision to fold to.
type FoldInputs struct {
	Full       Ref   `json:"full"`
	Segments   []Ref `json:"segments"`
	ToRevision int64 `json:"toRevision"`
}

// DecodeFoldInputs reads FoldInputs as a Job carries them, refusing
// unknown fields and inputs that do not Validate.
func DecodeFoldInputs(r io.Reader) (FoldInputs, error) {
	var in FoldInputs
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return in, err
	}
	return in, in.Validate()
}

// Validate checks that in names a chain to fold, every part pinned.
func (in FoldInputs) Validate() error {
	switch {
	case in.Full.Name == "" || in.Full.SHA256 == "":
		return errors.New("no full backup pinned to its SHA-256")
	case len(in.Segments) == 0:
		return errors.New("no delta segments")
	case len(in.Segments) > MaxFoldSegments:
		return fmt.Errorf("%d delta segments, more than one fold reads (%d)", len(in.Segments), MaxFoldSegments)
	case in.ToRevision <= 0:
		return fmt.Errorf("revision %d to fold to", in.ToRevision)
	}
	for _, s := range in.Segments {
		if s.Name == "" || s.SHA256 == "" {
			return fmt.Errorf("delta segment %q is not pinned to a SHA-256", s.Name)
		}
	}
	return nil
}

// Pins maps every backup and segment the inputs name to its SHA-256.
func (in FoldInputs) Pins() map[string]string {
	m := make(map[string]string, len(in.Segments)+1)
	m[in.Full.Name] = in.Full.SHA256
	for _, s := range in.Segments {
		m[s.Name] = s.SHA256
	}
	return m
}
