// Package routinetest gives tests outside package routine the budgets of
// a routine run: routine.Compile fills in none, and the dispatcher's config
// owns their values.
package routinetest

import (
	"flag"

	"github.com/parleyhq/parley/services/dispatcher/config"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// Limits returns l with every budget it leaves zero set to the default of
// the dispatcher's matching flag (--routine-max-steps and so on).
func Limits(l routine.Limits) routine.Limits {
	var c config.Config
	c.RegisterFlags(flag.NewFlagSet("routinetest", flag.ContinueOnError))
	if l.MaxSteps == 0 {
		l.MaxSteps = c.RoutineMaxSteps
	}
	if l.Timeout == 0 {
		l.Timeout = c.RoutineTimeout
	}
	if l.MaxOutputBytes == 0 {
		l.MaxOutputBytes = c.RoutineMaxOutputBytes
	}
	if l.MaxToolCalls == 0 {
		l.MaxToolCalls = c.RoutineMaxToolCalls
	}
	if l.MaxAllocBytes == 0 {
		l.MaxAllocBytes = c.RoutineMaxAllocBytes
	}
	return l
}
