package negotiation_test

import (
	"os"
	"testing"

	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// TestMain lets this test binary serve as the routine pool's worker, so
// TestInstall_checkTakesTheAgentsShare runs checks behind the real
// boundary.
func TestMain(m *testing.M) {
	if routine.IsWorker() {
		os.Exit(routine.ServeWorker())
	}
	os.Exit(m.Run())
}
