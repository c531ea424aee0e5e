package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/drill"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// exitDrillFailed is the exit code of a drill that reached a verdict and
// the verdict is that the backup does not restore as recorded: the Job
// fails (kubectl get jobs shows it), while the verdict itself is in the
// termination message for the server.
const exitDrillFailed = 3

// errDrillFailed carries exitDrillFailed to main.
var errDrillFailed = errors.New("the drill failed: the backup did not restore as recorded (see the message)")

func (c commands) drill() *cobra.Command {
	var f agentjob.DrillFlags
	var resultFile string
	o := drill.Options{}
	cmd := &cobra.Command{
		Use:   "drill --server HOST:PORT --name NAME --sha256 HEX --scratch-dir DIR",
		Short: "Restore a backup into scratch space, start etcd on it and compare it with what the backup recorded",
		Args:  cobra.NoArgs,
	}
	srv := addServerFlags(cmd, &f.Conn, "data server gRPC address")
	cmd.RunE = c.runE(func() agentjob.Flags { return f }, func(cmd *cobra.Command) error {
		log := newLogger()
		if f.Name == "" || f.SHA256 == "" || f.ScratchDir == "" {
			return errors.New("--name, --sha256 and --scratch-dir are required")
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
		if err := writeReport(resultFile, res); err != nil {
			return err
		}
		log.Info("drill finished", "backup", o.Name, "succeeded", res.Succeeded, "revision", res.Revision, "keys", res.Keys,
			"hashKV", res.HashKV, "seconds", res.Duration.Seconds(), "message", res.Message)
		switch {
		case res.NoVerdict:
			return errors.New("the drill reached no verdict: " + res.Message)
		case !res.Succeeded:
			return errDrillFailed
		}
		return nil
	})
	fl := cmd.Flags()
	fl.StringVar(&f.Name, agentjob.FlagName, "", "backup to drill")
	fl.StringVar(&f.Location, agentjob.FlagLocation, "", "storage location (default: the server's default)")
	fl.StringVar(&f.SHA256, agentjob.FlagSHA256, "", "SHA-256 (hex) the stored backup must have: the drill checks this content and no other")
	fl.StringVar(&f.ScratchDir, agentjob.FlagScratchDir, "", "scratch space for the download and the restored member (about twice the database)")
	fl.DurationVar(&o.StartTimeout, "start-timeout", 2*time.Minute, "how long the restored member may take to serve")
	fl.StringVar(&f.IdentityDir, agentjob.FlagIdentityDir, "", "directory of age identity files (a mounted Secret) to decrypt an encrypted backup")
	fl.StringVar(&resultFile, "result-file", "/dev/termination-log", "where the verdict is written as JSON (the pod's termination message, which the server reads)")
	return cmd
}
