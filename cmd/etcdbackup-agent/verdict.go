package main

import (
	"errors"
	"time"

	"github.com/spf13/pflag"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// exitDrillFailed is the exit code of a drill or fold that reached a
// verdict and the verdict is negative: the Job fails (kubectl get jobs
// shows it), while the verdict itself is in the termination message for
// the server.
const exitDrillFailed = 3

// verdictEnd is how the agents that end in a verdict (drill, fold)
// report it: as JSON where the server reads it, and as the exit.
type verdictEnd struct {
	// what runs: "drill", "fold".
	what string
	// failed is returned for a negative verdict; main exits
	// exitDrillFailed for it.
	failed     error
	resultFile string
}

// addFlags binds --result-file, and --start-timeout to startTimeout:
// how long the etcd the agent starts may take to serve (what it starts).
func (v *verdictEnd) addFlags(fl *pflag.FlagSet, startTimeout *time.Duration, starts string) {
	fl.DurationVar(startTimeout, "start-timeout", 2*time.Minute, "how long "+starts+" may take to serve")
	fl.StringVar(&v.resultFile, "result-file", "/dev/termination-log", "where the verdict is written as JSON (the pod's termination message, which the server reads)")
}

// end writes r and returns the exit the verdict calls for: none when
// it succeeded, an error saying why when there is no verdict, failed
// when it is negative.
func (v *verdictEnd) end(r agentjob.Report, succeeded, noVerdict bool, message string) error {
	if err := writeReport(v.resultFile, r); err != nil {
		return err
	}
	switch {
	case noVerdict:
		return errors.New("the " + v.what + " reached no verdict: " + message)
	case !succeeded:
		return v.failed
	}
	return nil
}
