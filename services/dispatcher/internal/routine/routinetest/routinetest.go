// Package routinetest gives tests outside package routine the budgets of
// a routine run: routine.Compile fills in none, and the dispatcher's config
// owns their values.
package routinetest

import (
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// Limits returns l with every budget it leaves zero set to the default of
// the dispatcher's matching flag (--routine-max-steps and so on; the app's
// options test checks that they agree). It does not read the config
// itself: the config brings in the transport, which the core's tests
// must not import (e2e/arch_test.go).
func Limits(l routine.Limits) routine.Limits {
	if l.MaxSteps == 0 {
		l.MaxSteps = 1_000_000
	}
	if l.Timeout == 0 {
		l.Timeout = time.Second
	}
	if l.MaxOutputBytes == 0 {
		l.MaxOutputBytes = 64 << 10
	}
	if l.MaxToolCalls == 0 {
		l.MaxToolCalls = 100
	}
	if l.MaxAllocBytes == 0 {
		l.MaxAllocBytes = 64 << 20
	}
	return l
}
