package server

import (
	"os"
	"testing"

	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// TestMain lets this test binary serve as the routine pool's worker, so the
// tests run routines behind the real boundary (startEnv gives every server
// a pool of worker processes).
func TestMain(m *testing.M) {
	if routine.IsWorker() {
		os.Exit(routine.ServeWorker())
	}
	os.Exit(m.Run())
}
