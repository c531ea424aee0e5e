package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/fold"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// errFoldFailed carries exitDrillFailed to main: the fold reached a
// verdict, and it is that the chain does not fold (nothing was stored).
var errFoldFailed = errors.New("the fold failed: the chain did not replay and check as a new full backup (see the message)")

// maxInputsBytes bounds the inputs file: a Job's annotations hold at
// most 256 KiB in all.
const maxInputsBytes = 256 << 10

func (c commands) fold() *cobra.Command {
	var f agentjob.FoldFlags
	v := verdictEnd{what: "fold", failed: errFoldFailed}
	o := fold.Options{}
	cmd := &cobra.Command{
		Use:   "fold --server HOST:PORT --target T --name NEW --inputs-file FILE --scratch-dir DIR",
		Short: "Replay a delta chain onto its full backup, check the result like a drill and store it as a new full backup",
		Args:  cobra.NoArgs,
	}
	srv := addServerFlags(cmd, &f.Conn, "data server gRPC address")
	cmd.RunE = c.runE(func() agentjob.Flags { return f }, func(cmd *cobra.Command) error {
		log := newLogger()
		if err := required(agentjob.FlagName, f.Name, agentjob.FlagTarget, f.Target, agentjob.FlagInputsFile, f.InputsFile,
			agentjob.FlagScratchDir, f.ScratchDir); err != nil {
			return err
		}
		in, err := readInputs(f.InputsFile)
		if err != nil {
			return err
		}
		o.Inputs, o.Target, o.Name, o.Location, o.ScratchDir = in, f.Target, f.Name, f.Location, f.ScratchDir
		o.Compression, o.AgeRecipients = f.Compression, f.EncryptTo
		o.Identities, o.IdentityProblem = optionalIdentities(log, f.IdentityDir, "fold")
		conn, c, err := dial(srv)
		if err != nil {
			return err
		}
		defer conn.Close()
		log.Info("fold starting", "chain", o.Full.Name, "segments", len(o.Segments), "toRevision", o.ToRevision, "backup", o.Name, "location", o.Location)
		res, err := fold.Run(cmd.Context(), c, o)
		if err != nil {
			log.Error("fold reached no verdict", "chain", o.Full.Name, "error", err.Error())
			return err
		}
		log.Info("fold finished", "chain", o.Full.Name, "succeeded", res.Succeeded, "backup", res.Backup, "revision", res.Revision,
			"keys", res.Keys, "hashKV", res.HashKV, "revisions", res.Revisions, "seconds", res.Duration.Seconds(), "message", res.Message)
		return v.end(res, res.Succeeded, res.NoVerdict, res.Message)
	})
	fl := cmd.Flags()
	fl.StringVar(&f.Target, agentjob.FlagTarget, "", "the etcd target the chain is of, recorded with the new backup")
	fl.StringVar(&f.Name, agentjob.FlagName, "", "name of the new full backup")
	fl.StringVar(&f.Location, agentjob.FlagLocation, "", "storage location of the chain and of the new backup (default: the server's default)")
	fl.StringVar(&f.InputsFile, agentjob.FlagInputsFile, "", `JSON {"full":{"name","sha256"},"segments":[{"name","sha256"},…],"toRevision":N}: the chain to fold, each part pinned to its SHA-256 (the Job's annotation, mounted by the downward API)`)
	addEncodingFlags(fl, &f.Compression, &f.EncryptTo, "the new backup")
	fl.StringVar(&f.ScratchDir, agentjob.FlagScratchDir, "", "scratch space for the downloads, the replay and the check (about three times the database)")
	fl.StringVar(&f.IdentityDir, agentjob.FlagIdentityDir, "", "directory of age identity files (a mounted Secret) to decrypt an encrypted chain")
	v.addFlags(fl, &o.StartTimeout, "each loopback etcd")
	return cmd
}

// readInputs reads and checks the chain to fold, as the server wrote
// it (agentjob.FoldInputs).
func readInputs(path string) (fold.Inputs, error) {
	f, err := os.Open(path)
	if err != nil {
		return fold.Inputs{}, fmt.Errorf("--inputs-file: %w", err)
	}
	defer f.Close()
	chain, err := agentjob.DecodeFoldInputs(&limitedReader{f: f, left: maxInputsBytes})
	if err != nil {
		return fold.Inputs{}, fmt.Errorf("--inputs-file %s: not the chain to fold: %w", path, err)
	}
	return chain, nil
}

// limitedReader fails past left bytes, instead of cutting the JSON
// short.
type limitedReader struct {
	f    *os.File
	left int64
}

func (r *limitedReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, fmt.Errorf("longer than %d bytes", maxInputsBytes)
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.f.Read(p)
	r.left -= int64(n)
	return n, err
}
