package main

import (
	"os"
	"testing"

	dispatcherapp "github.com/parleyhq/parley/services/dispatcher/app"
)

// TestMain lets this test binary serve as the dispatcher's routine worker,
// as main does for the parley binary: the in-process suites run routines
// behind the real boundary.
func TestMain(m *testing.M) {
	if dispatcherapp.IsRoutineWorker() {
		os.Exit(dispatcherapp.ServeRoutineWorker())
	}
	os.Exit(m.Run())
}
