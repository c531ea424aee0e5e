package main

import (
	"reflect"
	"testing"
)

func TestCompletionArgs(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want []string
	}{
		{[]string{"/usr/local/bin/kubectl_complete-etcdbackup", "get", ""}, []string{"__complete", "get", ""}},
		{[]string{"bin/kubectl_complete-etcdbackup.exe", "li"}, []string{"__complete", "li"}},
		{[]string{"kubectl_complete-etcdbackup"}, []string{"__complete"}},
		{[]string{"/usr/local/bin/kubectl-etcdbackup", "get", ""}, nil},
	} {
		got, ok := completionArgs(tc.argv)
		if ok != (tc.want != nil) || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("completionArgs(%q) = %q, %v; want %q", tc.argv, got, ok, tc.want)
		}
	}
}
