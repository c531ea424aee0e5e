package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/drill"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// errDrillFailed carries exitDrillFailed to main.
var errDrillFailed = errors.New("the drill failed: the backup did not restore as recorded (see the message)")

func (c commands) drill() *cobra.Command {
	var f agentjob.DrillFlags
	v := verdictEnd{what: "drill", failed: errDrillFailed}
	o := drill.Options{}
	cmd := &cobra.Command{
		Use:   "drill --server HOST:PORT --name NAME --sha256 HEX --scratch-dir DIR",
		Short: "Restore a backup into scratch space, start etcd on it and compare it with what the backup recorded",
		Args:  cobra.NoArgs,
	}
	srv := addServerFlags(cmd, &f.Conn, "data server gRPC address")
	cmd.RunE = c.runE(func() agentjob.Flags { return f }, func(cmd *cobra.Command) error {
		log := newLogger()
		if err := required(agentjob.FlagName, f.Name, agentjob.FlagSHA256, f.SHA256, agentjob.FlagScratchDir, f.ScratchDir); err != nil {
			return err
		}
		o.Name, o.Location, o.SHA256, o.ScratchDir = f.Name, f.Location, f.SHA256, f.ScratchDir
		o.Identities, o.IdentityProblem = optionalIdentities(log, f.IdentityDir, "drill")
		conn, c, err := dial(srv)
		if err != nil {
			return err
		}
		defer conn.Close()
		log.Info("drill starting", "backup", o.Name, "location", o.Location)
		res, err := drill.Run(cmd.Context(), c, o)
		if err != nil {
			log.Error("drill reached no verdict", "backup", o.Name, "error", err.Error())
			return err
		}
		log.Info("drill finished", "backup", o.Name, "succeeded", res.Succeeded, "revision", res.Revision, "keys", res.Keys,
			"hashKV", res.HashKV, "seconds", res.Duration.Seconds(), "message", res.Message)
		return v.end(res, res.Succeeded, res.NoVerdict, res.Message)
	})
	fl := cmd.Flags()
	fl.StringVar(&f.Name, agentjob.FlagName, "", "backup to drill")
	fl.StringVar(&f.Location, agentjob.FlagLocation, "", "storage location (default: the server's default)")
	fl.StringVar(&f.SHA256, agentjob.FlagSHA256, "", "SHA-256 (hex) the stored backup must have: the drill checks this content and no other")
	fl.StringVar(&f.ScratchDir, agentjob.FlagScratchDir, "", "scratch space for the download and the restored member (about twice the database)")
	fl.StringVar(&f.IdentityDir, agentjob.FlagIdentityDir, "", "directory of age identity files (a mounted Secret) to decrypt an encrypted backup")
	v.addFlags(fl, &o.StartTimeout, "the restored member")
	return cmd
}
