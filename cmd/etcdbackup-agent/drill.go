package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/drill"
)

// exitDrillFailed is the exit code of a drill that reached a verdict and
// the verdict is that the backup does not restore as recorded: the Job
// fails (kubectl get jobs shows it), while the verdict itself is in the
// termination message for the server.
const exitDrillFailed = 3

// errDrillFailed carries exitDrillFailed to main.
var errDrillFailed = errors.New("the drill failed: the backup did not restore as recorded (see the message)")

func newDrillCmd() *cobra.Command {
	var srv serverFlags
	var identityDir, resultFile string
	var o drill.Options
	cmd := &cobra.Command{
		Use:   "drill --server HOST:PORT --name NAME --sha256 HEX --scratch-dir DIR",
		Short: "Restore a backup into scratch space, start etcd on it and compare it with what the backup recorded",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger()
			if o.Name == "" || o.SHA256 == "" || o.ScratchDir == "" {
				return errors.New("--name, --sha256 and --scratch-dir are required")
			}
			o.Identities, o.IdentityProblem = optionalIdentities(log, identityDir, "drill")
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
			if err := writeResult(resultFile, res); err != nil {
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
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&srv.addr, "server", "", "data server gRPC address")
	fl.StringVar(&o.Name, "name", "", "backup to drill")
	fl.StringVar(&o.Location, "location", "", "storage location (default: the server's default)")
	fl.StringVar(&o.SHA256, "sha256", "", "SHA-256 (hex) the stored backup must have: the drill checks this content and no other")
	fl.StringVar(&o.ScratchDir, "scratch-dir", "", "scratch space for the download and the restored member (about twice the database)")
	fl.DurationVar(&o.StartTimeout, "start-timeout", 2*time.Minute, "how long the restored member may take to serve")
	fl.StringVar(&identityDir, "identity-dir", "", "directory of age identity files (a mounted Secret) to decrypt an encrypted backup")
	fl.StringVar(&resultFile, "result-file", "/dev/termination-log", "where the verdict is written as JSON (the pod's termination message, which the server reads)")
	addServerFlags(cmd, &srv)
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

// writeResult writes the verdict where the server reads it; a pod's
// termination message holds 4096 bytes, so the message is cut to fit.
func writeResult(path string, res drill.Result) error {
	const maxMessage = 3000
	if len(res.Message) > maxMessage {
		res.Message = res.Message[:maxMessage] + "…"
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("--result-file: %w", err)
	}
	return nil
}
