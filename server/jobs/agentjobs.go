package jobs

import (
	"encoding/json"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// liveJobs returns the Jobs of sel in the server's namespace that are
// not being deleted, from the cache; what names them in errors.
func (l *Launcher) liveJobs(sel labels.Selector, what string) ([]*batchv1.Job, error) {
	nc, err := l.watched(l.namespace)
	if err != nil {
		return nil, err
	}
	list, err := nc.jobList(sel)
	if err != nil {
		return nil, fmt.Errorf("list %s jobs: %w", what, err)
	}
	live := list[:0:0]
	for _, j := range list {
		if j.DeletionTimestamp == nil {
			live = append(live, j)
		}
	}
	return live, nil
}

// terminationJSON decodes into v the JSON termination message a
// container of one of j's pods wrote (a drill's or a fold's verdict, a
// delta agent's chain end), and says whether one did.
func (l *Launcher) terminationJSON(j *batchv1.Job, v any) bool {
	for _, p := range l.pods(j) {
		for _, cs := range p.Status.ContainerStatuses {
			t := cs.State.Terminated
			if t == nil || !strings.HasPrefix(strings.TrimSpace(t.Message), "{") {
				continue
			}
			if err := json.Unmarshal([]byte(t.Message), v); err == nil {
				return true
			}
		}
	}
	return false
}
