package main

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// checkUserListen refuses a --listen off the loopback in PortForward
// mode. That mode checks no caller: it relies on the user API being
// reachable only through the kubelet's port-forward, which connects
// inside the pod. On the pod IP (or every address) anything that reaches
// the pod network could read every backup, hence every Secret of the
// cluster, and upload and restore.
func checkUserListen(listen, mode string) error {
	if mode == config.AuthorizationSubjectAccessReview {
		return nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if host == "localhost" {
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil && a.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--listen %q is not a loopback address: in authorization mode PortForward the server checks no caller, "+
		"so the user API must be reachable only through port-forward, which connects on the pod's loopback; "+
		"use --listen=127.0.0.1:50051, or set authorization.mode: SubjectAccessReview in the config file", listen)
}
