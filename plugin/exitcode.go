package plugin

import (
	"errors"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tunnel"
)

// Exit codes of kubectl-etcdbackup, so that scripts can tell a typo from a
// missing backup from a failed one without reading messages. They are
// listed in the root command's help (exitCodesHelp) and docs/scripting.md.
const (
	ExitOK = 0
	// ExitError is any other failure: the server unreachable, an
	// interrupted transfer, a file that cannot be written.
	ExitError = 1
	// ExitUsage is a bad flag, argument or flag combination: nothing was
	// asked of the server.
	ExitUsage = 2
	// ExitNotFound is a backup, location or target that does not exist.
	ExitNotFound = 3
	// ExitRefused is the server or the API server refusing the caller
	// (PermissionDenied, Unauthenticated, RBAC on pods/portforward).
	ExitRefused = 4
	// ExitFailed is a backup or restore that ran and failed, a backup
	// that verify finds corrupt, or a location check with a failed step.
	ExitFailed = 5
	// ExitIncomplete is a command over every location that did what it
	// could while a location was unavailable: list printed, and delete
	// -l/--all deleted, only the other locations' backups; a warning
	// names each one left out. Not 0, so that no script takes a partial
	// list for the whole (the newest backup may be in the location
	// left out); not 1, so that a script that can do with the locations
	// that answer accepts it and still stops on anything else.
	ExitIncomplete = 6
)

const exitCodesHelp = `Exit codes:
  0  success
  1  any other error (server unreachable, interrupted transfer, local file error)
  2  usage error: unknown flag or command, wrong arguments, flags that do not go together
  3  not found: no such backup, storage location or etcd target
  4  refused: not allowed (RBAC on pods/portforward, PermissionDenied, Unauthenticated)
  5  a backup or restore failed, verify found a backup corrupt, or a location
     check failed a step
  6  incomplete: a storage location was unavailable; list printed (delete -l/--all
     deleted) only the other locations' backups, and a warning names it`

// exitError carries the exit code an error should end the process with.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

func usageError(err error) error { return withCode(ExitUsage, err) }

// ExitCode is the exit status for an error returned by the command tree.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	var forbidden *tunnel.ForbiddenError
	if errors.As(err, &forbidden) {
		return ExitRefused
	}
	var notInstalled *tunnel.NotInstalledError
	if errors.As(err, &notInstalled) {
		return ExitNotFound
	}
	if s, ok := status.FromError(err); ok {
		return codeExit(s.Code())
	}
	// cobra's own errors for an unknown command are plain strings (its flag
	// errors go through FlagErrorFunc, its argument checks through wrapArgs).
	if strings.HasPrefix(err.Error(), "unknown command ") {
		return ExitUsage
	}
	return ExitError
}

// codeExit maps the server's status codes to exit codes.
func codeExit(c codes.Code) int {
	switch c {
	case codes.OK:
		return ExitOK
	case codes.InvalidArgument:
		return ExitUsage
	case codes.NotFound:
		return ExitNotFound
	case codes.PermissionDenied, codes.Unauthenticated:
		return ExitRefused
	case codes.DataLoss:
		return ExitFailed
	}
	return ExitError
}

// setUsageErrors marks cobra's flag and argument errors of cmd and every
// command below it as usage errors.
func setUsageErrors(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(c *cobra.Command, a []string) error { return usageError(args(c, a)) }
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd)
}
