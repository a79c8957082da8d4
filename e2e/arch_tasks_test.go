package e2e

import (
	"strings"
	"testing"
)

// TestArch_tasksSchedulerHasNoGRPC: the tasks scheduler (issue 9: the step
// scheduler in its own package over a Runner) and every package of ours it
// depends on, tests included, import no google.golang.org/grpc package;
// internal/server translates the dispatcher's codes at the edge.
func TestArch_tasksSchedulerHasNoGRPC(t *testing.T) {
	const sched = modulePrefix + "services/tasks/internal/scheduler"
	graph := goListDeps(t, sched)
	if _, ok := graph[sched]; !ok {
		t.Fatalf("package %s is missing", sched)
	}
	for pkg, imports := range graph {
		if !strings.HasPrefix(pkg, modulePrefix+"services/") && !strings.HasPrefix(pkg, modulePrefix+"platform/") {
			continue
		}
		if strings.HasPrefix(pkg, modulePrefix+"services/tasks/internal/server") {
			t.Errorf("%s: the scheduler depends on the adapter", pkg)
		}
		for _, imp := range imports {
			if imp == "google.golang.org/grpc" || strings.HasPrefix(imp, "google.golang.org/grpc/") {
				t.Errorf("%s imports %s: the tasks scheduler must not know gRPC", pkg, imp)
			}
		}
	}
}
