package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/kitagent"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

func (c commands) kit() *cobra.Command {
	var f agentjob.KitFlags
	cmd := &cobra.Command{
		Use:   "kit --server HOST:PORT --name NAME --path DIR... --encrypt-to AGE1...",
		Short: "Read a control-plane node's directories into a backup's recovery kit, sealed to age recipients, and store it beside the backup",
		Args:  cobra.NoArgs,
	}
	srv := addServerFlags(cmd, &f.Conn, "data server gRPC address")
	cmd.RunE = c.runE(func() agentjob.Flags { return f }, func(cmd *cobra.Command) error {
		log := newLogger()
		if err := required(agentjob.FlagName, f.Name, agentjob.FlagHostRoot, f.HostRoot); err != nil {
			return err
		}
		if len(f.Paths) == 0 || len(f.EncryptTo) == 0 {
			return fmt.Errorf("--%s and --%s are required: a recovery kit holds the cluster's CA key and is never stored unencrypted", agentjob.FlagPath, agentjob.FlagEncryptTo)
		}
		conn, c, err := dial(srv)
		if err != nil {
			return err
		}
		defer conn.Close()
		log.Info("recovery kit starting", "backup", f.Name, "location", f.Location, "node", f.Node, "paths", f.Paths, "encryptedTo", len(f.EncryptTo))
		k, err := kitagent.Run(cmd.Context(), c, kitagent.Options{
			Name: f.Name, Location: f.Location, Target: f.Target, Paths: f.Paths, HostRoot: f.HostRoot,
			Recipients: f.EncryptTo, Node: f.Node, KubeVersion: f.KubeVersion,
		})
		if err != nil {
			log.Error("recovery kit not stored", "backup", f.Name, "error", err.Error())
			return err
		}
		log.Info("recovery kit stored", "backup", f.Name, "kit", k.GetName(), "entries", len(k.GetKit().GetFiles()), "size", k.GetSize())
		return nil
	})
	fl := cmd.Flags()
	fl.StringVar(&f.Name, agentjob.FlagName, "", "the backup the kit goes with")
	fl.StringVar(&f.Location, agentjob.FlagLocation, "", "storage location (default: the server's default)")
	fl.StringVar(&f.Target, agentjob.FlagTarget, "", "name of the etcd target, recorded with the kit")
	fl.StringArrayVar(&f.Paths, agentjob.FlagPath, nil, "host directory to collect, whole (repeatable)")
	fl.StringVar(&f.HostRoot, agentjob.FlagHostRoot, "/", "where the host's paths are seen in this container")
	fl.StringArrayVar(&f.EncryptTo, agentjob.FlagEncryptTo, nil, "age public key the kit is sealed to (repeatable)")
	fl.StringVar(&f.Node, agentjob.FlagNode, "", "the node the kit is read on, recorded with it")
	fl.StringVar(&f.KubeVersion, agentjob.FlagKubeVersion, "", "the API server's version, recorded with the kit")
	return cmd
}
