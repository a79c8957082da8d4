package app

import (
	"os"
	"testing"
)

// TestMain lets this test binary serve as the routine pool's worker.
func TestMain(m *testing.M) {
	if IsRoutineWorker() {
		os.Exit(ServeRoutineWorker())
	}
	os.Exit(m.Run())
}
