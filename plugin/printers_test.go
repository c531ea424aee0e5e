package plugin

import (
	"testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Every phase and verdict prints as the tables and documents have always
// said it; a value this build does not know is Unknown.
func TestEnumWords(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{phaseString(ebv1.BackupPhase_BACKUP_PHASE_RUNNING), "Running"},
		{phaseString(ebv1.BackupPhase_BACKUP_PHASE_COMPLETED), "Completed"},
		{phaseString(ebv1.BackupPhase_BACKUP_PHASE_FAILED), "Failed"},
		{phaseString(ebv1.BackupPhase_BACKUP_PHASE_UNSPECIFIED), "Unknown"},
		{phaseString(ebv1.BackupPhase(42)), "Unknown"},
		{restorePhaseString(ebv1.RestorePhase_RESTORE_PHASE_PENDING), "Pending"},
		{restorePhaseString(ebv1.RestorePhase_RESTORE_PHASE_SUCCEEDED), "Succeeded"},
		{verificationResultString(ebv1.VerificationResult_VERIFICATION_RESULT_ERROR), "Error"},
		{verificationResultString(ebv1.VerificationResult_VERIFICATION_RESULT_UNSPECIFIED), "Unknown"},
	} {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
}
